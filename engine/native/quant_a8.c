/* GGUF-block products with 8-bit activations: the `q8` compute type (engine/models/quant.py,
 * `--dtype q8`). linear.c's Q4_1 / Q8_0 paths dequantise the weights to fp32 and run fp32 FMA
 * chains; at the 1-16 rows of decoding and verification that dequantisation and the FMAs, not the
 * memory, bound the time (SmolLM2-135M's pass: 6.6 ms at 1 row, 27 ms at 16, 2026-11-25 Zen 4,
 * bench/quant_kernels.py, while its ~112 MB of records stream in ~3.7 ms at the measured 30 GB/s).
 * Here, as in llama.cpp's CPU vec_dot, each row is quantised per 32 inputs to int8 with one fp32
 * scale (x ~ dx * qx, dx = max|x| / 127, qx = round-to-nearest-even(x / dx)) and every 32-input
 * block becomes an exact integer dot product (AVX-512 VNNI: 64 multiply-adds an instruction):
 *
 *   Q4_1 (w = d q + m, q in 0..15):  y_j += (d_j dx) * isum_j + m_j * (dx sx),  isum_j = sum q_ij qx_i
 *   Q8_0 (w = d q, q in -128..127):  y_j += (d_j dx) * isum_j
 *
 * with sx = sum qx_i and fp32 multiply-adds in that order, block after block from zero, then the
 * bias. This is a different dtype from fp32 (the activations are rounded), not a storage format,
 * so lossless is defined within it: every output is computed from its own row alone, in one fixed
 * order, by the same code for any number of rows and any thread (integer sums are exact, so the
 * vector and scalar paths agree bit for bit): a 1-token step and a k-token verify pass agree.
 *
 * Records (quant.py `pack(..., act8=True)`), per column block of 16 outputs, K / 32 of them:
 *   Q4_1a8, 320 bytes: fp16 d[16], fp16 m[16], then 4 x 64 bytes: in vector g, byte 4 j + k holds
 *                      q[8 g + k][j] in its low nibble and q[8 g + 4 + k][j] in its high nibble;
 *   Q8_0a8, 544 bytes: fp16 d[16], then 8 x 64 bytes: in vector h, byte 4 j + k is q[4 h + k][j].
 * (A 512-bit lane j then holds four consecutive inputs of output j: VNNI's dpbusd shape; 16
 * lanes' worth is an AMX-INT8 weight tile, which passes of AMX_MIN rows or more use.)
 */
#define _DEFAULT_SOURCE /* syscall() under -std=c11 (the AMX grant) */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#if defined(__AVX2__) /* every vector path below (AVX-512 builds define __AVX2__ too) */
#include <immintrin.h>
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define A8_VNNI 1
#endif
#if defined(A8_VNNI) && defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define A8_AMX 1
#endif

#define JB 16
#define QK 32
#define A8_PREFETCH 8192 /* bytes ahead that rows_avx2 asks for (see there) */
#define A8_AHEAD 2048    /* bytes ahead that rows_vnni asks for at 1-2 rows (see there) */
#define GMAX 8 /* rows per register group (8 accumulators + 8 weight vectors + scales < 32 zmm) */
enum { QT_Q4_1A8 = 3, QT_Q8_0A8 = 4 };

int64_t a8_record_bytes(int qtype) { return qtype == QT_Q4_1A8 ? 320 : qtype == QT_Q8_0A8 ? 544 : 0; }

static inline float half_to_float(uint16_t h) {
    /* exact fp16 -> fp32 (subnormals included), the same values as the vector cvtph */
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#ifdef A8_AMX
/* Linux hands out AMX's tile data state only on request (as bf16_rows.c; process-wide) */
static int a8_amx_granted(void) { return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0; }
#endif

/* Which kernel runs: 3 = AMX-INT8 tiles for passes of AMX_MIN rows or more (the VNNI kernel for
 * fewer), 2 = AVX-512 VNNI, 1 = AVX2 (maddubs), 0 = scalar; the best this build has, or
 * SPECCHAT_A8_PATH=amx|vnni|avx2|scalar (tests compare them bit for bit on one machine). */
enum { PATH_SCALAR = 0, PATH_AVX2 = 1, PATH_VNNI = 2, PATH_AMX = 3 };
static int a8_path(void) {
    static int v = -1;
    if (v < 0) {
        int best = PATH_SCALAR;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
        best = PATH_AVX2;
#endif
#ifdef A8_VNNI
        best = PATH_VNNI;
#endif
        const char *e = getenv("SPECCHAT_A8_PATH");
        int want = PATH_AMX;
        if (e && !strcmp(e, "scalar")) want = PATH_SCALAR;
        else if (e && !strcmp(e, "avx2")) want = PATH_AVX2;
        else if (e && !strcmp(e, "vnni")) want = PATH_VNNI;
#ifdef A8_AMX
        if (want == PATH_AMX && a8_amx_granted()) best = PATH_AMX;
#endif
        v = want < best ? want : best;
    }
    return v;
}
static int vec_on(void) { return a8_path() >= PATH_VNNI; }

/* One row's activations, K / 32 blocks: qx (K int8), dx, mx = dx * sx, sx. */
typedef struct {
    int8_t *q;
    float *d, *m;
    int32_t *s;
} a8_rows;

static void quantize_row(const float *x, int64_t K, int8_t *q, float *d, float *m, int32_t *s) {
#ifdef A8_VNNI
    /* the same operations as the loop below, sixteen at a time: max is exact in any order, the
     * scale and product are one rounding each, vcvtps2dq rounds half to even (the default MXCSR)
     * as nearbyintf does in the default rounding mode, and |x / dx| <= 127 needs no clamp beyond
     * the saturating pack */
    if (vec_on()) {
        const __m512 sign = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
        for (int64_t kb = 0; kb < K / QK; kb++) {
            const __m512 x0 = _mm512_loadu_ps(x + kb * QK), x1 = _mm512_loadu_ps(x + kb * QK + 16);
            const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_and_ps(x0, sign), _mm512_and_ps(x1, sign)));
            const float dx = amax / 127.0f;
            const __m512 id = _mm512_set1_ps(dx != 0.0f ? 1.0f / dx : 0.0f);
            const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, id)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, id));
            _mm_storeu_si128((__m128i *)(q + kb * QK), _mm512_cvtsepi32_epi8(q0));
            _mm_storeu_si128((__m128i *)(q + kb * QK + 16), _mm512_cvtsepi32_epi8(q1));
            const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
            d[kb] = dx;
            s[kb] = sum;
            m[kb] = dx * (float)sum;
        }
        return;
    }
