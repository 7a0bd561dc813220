/* Row-consistent fp32 products y = x @ W_t (+ b) for the CPU engine's small-row passes
 * (engine/native/__init__.py builds and loads it; engine/models/common.Linear calls it).
 *
 * Why: lossless speculative decoding needs a row's bits not to depend on how many rows run with
 * it (a 1-token decode step and a k-token verify pass must agree at near-ties). BLAS gets that
 * only for 2+ rows, so the engine ran one row as two through oneDNN's packed GEMM, which on an
 * AVX2 EPYC costs about twice a plain GEMV. Here every output y[r, j] is one fused multiply-add
 * chain over i = 0..K-1 in order, started from zero, with the bias added last: the same chain for
 * any number of rows, any row, any thread. Measured there (2 threads, 576 x 1536): 1 row 0.08 ms
 * vs oneDNN's 0.17, 16 rows 0.19 vs 0.28, 256 rows 2.7 vs 2.7.
 *
 * Layout: W packed in column blocks of 16, Wp[b][i][0..15] = W[16 b + jj][i] (zero-padded past N),
 * so a block is one contiguous stream of K x 64 bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <stdatomic.h>

#include "pool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECCHAT_FMA_VEC 1
#endif

#define JB 16
#define RB 48 /* rows per call of block_rows (split there into even groups of at most 6) */

#define KC 128 /* input chunk: its 128 x 64 bytes of a column block stay in L1 across the row blocks */

/* acc[r] += x[r, i] * w[i] for i in [i0, i1) in order, for the rows [0, nr) (nr <= RB) of one
 * column block; acc lives in memory between input chunks, so the chain over i is the same
 * whatever the chunking. Six, four, two rows at a time, then single rows (accumulators in named
 * registers: an indexed array made gcc spill them every iteration, 2x slower): a row's chain is
 * its own whichever kernel runs it. */
#ifdef SPECCHAT_FMA_VEC
/* one row's two accumulators (16 columns): load, one input's FMAs, store */
#define LOAD_ROW(r) __m256 a##r##0 = _mm256_loadu_ps(acc + (r) * JB), a##r##1 = _mm256_loadu_ps(acc + (r) * JB + 8); \
    const float *x##r = x + (r) * ldx;
#define FMA_ROW(r) { const __m256 v = _mm256_broadcast_ss(x##r + i); \
    a##r##0 = _mm256_fmadd_ps(v, w0, a##r##0); a##r##1 = _mm256_fmadd_ps(v, w1, a##r##1); }
#define STORE_ROW(r) _mm256_storeu_ps(acc + (r) * JB, a##r##0), _mm256_storeu_ps(acc + (r) * JB + 8, a##r##1);
#define W_AT(i) const __m256 w0 = _mm256_loadu_ps(w + (i) * JB), w1 = _mm256_loadu_ps(w + (i) * JB + 8);

static void rows6(const float *x, int64_t ldx, int64_t i0, int64_t i1, const float *w, float *acc) {
    LOAD_ROW(0) LOAD_ROW(1) LOAD_ROW(2) LOAD_ROW(3) LOAD_ROW(4) LOAD_ROW(5)
    for (int64_t i = i0; i < i1; i++) {
        W_AT(i)
        FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4) FMA_ROW(5)
    }
    STORE_ROW(0) STORE_ROW(1) STORE_ROW(2) STORE_ROW(3) STORE_ROW(4) STORE_ROW(5)
}

static void rows4(const float *x, int64_t ldx, int64_t i0, int64_t i1, const float *w, float *acc) {
    LOAD_ROW(0) LOAD_ROW(1) LOAD_ROW(2) LOAD_ROW(3)
    for (int64_t i = i0; i < i1; i++) {
        W_AT(i)
        FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3)
    }
    STORE_ROW(0) STORE_ROW(1) STORE_ROW(2) STORE_ROW(3)
}

static void rows5(const float *x, int64_t ldx, int64_t i0, int64_t i1, const float *w, float *acc) {
    LOAD_ROW(0) LOAD_ROW(1) LOAD_ROW(2) LOAD_ROW(3) LOAD_ROW(4)
    for (int64_t i = i0; i < i1; i++) {
        W_AT(i)
        FMA_ROW(0) FMA_ROW(1) FMA_ROW(2) FMA_ROW(3) FMA_ROW(4)
    }
    STORE_ROW(0) STORE_ROW(1) STORE_ROW(2) STORE_ROW(3) STORE_ROW(4)
}

