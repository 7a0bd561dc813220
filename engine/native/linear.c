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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define SPECCHAT_FMA_VEC 1
#endif

#define JB 16
#define RB 24 /* rows per call of block_rows: 6-row kernels, then 4, 2, 1 */

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

static void block_rows(const float *x, int64_t ldx, int64_t i0, int64_t i1, const float *w, int64_t nr, float *acc) {
    int64_t r = 0;
#ifdef SPECCHAT_FMA_VEC
    for (; nr - r >= 6; r += 6) rows6(x + r * ldx, ldx, i0, i1, w, acc + r * JB);
    for (; nr - r >= 4; r += 4) rows4(x + r * ldx, ldx, i0, i1, w, acc + r * JB);
    for (; nr - r >= 2; r += 2) rows2(x + r * ldx, ldx, i0, i1, w, acc + r * JB);
#endif
    for (; r < nr; r++) row1(x + r * ldx, i0, i1, w, acc + r * JB);
}

/* x (R, K) row stride ldx; Wp (nb, K, 16); bias (N,) or NULL; y (R, N) contiguous. Returns 0, or
 * 1 if the accumulator scratch could not be allocated. */
int linear_rows_f32(const float *x, int64_t ldx, int64_t R, int64_t K, const float *Wp, int64_t N,
                    const float *bias, float *y, int nthreads) {
    const int64_t nb = (N + JB - 1) / JB;
    int failed = 0;
    if (nthreads < 1) nthreads = 1;
#pragma omp parallel num_threads(nthreads) if (R * K * N > 65536) reduction(| : failed)
    {
        float *acc = (float *)malloc(sizeof(float) * (size_t)R * JB);
        if (!acc) {
            failed = 1;
        } else {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < nb; b++) {
                const float *w = Wp + b * K * JB;
                const int64_t j0 = b * JB;
                const int64_t nj = N - j0 < JB ? N - j0 : JB;
                memset(acc, 0, sizeof(float) * (size_t)R * JB);
                for (int64_t i0 = 0; i0 < K; i0 += KC) {
                    const int64_t i1 = K - i0 < KC ? K : i0 + KC;
                    for (int64_t r0 = 0; r0 < R; r0 += RB) {
                        const int64_t nr = R - r0 < RB ? R - r0 : RB;
                        block_rows(x + r0 * ldx, ldx, i0, i1, w, nr, acc + r0 * JB);
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
            }
            free(acc);
        }
    }
    return failed;
}