#endif
#if defined(__AVX2__) && defined(__FMA__)
    /* AVX2: the same operations eight at a time (as above: exact max, one rounding for the scale
     * and for each product, vcvtps2dq rounds half to even; |x / dx| <= 127 up to rounding, so the
     * scalar clamp never binds and the saturating packs keep the values). The scalar loop took
     * ~5 ns an input here, a third of a 16-row pass's linear time on a 2-core AVX2 EPYC. */
    if (a8_path() != PATH_SCALAR) {
        const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* undoes the packs' lane interleave */
        for (int64_t kb = 0; kb < K / QK; kb++) {
            const float *xb = x + kb * QK;
            const __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8), x2 = _mm256_loadu_ps(xb + 16),
                         x3 = _mm256_loadu_ps(xb + 24);
            __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(x0, sign), _mm256_and_ps(x1, sign)),
                                      _mm256_max_ps(_mm256_and_ps(x2, sign), _mm256_and_ps(x3, sign)));
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            const float dx = _mm_cvtss_f32(m4) / 127.0f;
            const __m256 id = _mm256_set1_ps(dx != 0.0f ? 1.0f / dx : 0.0f);
            const __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(x0, id)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(x1, id)),
                          q2 = _mm256_cvtps_epi32(_mm256_mul_ps(x2, id)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(x3, id));
            const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
            _mm256_storeu_si256((__m256i *)(q + kb * QK), _mm256_permutevar8x32_epi32(p, order));
            const __m256i t = _mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3));
            __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4e));
            u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0xb1));
            const int32_t sum = _mm_cvtsi128_si32(u);
            d[kb] = dx;
            s[kb] = sum;
            m[kb] = dx * (float)sum;
        }
        return;
    }
#endif
    for (int64_t kb = 0; kb < K / QK; kb++) {
        const float *xb = x + kb * QK;
        float amax = 0.0f;
        for (int i = 0; i < QK; i++) amax = fmaxf(amax, fabsf(xb[i]));
        const float dx = amax / 127.0f;
        const float id = dx != 0.0f ? 1.0f / dx : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < QK; i++) {
            float v = nearbyintf(xb[i] * id);
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            q[kb * QK + i] = (int8_t)v;
            sum += (int8_t)v;
        }
        d[kb] = dx;
        s[kb] = sum;
        m[kb] = dx * (float)sum;
    }
}

/* integer dot products of one record with one row's 32 activations, all 16 outputs (scalar) */
static void isum_scalar(int qtype, const uint8_t *rec, const int8_t *qx, int32_t out[JB]) {
    for (int j = 0; j < JB; j++) out[j] = 0;
    if (qtype == QT_Q4_1A8) {
        const uint8_t *p = rec + 64;
        for (int g = 0; g < 4; g++)
            for (int j = 0; j < JB; j++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t b = p[64 * g + 4 * j + k];
                    out[j] += (int32_t)(b & 15) * qx[8 * g + k] + (int32_t)(b >> 4) * qx[8 * g + 4 + k];
                }
    } else {
        const int8_t *p = (const int8_t *)(rec + 32);
        for (int h = 0; h < 8; h++)
            for (int j = 0; j < JB; j++)
                for (int k = 0; k < 4; k++) out[j] += (int32_t)p[64 * h + 4 * j + k] * qx[4 * h + k];
    }
}

static void rows_scalar(int qtype, const a8_rows *X, int64_t r0, int64_t nr, int64_t K, const uint8_t *rec, int64_t rb,
                        float *acc) {
    const int64_t nkb = K / QK;
    for (int64_t kb = 0; kb < nkb; kb++, rec += rb) {
        const uint16_t *h = (const uint16_t *)rec;
        float d[JB], m[JB];
        for (int j = 0; j < JB; j++) {
            d[j] = half_to_float(h[j]);
            m[j] = qtype == QT_Q4_1A8 ? half_to_float(h[JB + j]) : 0.0f;
        }
        for (int64_t r = r0; r < r0 + nr; r++) {
            int32_t is[JB];
            isum_scalar(qtype, rec, X->q + r * K + kb * QK, is);
            const float dx = X->d[r * nkb + kb], mx = X->m[r * nkb + kb];
            float *a = acc + (r - r0) * JB;
            for (int j = 0; j < JB; j++) {
                a[j] = fmaf(d[j] * dx, (float)is[j], a[j]);
                if (qtype == QT_Q4_1A8) a[j] = fmaf(m[j], mx, a[j]);
            }
        }
    }
}