static void rows3(const float *x, int64_t ldx, int64_t i0, int64_t i1, const float *w, float *acc) {
    LOAD_ROW(0) LOAD_ROW(1) LOAD_ROW(2)
    for (int64_t i = i0; i < i1; i++) {
        W_AT(i)
        FMA_ROW(0) FMA_ROW(1) FMA_ROW(2)
    }
    STORE_ROW(0) STORE_ROW(1) STORE_ROW(2)
}

static void rows2(const float *x, int64_t ldx, int64_t i0, int64_t i1, const float *w, float *acc) {
    LOAD_ROW(0) LOAD_ROW(1)
    for (int64_t i = i0; i < i1; i++) {
        W_AT(i)
        FMA_ROW(0) FMA_ROW(1)
    }
    STORE_ROW(0) STORE_ROW(1)
}

static void row1(const float *x, int64_t i0, int64_t i1, const float *w, float *acc) {
    const int64_t ldx = 0;
    LOAD_ROW(0)
    for (int64_t i = i0; i < i1; i++) {
        W_AT(i)
        FMA_ROW(0)
    }
    STORE_ROW(0)
    (void)ldx;
}
#else
static void row1(const float *x, int64_t i0, int64_t i1, const float *w, float *acc) {
    for (int64_t i = i0; i < i1; i++)
        for (int j = 0; j < JB; j++) acc[j] = fmaf(x[i], w[i * JB + j], acc[j]);
}
#endif

/* rows [0, nr) in groups of at most 6 split evenly (16 -> 6 + 5 + 5: a 4-, 2- or 1-row remainder
 * runs the FMA units at a fraction of their rate) */
static void block_rows(const float *x, int64_t ldx, int64_t i0, int64_t i1, const float *w, int64_t nr, float *acc) {
#ifdef SPECCHAT_FMA_VEC
    const int64_t groups = (nr + 5) / 6;
    int64_t r = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t take = (nr - r + (groups - g) - 1) / (groups - g);
        const float *xr = x + r * ldx;
        float *ar = acc + r * JB;
        switch (take) {
        case 6: rows6(xr, ldx, i0, i1, w, ar); break;
        case 5: rows5(xr, ldx, i0, i1, w, ar); break;
        case 4: rows4(xr, ldx, i0, i1, w, ar); break;
        case 3: rows3(xr, ldx, i0, i1, w, ar); break;
        case 2: rows2(xr, ldx, i0, i1, w, ar); break;
        default: row1(xr, i0, i1, w, ar); break;
        }
        r += take;
    }
#else
    for (int64_t r = 0; r < nr; r++) row1(x + r * ldx, i0, i1, w, acc + r * JB);
#endif
}

/* GGUF block-quantised weights, kept quantised (engine/models/quant.py packs them). Each column
 * block of 16 outputs is a stream of K/32 records, one per 32 inputs:
 *   Q4_1 (384 bytes): float d[16], float m[16], uint8 q[32][8]  -- w[i][j] = d[j] * q + m[j], with
 *                     q = q[i][j] & 15 for j < 8 and q[i][j - 8] >> 4 for j >= 8 (GGUF's formula);
 *   Q8_0 (576 bytes): float d[16], int8 q[32][16]               -- w[i][j] = d[j] * q[i][j].
 * A chunk of input rows is dequantised into an L1 scratch in linear.c's fp32 layout and the same
 * row kernels run over it, so every output is the same FMA chain over the same fp32 weights as
 * linear_rows_f32 over the dequantised matrix: bit-identical results from a fifth of the bytes.
 * d * q is exact in fp32 (an fp16 scale times a 4- or 8-bit integer), so fmaf(d, q, m) rounds once,
 * like GGUF's (d * q) + m. */
#define QK 32
enum { QT_F32 = 0, QT_Q4_1 = 1, QT_Q8_0 = 2, QT_Q4_1A8 = 3, QT_Q8_0A8 = 4, QT_BF16 = 5 };
/* the q8 compute type's records and products (quant_a8.c) */
int64_t a8_record_bytes(int qtype);
int linear_rows_a8(const float *x, int64_t ldx, int64_t R, int64_t K, const uint8_t *Wq, int qtype, int64_t N, const float *bias,
                   float *y, int nthreads);