#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define A8_AVX2 1
/* AVX2 without VNNI: _mm256_maddubs_epi16 (u8 x s8 pairs into int16) then _mm256_madd_epi16 with
 * ones (pairs of int16 into int32): the four products of a lane summed exactly. Q4_1's nibbles
 * (<= 15) cannot saturate the int16 pair sums (<= 3810); Q8_0 takes |q| as the unsigned side and
 * moves q's sign onto the activation (_mm256_sign_epi8), pair sums <= 2 * 128 * 127 = 32512.
 * The sixteen outputs run as two halves of eight; the fp32 steps are the VNNI kernel's, so all
 * three paths give the same bits. */
/* G rows (a compile-time constant after inlining, 1-8) of NH halves (eight outputs each, from
 * half0) of one column block over every input block, the fp32 accumulators kept across the input
 * blocks. The loop order before (each record: both halves, every row, the accumulators loaded and
 * stored each record) ran a 16-row pass's products at ~13 multiply-adds a cycle on Zen 3. The
 * `unroll 1` loops matter: unrolled, gcc 12 hoisted all 32 maddubs of a 4-row record ahead of
 * their adds and spilled them to the stack. Integer sums are exact in any order and the fp32 steps
 * are the same operations in the same order as before, so the bits do not change. */
static inline __attribute__((always_inline)) void rows_avx2_g(const int G, const int NH, const int qtype, const a8_rows *X,
                                                              int64_t r0, int64_t K, const uint8_t *rec, int64_t rb, int half0,
                                                              int prefetch, float *acc) {
    const int64_t nkb = K / QK;
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    __m256 a[8][2];
    for (int r = 0; r < G; r++)
        for (int h = 0; h < NH; h++) a[r][h] = _mm256_loadu_ps(acc + r * JB + 8 * (half0 + h));
    for (int64_t kb = 0; kb < nkb; kb++, rec += rb) {
        /* a few rows stream the records from memory (SmolLM2's ~96 MB a token, past any L3): ask for
         * them 8 KB ahead, where the hardware prefetcher alone left the pass ~1.2x slower at one row
         * on a 2-core AVX2 EPYC (bench/ab_native.py --dtype q8, 21 interleaved rounds: 1 row 5.68 ->
         * 4.55 ms, 2 rows 6.32 -> 5.38, 4 rows 7.74 -> 7.06). Past 4 rows the products bound the
         * time and the extra instructions do not pay. A prefetch past the end is harmless. A second
         * call over the same column block (the other half, further rows) finds it in cache. */
        if (prefetch)
            for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)rec + A8_PREFETCH + o, _MM_HINT_T0);
        for (int hh = 0; hh < NH; hh++) {
            const int half = half0 + hh;
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 16 * half)));
            __m256i s[8];
            for (int r = 0; r < G; r++) s[r] = _mm256_setzero_si256();
            if (qtype == QT_Q4_1A8) {
                /* eight maddubs pair sums (each |.| <= 2 * 15 * 127 = 3810) added in int16 stay below
                 * 30480 < 32767: exact, one madd a row and record */
#pragma GCC unroll 1
                for (int g = 0; g < 4; g++) { /* the low nibbles hold inputs 8g..8g+3, the high 8g+4.. */
                    const __m256i p = _mm256_loadu_si256((const __m256i *)(rec + 64 + 64 * g + 32 * half));
                    const __m256i wl = _mm256_and_si256(p, low), wh = _mm256_and_si256(_mm256_srli_epi16(p, 4), low);
                    for (int r = 0; r < G; r++) {
                        const int8_t *qx = X->q + (r0 + r) * K + kb * QK + 8 * g;
                        int32_t x0, x1;
                        memcpy(&x0, qx, 4);
                        memcpy(&x1, qx + 4, 4);
                        s[r] = _mm256_add_epi16(s[r], _mm256_add_epi16(_mm256_maddubs_epi16(wl, _mm256_set1_epi32(x0)),
                                                                       _mm256_maddubs_epi16(wh, _mm256_set1_epi32(x1))));
                    }
                }
                for (int r = 0; r < G; r++) s[r] = _mm256_madd_epi16(s[r], ones);
            } else {
                /* Q8_0: |q| is the unsigned side and q's sign moves onto the activation; pair sums
                 * <= 2 * 128 * 127 = 32512 leave no room to add two in int16 */
#pragma GCC unroll 1
                for (int h = 0; h < 8; h++) { /* vector h holds inputs 4h..4h+3 */
                    const __m256i w = _mm256_loadu_si256((const __m256i *)(rec + 32 + 64 * h + 32 * half));
                    const __m256i aw = _mm256_abs_epi8(w);
                    for (int r = 0; r < G; r++) {
                        int32_t xv;
                        memcpy(&xv, X->q + (r0 + r) * K + kb * QK + 4 * h, 4);
                        s[r] = _mm256_add_epi32(
                            s[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(_mm256_set1_epi32(xv), w)), ones));
                    }
                }
            }
            const __m256 m =
                qtype == QT_Q4_1A8 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(rec + 32 + 16 * half))) : _mm256_setzero_ps();
            for (int r = 0; r < G; r++) {
                const int64_t row = r0 + r;
                a[r][hh] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(X->d[row * nkb + kb])), _mm256_cvtepi32_ps(s[r]), a[r][hh]);
                if (qtype == QT_Q4_1A8) a[r][hh] = _mm256_fmadd_ps(m, _mm256_set1_ps(X->m[row * nkb + kb]), a[r][hh]);
            }
        }
    }
    for (int r = 0; r < G; r++)
        for (int h = 0; h < NH; h++) _mm256_storeu_ps(acc + r * JB + 8 * (half0 + h), a[r][h]);
}