void a8_dequant(int qtype, const uint8_t *rec, float *out);
int linear_rows_bf16(const float *x, int64_t ldx, int64_t R, int64_t K, const uint16_t *W, int64_t N, const float *bias,
                     float *y, int nthreads);
int bf16_rows_f32(const uint16_t *W, int64_t N, int64_t K, const int64_t *ids, int64_t n, float *out);

static int64_t qrecord_bytes(int qtype) { return qtype == QT_Q4_1 ? 384 : qtype == QT_Q8_0 ? 576 : 0; }

static void dequant_q4_1(const uint8_t *rec, float *out) {
    const float *d = (const float *)rec, *m = d + JB;
    const uint8_t *q = rec + 2 * JB * sizeof(float);
#ifdef SPECCHAT_FMA_VEC
    const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8), m0 = _mm256_loadu_ps(m), m1 = _mm256_loadu_ps(m + 8);
    const __m256i low = _mm256_set1_epi32(15);
    for (int i = 0; i < QK; i++) {
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * i)));
        _mm256_storeu_ps(out + i * JB, _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_and_si256(b, low)), m0));
        _mm256_storeu_ps(out + i * JB + 8, _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), m1));
    }
#else
    for (int i = 0; i < QK; i++)
        for (int j = 0; j < JB; j++) {
            const int v = j < 8 ? (q[8 * i + j] & 15) : (q[8 * i + j - 8] >> 4);
            out[i * JB + j] = fmaf(d[j], (float)v, m[j]);
        }
#endif
}

static void dequant_q8_0(const uint8_t *rec, float *out) {
    const float *d = (const float *)rec;
    const int8_t *q = (const int8_t *)(rec + JB * sizeof(float));
#ifdef SPECCHAT_FMA_VEC
    const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8);
    for (int i = 0; i < QK; i++) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(q + JB * i));
        _mm256_storeu_ps(out + i * JB, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b))));
        _mm256_storeu_ps(out + i * JB + 8, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)))));
    }
#else
    for (int i = 0; i < QK; i++)
        for (int j = 0; j < JB; j++) out[i * JB + j] = d[j] * (float)q[JB * i + j];
#endif
}

#ifdef SPECCHAT_FMA_VEC
/* Rows straight from the records, the weights dequantised in registers (no scratch): the same
 * w0/w1 values and the same FMA order as dequant + block_rows. Up to SPECCHAT_QFUSED_MAX rows
 * (default 14) in groups of at most 6, each group dequantising again: at 5-14 rows this beat the
 * scratch path, whose 4-, 2- and 1-row remainders ran the FMA units at a fraction of their rate
 * (SmolLM2's projections + head at 6 rows 16.6 -> 11.8 ms, 8 rows 21.0 -> 16.1, 5 rows
 * 23.4 -> 10.5; bench/quant_kernels.py, AVX-512 EPYC, 2 threads); from ~16 rows one dequantisation
 * shared by every row wins. */
#define Q4_W(i) const __m256i qb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * (i)))); \
    const __m256 w0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(_mm256_and_si256(qb, low)), m0), \
                 w1 = _mm256_fmadd_ps(d1, _mm256_cvtepi32_ps(_mm256_srli_epi32(qb, 4)), m1);
#define Q8_W(i) const __m128i qb = _mm_loadu_si128((const __m128i *)(q + JB * (i))); \
    const __m256 w0 = _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qb))), \
                 w1 = _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(qb, 8))));
#define Q4_HEAD const float *d = (const float *)rec, *m = d + JB; const uint8_t *q = rec + 2 * JB * sizeof(float); \
    const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8), m0 = _mm256_loadu_ps(m), m1 = _mm256_loadu_ps(m + 8); \
    const __m256i low = _mm256_set1_epi32(15);
#define Q8_HEAD const float *d = (const float *)rec; const int8_t *q = (const int8_t *)(rec + JB * sizeof(float)); \
    const __m256 d0 = _mm256_loadu_ps(d), d1 = _mm256_loadu_ps(d + 8);