#define A8_AVX2_Q4(G) \
    static void avx2_q4_g##G(const a8_rows *X, int64_t r0, int64_t K, const uint8_t *rec, int64_t rb, int h0, int pf, float *acc) { \
        rows_avx2_g(G, 1, QT_Q4_1A8, X, r0, K, rec, rb, h0, pf, acc); }
#define A8_AVX2_Q8(G, NH) \
    static void avx2_q8_g##G##_##NH(const a8_rows *X, int64_t r0, int64_t K, const uint8_t *rec, int64_t rb, int h0, int pf, float *acc) { \
        rows_avx2_g(G, NH, QT_Q8_0A8, X, r0, K, rec, rb, h0, pf, acc); }
A8_AVX2_Q4(1) A8_AVX2_Q4(2) A8_AVX2_Q4(3) A8_AVX2_Q4(4) A8_AVX2_Q4(5) A8_AVX2_Q4(6) A8_AVX2_Q4(7) A8_AVX2_Q4(8)
A8_AVX2_Q8(1, 1) A8_AVX2_Q8(2, 1) A8_AVX2_Q8(3, 1) A8_AVX2_Q8(4, 1) A8_AVX2_Q8(5, 1) A8_AVX2_Q8(6, 1) A8_AVX2_Q8(7, 1)
A8_AVX2_Q8(8, 1) A8_AVX2_Q8(1, 2) A8_AVX2_Q8(2, 2)
typedef void (*a8_avx2_fn)(const a8_rows *, int64_t, int64_t, const uint8_t *, int64_t, int, int, float *);
static const a8_avx2_fn AVX2Q4[GMAX + 1] = {NULL, avx2_q4_g1, avx2_q4_g2, avx2_q4_g3, avx2_q4_g4, avx2_q4_g5, avx2_q4_g6, avx2_q4_g7, avx2_q4_g8};
static const a8_avx2_fn AVX2Q8[GMAX + 1] = {NULL, avx2_q8_g1_1, avx2_q8_g2_1, avx2_q8_g3_1, avx2_q8_g4_1, avx2_q8_g5_1, avx2_q8_g6_1, avx2_q8_g7_1, avx2_q8_g8_1};
static const a8_avx2_fn AVX2Q8_BOTH[3] = {NULL, avx2_q8_g1_2, avx2_q8_g2_2}; /* both halves in one sweep */

/* nr (<= GMAX = 8) rows as one group, each half of the column block swept on its own (Q4_1: eight
 * rows' int16 sums, the nibbles and the broadcasts fit the 16 registers; groups of at most 4 rows
 * measured ~5% slower at 8 and 16 rows on a 2-core AVX2 EPYC, one thread, interleaved builds), or
 * both halves in one sweep for Q8_0 at 1-2 rows, which read each record once. */
static void rows_avx2(int qtype, const a8_rows *X, int64_t r0, int64_t nr, int64_t K, const uint8_t *rec, int64_t rb, float *acc) {
    if (qtype == QT_Q8_0A8 && nr <= 2) {
        AVX2Q8_BOTH[nr](X, r0, K, rec, rb, 0, 1, acc);
        return;
    }
    for (int half = 0; half < 2; half++)
        (qtype == QT_Q4_1A8 ? AVX2Q4 : AVX2Q8)[nr](X, r0, K, rec, rb, half, nr <= 4 && half == 0, acc);
}
#endif

#ifdef A8_VNNI
/* the fp32 steps after a block's integer sums ``s`` of one row (``at``: its block's index in X),
 * in every vector kernel's order: y += (d_j dx) isum_j, then (Q4_1) y += m_j mx. The VNNI and AMX
 * kernels share it, so their bits cannot drift apart. */
static inline __attribute__((always_inline)) __m512 a8_fold(const int qtype, __m512 a, __m512 d, __m512 m, __m512i s,
                                                            const a8_rows *X, int64_t at) {
    a = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(X->d[at])), _mm512_cvtepi32_ps(s), a);
    if (qtype == QT_Q4_1A8) a = _mm512_fmadd_ps(m, _mm512_set1_ps(X->m[at]), a);
    return a;
}

/* acc += w (u8) . the four int8 at p broadcast to every lane: the broadcast folded into the
 * instruction's memory operand ({1to16}), which gcc does not do for _mm512_set1_epi32 (it spent
 * one vpbroadcastd per dpbusd, a third of the loop's instructions) */
#define DPB(acc, w, p) __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)(p)))