/* x points at this chunk's first input; n inputs (a multiple of 32), records of rb bytes */
#define QROWS(name, HEAD, WAT, LOADS, FMAS, STORES) \
static void name(const float *x, int64_t ldx, int64_t n, const uint8_t *rec, int64_t rb, float *acc) { \
    LOADS \
    for (int64_t i0 = 0; i0 < n; i0 += QK, rec += rb) { \
        HEAD \
        for (int i = 0; i < QK; i++) { WAT(i) { const int64_t ii = i0 + i; FMAS } } \
    } \
    STORES \
    (void)ldx; \
}
#define FMA_ROWQ(r) { const __m256 v = _mm256_broadcast_ss(x##r + ii); \
    a##r##0 = _mm256_fmadd_ps(v, w0, a##r##0); a##r##1 = _mm256_fmadd_ps(v, w1, a##r##1); }
#define L1 LOAD_ROW(0)
#define L2 L1 LOAD_ROW(1)
#define L3 L2 LOAD_ROW(2)
#define L4 L3 LOAD_ROW(3)
#define L5 L4 LOAD_ROW(4)
#define L6 L5 LOAD_ROW(5)
#define F1 FMA_ROWQ(0)
#define F2 F1 FMA_ROWQ(1)
#define F3 F2 FMA_ROWQ(2)
#define F4 F3 FMA_ROWQ(3)
#define F5 F4 FMA_ROWQ(4)
#define F6 F5 FMA_ROWQ(5)
#define S1 STORE_ROW(0)
#define S2 S1 STORE_ROW(1)
#define S3 S2 STORE_ROW(2)
#define S4 S3 STORE_ROW(3)
#define S5 S4 STORE_ROW(4)
#define S6 S5 STORE_ROW(5)
/* 5-6 rows: 12 accumulators leave no registers for the scales, so they are read from the record
 * each input and w = d * q + m runs as a multiply and an add: d * q is exact (see above), so the
 * bits are fmaf's. */
#define Q4_WM(i) const __m256i qb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * (i)))); \
    const __m256 w0 = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(qb, _mm256_set1_epi32(15))), \
                                                  _mm256_loadu_ps(d)), _mm256_loadu_ps(m)), \
                 w1 = _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(qb, 4)), \
                                                  _mm256_loadu_ps(d + 8)), _mm256_loadu_ps(m + 8));
#define Q8_WM(i) const __m128i qb = _mm_loadu_si128((const __m128i *)(q + JB * (i))); \
    const __m256 w0 = _mm256_mul_ps(_mm256_loadu_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qb))), \
                 w1 = _mm256_mul_ps(_mm256_loadu_ps(d + 8), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(qb, 8))));
#define Q4_HEADM const float *d = (const float *)rec, *m = d + JB; const uint8_t *q = rec + 2 * JB * sizeof(float);
#define Q8_HEADM const float *d = (const float *)rec; const int8_t *q = (const int8_t *)(rec + JB * sizeof(float));
QROWS(q4_rows1, Q4_HEAD, Q4_W, L1, F1, S1)
QROWS(q4_rows2, Q4_HEAD, Q4_W, L2, F2, S2)
QROWS(q4_rows3, Q4_HEAD, Q4_W, L3, F3, S3)
QROWS(q4_rows4, Q4_HEAD, Q4_W, L4, F4, S4)
QROWS(q4_rows5, Q4_HEADM, Q4_WM, L5, F5, S5)
QROWS(q4_rows6, Q4_HEADM, Q4_WM, L6, F6, S6)
QROWS(q8_rows1, Q8_HEAD, Q8_W, L1, F1, S1)
QROWS(q8_rows2, Q8_HEAD, Q8_W, L2, F2, S2)
QROWS(q8_rows3, Q8_HEAD, Q8_W, L3, F3, S3)
QROWS(q8_rows4, Q8_HEAD, Q8_W, L4, F4, S4)
QROWS(q8_rows5, Q8_HEADM, Q8_WM, L5, F5, S5)
QROWS(q8_rows6, Q8_HEADM, Q8_WM, L6, F6, S6)

typedef void (*qrows_fn)(const float *, int64_t, int64_t, const uint8_t *, int64_t, float *);
static const qrows_fn Q4_ROWS[7] = {NULL, q4_rows1, q4_rows2, q4_rows3, q4_rows4, q4_rows5, q4_rows6};
static const qrows_fn Q8_ROWS[7] = {NULL, q8_rows1, q8_rows2, q8_rows3, q8_rows4, q8_rows5, q8_rows6};

static int64_t qfused_max(void) {
    static int64_t v = -1;
    if (v < 0) {
        const char *e = getenv("SPECCHAT_QFUSED_MAX");
        v = e ? atoll(e) : 14;
    }
    return v;
}

/* rows [0, nr) of one column block over one chunk, the weights dequantised in registers, in
 * groups of at most 6 rows split evenly (16 -> 6 + 5 + 5); returns 0 if not handled */
static int qrows_fused(int qtype, const float *x, int64_t ldx, int64_t n, const uint8_t *rec, int64_t rb, int64_t nr, float *acc) {
    if (nr > qfused_max() && nr > 4) return 0;
    const qrows_fn *fn = qtype == QT_Q4_1 ? Q4_ROWS : Q8_ROWS;
    const int64_t groups = (nr + 5) / 6;
    int64_t r = 0;
    for (int64_t g = 0; g < groups; g++) {
        const int64_t take = (nr - r + (groups - g) - 1) / (groups - g);
        fn[take](x + r * ldx, ldx, n, rec, rb, acc + r * JB);
        r += take;
    }
    return 1;
}
#else
static int qrows_fused(int qtype, const float *x, int64_t ldx, int64_t n, const uint8_t *rec, int64_t rb, int64_t nr, float *acc) {
    (void)qtype, (void)x, (void)ldx, (void)n, (void)rec, (void)rb, (void)nr, (void)acc;
    return 0;
}
#endif

typedef struct {
    const float *x, *Wp, *bias;
    const uint8_t *Wq;
    float *y;
    int64_t ldx, R, K, N, nb, rb;
    int qtype;
    atomic_int failed;
} lin_job;

/* one thread's part of the column blocks, claimed in chunks (engine/native/pool.c) */
static void lin_part(void *ctx, pool_region *region) {
    lin_job *J = (lin_job *)ctx;
    const float *x = J->x, *Wp = J->Wp, *bias = J->bias;
    const uint8_t *Wq = J->Wq;
    float *y = J->y;
    const int64_t ldx = J->ldx, R = J->R, K = J->K, N = J->N, rb = J->rb;
    const int qtype = J->qtype;
    int64_t b0, b1;
    if (!pool_claim(region, &b0, &b1)) return;
    float *acc = (float *)malloc(sizeof(float) * (size_t)(R * JB + (qtype != QT_F32 ? KC * JB : 0)));
    float *scratch = acc ? acc + R * JB : NULL;
    if (!acc) {
        atomic_store(&J->failed, 1);
        while (pool_claim(region, &b0, &b1)) {} /* nobody computes these: the call fails */
        return;
    }
    do for (int64_t b = b0; b < b1; b++) {
        const int64_t j0 = b * JB;
        const int64_t nj = N - j0 < JB ? N - j0 : JB;
        memset(acc, 0, sizeof(float) * (size_t)R * JB);
        for (int64_t i0 = 0; i0 < K; i0 += KC) {
            const int64_t i1 = K - i0 < KC ? K : i0 + KC;
            if (qtype == QT_F32) {
                const float *w = Wp + b * K * JB;
                for (int64_t r0 = 0; r0 < R; r0 += RB) {
                    const int64_t nr = R - r0 < RB ? R - r0 : RB;
                    block_rows(x + r0 * ldx, ldx, i0, i1, w, nr, acc + r0 * JB);
                }
            } else {
                const uint8_t *rec = Wq + (b * (K / QK) + i0 / QK) * rb;
                if (qrows_fused(qtype, x + i0, ldx, i1 - i0, rec, rb, R, acc)) continue;
                for (int64_t i = 0; i < i1 - i0; i += QK, rec += rb) {
                    if (qtype == QT_Q4_1) dequant_q4_1(rec, scratch + i * JB);
                    else dequant_q8_0(rec, scratch + i * JB);
                }
                for (int64_t r0 = 0; r0 < R; r0 += RB) {
                    const int64_t nr = R - r0 < RB ? R - r0 : RB;
                    block_rows(x + r0 * ldx + i0, ldx, 0, i1 - i0, scratch, nr, acc + r0 * JB);
                }
            }
        }
        for (int64_t r = 0; r < R; r++) {
            float *yr = y + r * N + j0;
            const float *ar = acc + r * JB;
            if (bias) {
                for (int64_t j = 0; j < nj; j++) yr[j] = ar[j] + bias[j0 + j];
            } else {
                memcpy(yr, ar, sizeof(float) * (size_t)nj);
            }
        }
    } while (pool_claim(region, &b0, &b1));
    free(acc);
}