/* G rows (a compile-time constant after inlining) of one column block over every input block */
static inline __attribute__((always_inline)) void rows_vnni(const int G, const int qtype, const a8_rows *X, int64_t r0, int64_t K,
                                                            const uint8_t *rec, int64_t rb, float *acc) {
    const int64_t nkb = K / QK;
    __m512 a[GMAX];
    for (int r = 0; r < G; r++) a[r] = _mm512_loadu_ps(acc + r * JB);
    const __m512i low = _mm512_set1_epi8(15), flip = _mm512_set1_epi8((char)0x80);
    for (int64_t kb = 0; kb < nkb; kb++, rec += rb) {
        /* from 3 rows on, the next column block's record at this offset into L2 (as bf16_rows.c's
         * rows_vec): a pass of several rows computes long enough per byte that the hardware's own
         * prefetch of this block alone left the memory idle. SmolLM2's q8 verify pass, 2-core Zen 4
         * (`specchat bench --verify-cost`, two runs each): 8 rows 5.48/5.30 -> 3.84/3.95 ms, 16
         * rows 10.30/10.07 -> 6.87/6.87, 1-4 rows unchanged (bench/results/2026-11-27-session29).
         * A prefetch past the weights' end does not fault. */
        if (G > 2)
            for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)(rec + nkb * rb + o), _MM_HINT_T1);
        else /* 1-2 rows, memory-bound: this stream's records A8_AHEAD bytes on into L1, where the
              * hardware's prefetch of one stream a thread left the memory short of its rate
              * (SmolLM2's q8 C pass, 2-core AMX Xeon, bench/ab_native.py interleaved, 21 rounds:
              * 1 row 1.65 -> 1.53 ms, 2 rows 2.00 -> 1.81; 1 KB ahead 0.95x, 4-8 KB 0.96x; the same
              * for 3+ rows did not pay) */
            for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)(rec + A8_AHEAD + o), _MM_HINT_T0);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        __m512i w[8];
        __m512 m = _mm512_setzero_ps();
        if (qtype == QT_Q4_1A8) {
            m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32)));
            for (int g = 0; g < 4; g++) {
                const __m512i p = _mm512_loadu_si512((const void *)(rec + 64 + 64 * g));
                w[2 * g] = _mm512_and_si512(p, low);
                w[2 * g + 1] = _mm512_and_si512(_mm512_srli_epi16(p, 4), low);
            }
        } else { /* signed q as unsigned q + 128 for dpbusd; the 128 * sx is taken off below */
            for (int h = 0; h < 8; h++) w[h] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(rec + 32 + 64 * h)), flip);
        }
        for (int r = 0; r < G; r++) {
            const int64_t row = r0 + r;
            const int8_t *qx = X->q + row * K + kb * QK;
            /* two dependency chains a row (one chain a row, even with 3-8 rows interleaved, measured
             * slower: 8 rows 7.1 -> 10.4 ms a pass) */
            __m512i s0 = _mm512_setzero_si512(), s1 = s0;
            __m512i *c1 = &s1;
            if (qtype == QT_Q4_1A8) { /* w[2g] holds inputs 8g..8g+3, w[2g+1] inputs 8g+4..8g+7 */
                for (int g = 0; g < 4; g++) {
                    DPB(s0, w[2 * g], qx + 8 * g);
                    DPB(*c1, w[2 * g + 1], qx + 8 * g + 4);
                }
            } else {
                for (int h = 0; h < 8; h += 2) {
                    DPB(s0, w[h], qx + 4 * h);
                    DPB(*c1, w[h + 1], qx + 4 * h + 4);
                }
            }
            __m512i s = _mm512_add_epi32(s0, s1);
            if (qtype == QT_Q8_0A8) s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * X->s[row * nkb + kb]));
            a[r] = a8_fold(qtype, a[r], d, m, s, X, row * nkb + kb);
        }
    }
    for (int r = 0; r < G; r++) _mm512_storeu_ps(acc + r * JB, a[r]);
}

#define A8_FN(G) \
    static void q4_g##G(const a8_rows *X, int64_t r0, int64_t K, const uint8_t *rec, int64_t rb, float *acc) { \
        rows_vnni(G, QT_Q4_1A8, X, r0, K, rec, rb, acc); } \
    static void q8_g##G(const a8_rows *X, int64_t r0, int64_t K, const uint8_t *rec, int64_t rb, float *acc) { \
        rows_vnni(G, QT_Q8_0A8, X, r0, K, rec, rb, acc); }
A8_FN(1) A8_FN(2) A8_FN(3) A8_FN(4) A8_FN(5) A8_FN(6) A8_FN(7) A8_FN(8)
typedef void (*a8_fn)(const a8_rows *, int64_t, int64_t, const uint8_t *, int64_t, float *);
static const a8_fn Q4G[GMAX + 1] = {NULL, q4_g1, q4_g2, q4_g3, q4_g4, q4_g5, q4_g6, q4_g7, q4_g8};
static const a8_fn Q8G[GMAX + 1] = {NULL, q8_g1, q8_g2, q8_g3, q8_g4, q8_g5, q8_g6, q8_g7, q8_g8};
#endif

#ifdef A8_AMX
/* The AMX-INT8 path: one `tdpbssd` computes a 32-input block's integer sums for up to 16 rows x 16
 * outputs (the VNNI kernel: 8 `vpdpbusd` a row). The records are already its weight tile: a
 * Q8_0 record's 8 vectors are the 8 tile rows (row h, byte 4 j + k = q[4 h + k][j]: inputs 4h..4h+3
 * of output j, tdpbssd's B layout), a Q4_1 record's nibbles unpack to the same (vector g's low
 * nibbles are inputs 8g..8g+3, its high ones 8g+4..8g+7: tile rows 2g and 2g+1; nibbles <= 15 are
 * valid signed bytes), and the rows' int8 activations are the A tile as they lie (row r at stride
 * K). Integer sums are exact, and the fp32 steps after them are the VNNI kernel's, in its order:
 * every output's bits are the other paths' for any row count, so a pass picks the path by its
 * row count (AMX_MIN) and a 1-token step and a k-token verify pass still agree. */
#define AMX_G 16 /* rows a group (a tile's rows) */
/* Rows from which a pass runs on the tiles. SmolLM2-135M's linears, 2-core AMX Xeon, idle, paths
 * alternated (`SPECCHAT_A8_PATH=vnni|amx python bench/quant_kernels.py --a8`, session 42), VNNI ->
 * tiles ms: 4 rows 3.4-3.7 -> 4.7-4.8, 8 rows 4.5-5.1 -> 5.2-5.6, 10 rows 5.6-6.3 -> 5.4-5.8, 12
 * rows 6.2-7.0 -> 5.7-6.5, 16 rows 7.3-8.5 -> 6.0-6.8, 32 rows 13.2-15.4 -> 11.4-11.6, 64 rows 24.6
 * -> 19.6-21.2: each block's tile round trip (zero, two loads, tdpbssd, store, the sums read back)
 * costs more than a few rows' vpdpbusd. End to end in q8 (`bench --dtype q8 --strategies
 * ar,pld:auto,optimal`) the same tok/s either way: those passes stay under 10 rows there. */
#define AMX_MIN 10
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) a8_amx_cfg;

/* two stages (a block's products on the tiles while the previous block's sums go through the
 * fp32 steps): C tiles 0 and 3 (G x 16 int32), the rows' activations 1 and 4 (G x 32 int8), the
 * weights 2 and 5 (8 x 64 bytes). One stage alone left every block's zero -> load -> tdpbssd ->
 * store -> fp32 chain waiting on the last (slower than the VNNI kernel at every row count). */
static void a8_amx_config(int G) {
    a8_amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t += 3) {
        c.rows[t] = (uint8_t)G, c.colsb[t] = 64;
        c.rows[t + 1] = (uint8_t)G, c.colsb[t + 1] = QK;
        c.rows[t + 2] = 8, c.colsb[t + 2] = 64;
    }
    _tile_loadconfig(&c);
}

/* the weight tile of a record: a Q8_0 record's own 8 vectors, a Q4_1 record's nibbles unpacked into wt */
static inline __attribute__((always_inline)) const void *amx_weights(const int qtype, const uint8_t *rec, uint8_t *wt) {
    if (qtype != QT_Q4_1A8) return rec + 32;
    const __m512i low = _mm512_set1_epi8(15);
    for (int g = 0; g < 4; g++) {
        const __m512i p = _mm512_loadu_si512((const void *)(rec + 64 + 64 * g));
        _mm512_store_si512((void *)(wt + 128 * g), _mm512_and_si512(p, low));
        _mm512_store_si512((void *)(wt + 128 * g + 64), _mm512_and_si512(_mm512_srli_epi16(p, 4), low));
    }
    return wt;
}

/* a block onto a stage's tiles (named by literals: the intrinsics write them into the asm) */
#define AMX_STAGE0(qrow, w) do { _tile_zero(0); _tile_loadd(1, (qrow), K); _tile_loadd(2, (w), 64); _tile_dpbssd(0, 1, 2); } while (0)
#define AMX_STAGE1(qrow, w) do { _tile_zero(3); _tile_loadd(4, (qrow), K); _tile_loadd(5, (w), 64); _tile_dpbssd(3, 4, 5); } while (0)

static inline __attribute__((always_inline)) void rows_amx(const int G, const int qtype, const a8_rows *X, int64_t r0, int64_t K,
                                                           const uint8_t *rec, int64_t rb, float *acc) {
    const int64_t nkb = K / QK;
    __m512 a[AMX_G];
    int32_t sums[AMX_G * JB] __attribute__((aligned(64)));
    uint8_t wt[2][8 * 64] __attribute__((aligned(64)));
    for (int r = 0; r < G; r++) a[r] = _mm512_loadu_ps(acc + r * JB);
    const int8_t *qx = X->q + r0 * K;
    AMX_STAGE0(qx, amx_weights(qtype, rec, wt[0]));
    for (int64_t kb = 0; kb < nkb; kb++, rec += rb) {
        for (int64_t o = 0; o < rb; o += 64) _mm_prefetch((const char *)(rec + nkb * rb + o), _MM_HINT_T1); /* (rows_vnni) */
        if (kb + 1 < nkb) { /* the next block onto the other stage's tiles */
            const void *w = amx_weights(qtype, rec + rb, wt[(kb + 1) & 1]);
            if (kb & 1) AMX_STAGE0(qx + (kb + 1) * QK, w);
            else AMX_STAGE1(qx + (kb + 1) * QK, w);
        }
        if (kb & 1) _tile_stored(3, sums, 64);
        else _tile_stored(0, sums, 64);
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)rec));
        const __m512 m = qtype == QT_Q4_1A8 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(rec + 32))) : _mm512_setzero_ps();
        for (int r = 0; r < G; r++) {
            const int64_t row = r0 + r;
            const __m512i s = _mm512_load_si512((const void *)(sums + r * JB));
            a[r] = a8_fold(qtype, a[r], d, m, s, X, row * nkb + kb);
        }
    }
    for (int r = 0; r < G; r++) _mm512_storeu_ps(acc + r * JB, a[r]);
}

#define AMX_FN(G) \
    static void q4_t##G(const a8_rows *X, int64_t r0, int64_t K, const uint8_t *rec, int64_t rb, float *acc) { \
        rows_amx(G, QT_Q4_1A8, X, r0, K, rec, rb, acc); } \
    static void q8_t##G(const a8_rows *X, int64_t r0, int64_t K, const uint8_t *rec, int64_t rb, float *acc) { \
        rows_amx(G, QT_Q8_0A8, X, r0, K, rec, rb, acc); }
AMX_FN(4) AMX_FN(5) AMX_FN(6) AMX_FN(7) AMX_FN(8) AMX_FN(9) AMX_FN(10) AMX_FN(11) AMX_FN(12) AMX_FN(13) AMX_FN(14)
AMX_FN(15) AMX_FN(16)
static const a8_fn Q4T[AMX_G + 1] = {NULL, NULL, NULL, NULL, q4_t4, q4_t5, q4_t6, q4_t7, q4_t8, q4_t9, q4_t10, q4_t11,
                                     q4_t12, q4_t13, q4_t14, q4_t15, q4_t16};