/* y = x @ W (+ bias) for W given as fp32 blocks (Wp, qtype QT_F32) or quantised records (Wq). */
static int linear_rows(const float *x, int64_t ldx, int64_t R, int64_t K, const float *Wp, const uint8_t *Wq, int qtype,
                       int64_t N, const float *bias, float *y, int nthreads) {
    const int64_t rb = qrecord_bytes(qtype);
    if (nthreads < 1) nthreads = 1;
    if (qtype != QT_F32 && (rb == 0 || K % QK != 0)) return 2;
    lin_job J = {x, Wp, bias, Wq, y, ldx, R, K, N, (N + JB - 1) / JB, rb, qtype, 0};
    /* chunks of ~1/8 of a thread's share: a preempted thread leaves little to wait for */
    const int nt = R * K * N > 65536 ? nthreads : 1;
    pool_run(nt, J.nb, J.nb / (8 * nt) > 1 ? J.nb / (8 * nt) : 1, lin_part, &J);
    return atomic_load(&J.failed);
}

/* x (R, K) row stride ldx; Wp (nb, K, 16); bias (N,) or NULL; y (R, N) contiguous. Returns 0, or
 * 1 if the accumulator scratch could not be allocated. */
int linear_rows_f32(const float *x, int64_t ldx, int64_t R, int64_t K, const float *Wp, int64_t N,
                    const float *bias, float *y, int nthreads) {
    return linear_rows(x, ldx, R, K, Wp, NULL, QT_F32, N, bias, y, nthreads);
}

/* The same product over quantised records (qtype 1 = Q4_1, 2 = Q8_0; see above). Returns 0, 1 if
 * the scratch could not be allocated, 2 for an unknown qtype or K not a multiple of 32. */
int linear_rows_q(const float *x, int64_t ldx, int64_t R, int64_t K, const uint8_t *Wq, int qtype, int64_t N,
                  const float *bias, float *y, int nthreads) {
    if (qtype == QT_Q4_1A8 || qtype == QT_Q8_0A8) return linear_rows_a8(x, ldx, R, K, Wq, qtype, N, bias, y, nthreads);
    if (qtype == QT_BF16) return linear_rows_bf16(x, ldx, R, K, (const uint16_t *)Wq, N, bias, y, nthreads);
    return linear_rows(x, ldx, R, K, NULL, Wq, qtype, N, bias, y, nthreads);
}

/* Rows `ids` (n of them) of the [N, K] matrix held as quantised (or bf16) records, dequantised into
 * out (n, K): an embedding lookup from the tied head's quantised copy. Returns 2 for a bad qtype or
 * K, 3 for an id out of range. */
int quant_rows_f32(const uint8_t *Wq, int qtype, int64_t N, int64_t K, const int64_t *ids, int64_t n, float *out) {
    if (qtype == QT_BF16) return bf16_rows_f32((const uint16_t *)Wq, N, K, ids, n, out);
    const int a8 = qtype == QT_Q4_1A8 || qtype == QT_Q8_0A8;
    const int64_t rb = a8 ? a8_record_bytes(qtype) : qrecord_bytes(qtype);
    float tmp[QK * JB];
    if (rb == 0 || K % QK != 0) return 2;
    for (int64_t t = 0; t < n; t++) {
        const int64_t v = ids[t];
        if (v < 0 || v >= N) return 3;
        const uint8_t *rec = Wq + (v / JB) * (K / QK) * rb;
        for (int64_t kb = 0; kb < K / QK; kb++, rec += rb) {
            if (a8) a8_dequant(qtype, rec, tmp);
            else if (qtype == QT_Q4_1) dequant_q4_1(rec, tmp);
            else dequant_q8_0(rec, tmp);
            for (int i = 0; i < QK; i++) out[t * K + kb * QK + i] = tmp[i * JB + v % JB];
        }
    }
    return 0;
}