static const a8_fn Q8T[AMX_G + 1] = {NULL, NULL, NULL, NULL, q8_t4, q8_t5, q8_t6, q8_t7, q8_t8, q8_t9, q8_t10, q8_t11,
                                     q8_t12, q8_t13, q8_t14, q8_t15, q8_t16};
#endif


/* 2 where the products run the AVX-512 VNNI kernel, 1 the AVX2 one, 0 the scalar loop (slow: a
 * model only takes the q8 type there when asked to) */
int a8_vectorized(void) { return a8_path(); }

typedef struct {
    a8_rows X;
    const uint8_t *Wq;
    const float *bias;
    float *y;
    int64_t R, K, N, rb;
    int qtype;
} a8_job;

static void a8_part(void *ctx, pool_region *region) {
    const a8_job *J = (const a8_job *)ctx;
    const int64_t R = J->R, K = J->K, N = J->N, rb = J->rb;
    const int path = a8_path();
#ifdef A8_AMX
    const int tiles = path == PATH_AMX && R >= AMX_MIN;
    float acc[AMX_G * JB];
    int configured = 0; /* the tile configuration's row count (0: none loaded yet) */
#else
    const int tiles = 0;
    float acc[GMAX * JB];
#endif
    const int64_t gmax = tiles ? 16 : GMAX;
    int64_t b0, b1;
    while (pool_claim(region, &b0, &b1)) {
        for (int64_t b = b0; b < b1; b++) {
            const uint8_t *rec = J->Wq + b * (K / QK) * rb;
            const int64_t j0 = b * JB, nj = N - j0 < JB ? N - j0 : JB;
            const int64_t groups = (R + gmax - 1) / gmax;
            int64_t r = 0;
            for (int64_t g = 0; g < groups; g++) {
                const int64_t take = (R - r + (groups - g) - 1) / (groups - g); /* even groups: 10 -> 5 + 5 */
                memset(acc, 0, sizeof(float) * (size_t)(take * JB));
#ifdef A8_AMX
                if (tiles) {
                    /* loaded on every call, as bf16_rows.c: the configuration is thread state that
                     * other AMX code on the thread (oneDNN, the bf16 tiles) replaces and releases */
                    if (configured != take) {
                        a8_amx_config((int)take);
                        configured = (int)take;
                    }
                    (J->qtype == QT_Q4_1A8 ? Q4T : Q8T)[take](&J->X, r, K, rec, rb, acc);
                } else
#endif
#ifdef A8_VNNI
                if (path >= PATH_VNNI)
                    (J->qtype == QT_Q4_1A8 ? Q4G : Q8G)[take](&J->X, r, K, rec, rb, acc);
                else
#endif
#ifdef A8_AVX2
                if (path == PATH_AVX2)
                    rows_avx2(J->qtype, &J->X, r, take, K, rec, rb, acc);
                else
#endif
                    rows_scalar(J->qtype, &J->X, r, take, K, rec, rb, acc);
                (void)path;
                for (int64_t t = 0; t < take; t++) {
                    float *yr = J->y + (r + t) * N + j0;
                    if (J->bias) {
                        for (int64_t j = 0; j < nj; j++) yr[j] = acc[t * JB + j] + J->bias[j0 + j];
                    } else if (nj == JB) {
                        memcpy(yr, acc + t * JB, sizeof(float) * JB); /* inlined (bf16_rows.c's put) */
                    } else {
                        memcpy(yr, acc + t * JB, sizeof(float) * (size_t)nj);
                    }
                }
                r += take;
            }
        }
    }
#ifdef A8_AMX
    if (configured) _tile_release(); /* tiles back to their initial state (as bf16_rows.c) */
#endif
}

/* y (R, N) = x (R, K; row stride ldx) @ W (+ bias) with x quantised per 32 inputs (see above).
 * Returns 0, 1 if the activation buffer could not be allocated, 2 for a bad qtype or K. */
int linear_rows_a8(const float *x, int64_t ldx, int64_t R, int64_t K, const uint8_t *Wq, int qtype, int64_t N, const float *bias,
                   float *y, int nthreads) {
    const int64_t rb = a8_record_bytes(qtype);
    if (rb == 0 || K % QK != 0) return 2;
    if (R <= 0) return 0;
    const int64_t nkb = K / QK;
    /* one buffer: q (R K bytes), then d, m (floats) and s (int32), R nkb each */
    const size_t qbytes = ((size_t)(R * K) + 63) & ~(size_t)63;
    uint8_t *buf = (uint8_t *)malloc(qbytes + (size_t)(R * nkb) * 12);
    if (!buf) return 1;
    a8_rows X = {(int8_t *)buf, (float *)(buf + qbytes), (float *)(buf + qbytes) + R * nkb,
                 (int32_t *)((float *)(buf + qbytes) + 2 * R * nkb)};
    for (int64_t r = 0; r < R; r++) quantize_row(x + r * ldx, K, X.q + r * K, X.d + r * nkb, X.m + r * nkb, X.s + r * nkb);
    a8_job J = {X, Wq, bias, y, R, K, N, rb, qtype};
    const int64_t nb = (N + JB - 1) / JB;
    if (nthreads < 1) nthreads = 1;
    const int nt = R * K * N > 65536 ? nthreads : 1;
    pool_run(nt, nb, nb / (8 * nt) > 1 ? nb / (8 * nt) : 1, a8_part, &J);
    free(buf);
    return 0;
}

/* the fp32 weights of record `rec` (its 32 inputs x 16 outputs, out[i * 16 + j]): GGUF's values,
 * d * q + m (one rounding, as fmaf) or d * q */
void a8_dequant(int qtype, const uint8_t *rec, float *out) {
    const uint16_t *h = (const uint16_t *)rec;
    for (int j = 0; j < JB; j++) {
        const float d = half_to_float(h[j]);
        if (qtype == QT_Q4_1A8) {
            const float m = half_to_float(h[JB + j]);
            const uint8_t *p = rec + 64;
            for (int g = 0; g < 4; g++)
                for (int k = 0; k < 4; k++) {
                    const uint8_t b = p[64 * g + 4 * j + k];
                    out[(8 * g + k) * JB + j] = fmaf(d, (float)(b & 15), m);
                    out[(8 * g + 4 + k) * JB + j] = fmaf(d, (float)(b >> 4), m);
                }
        } else {
            const int8_t *p = (const int8_t *)(rec + 32);
            for (int hh = 0; hh < 8; hh++)
                for (int k = 0; k < 4; k++) out[(4 * hh + k) * JB + j] = d * (float)p[64 * hh + 4 * j + k];
        }
    }
}

/* GGUF rows -> this file's records (quant.py `pack`; the numpy `_pack_a8` is the reference, the
 * same bytes: tests/test_quant.py). raw: N rows of K / 32 GGUF blocks (Q4_1: fp16 d, fp16 m, 16
 * bytes with input t in the low nibble of byte t and input t + 16 in the high one; Q8_0: fp16 d,
 * int8 q[32]); out: ceil(N / 16) * K / 32 records, column block by column block, outputs past N
 * zero. A load-time layout change (SmolLM2's 121 matrices: ~1 s in numpy). Returns 0, or -1 for
 * an unknown qtype or K % 32 != 0. */
int a8_pack(int qtype, const uint8_t *raw, int64_t N, int64_t K, uint8_t *out) {
    if (K % QK || (qtype != QT_Q4_1A8 && qtype != QT_Q8_0A8)) return -1;
    const int q4 = qtype == QT_Q4_1A8;
    const int64_t bs = q4 ? 20 : 34, nkb = K / QK, nb = (N + JB - 1) / JB, rb = a8_record_bytes(qtype);
    for (int64_t b = 0; b < nb; b++)
        for (int64_t kb = 0; kb < nkb; kb++) {
            uint8_t *rec = out + (b * nkb + kb) * rb;
            memset(rec, 0, (size_t)rb);
            for (int j = 0; j < JB; j++) {
                const int64_t n = b * JB + j;
                if (n >= N) break;
                const uint8_t *blk = raw + (n * nkb + kb) * bs;
                memcpy(rec + 2 * j, blk, 2); /* d */
                if (q4) {
                    memcpy(rec + 32 + 2 * j, blk + 2, 2); /* m */
                    uint8_t q[QK];
                    for (int t = 0; t < 16; t++) {
                        q[t] = blk[4 + t] & 15;
                        q[t + 16] = blk[4 + t] >> 4;
                    }
                    for (int g = 0; g < 4; g++)
                        for (int k = 0; k < 4; k++) rec[64 + 64 * g + 4 * j + k] = (uint8_t)(q[8 * g + k] | (q[8 * g + 4 + k] << 4));
                } else {
                    for (int h = 0; h < 8; h++)
                        for (int k = 0; k < 4; k++) rec[32 + 64 * h + 4 * j + k] = blk[2 + 4 * h + k];
                }
            }
        }
    return 0;
}

/* GGUF Q8_0 quantisation of an [N, K] fp32 matrix, operation for operation gguf.quants.Q8_0 (and
 * ggml-quants.c's reference): per 32-weight block d = max|x| / 127, q = roundf(x * (1 / d)) with
 * roundf as numpy's np_roundf (floor|x| + floor(2 frac), the sign put back), 0 where d = 0. Every
 * step is one IEEE fp32 operation (this file is built without contraction: -std=c11), so q and d
 * are gguf's. Writes the int8 q into out's GGUF rows (N x K / 32 blocks of 34 bytes, bytes 2..33)
 * and d (fp32) into dout[N * K / 32]: the caller stores d as fp16 in bytes 0..1 (numpy's rounding).
 * A drafter's load quantises ~25M weights this way (0.4 s in numpy, ~0.05 s here). Returns 0, or
 * -1 where K % 32 != 0. */
int q8_0_quantize(const float *w, int64_t N, int64_t K, uint8_t *out, float *dout) {
    if (K % QK) return -1;
    const int64_t nkb = K / QK;
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++)
        for (int64_t kb = 0; kb < nkb; kb++) {
            const float *x = w + n * K + kb * QK;
            float amax = 0.0f;
            for (int t = 0; t < QK; t++) {
                const float a = fabsf(x[t]);
                amax = a > amax ? a : amax;
            }
            const float d = amax / 127.0f;
            const float id = d == 0.0f ? 0.0f : 1.0f / d;
            int8_t *q = (int8_t *)(out + (n * nkb + kb) * 34 + 2);
            for (int t = 0; t < QK; t++) {
                const float v = x[t] * id, a = fabsf(v), f = floorf(a), r = f + floorf(2.0f * (a - f));
                q[t] = (int8_t)(v < 0.0f ? -r : r);
            }
            dout[n * nkb + kb] = d;
        }
    return 0;
}
