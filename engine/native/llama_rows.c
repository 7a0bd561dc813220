/* A llama-family decoder pass over T rows in one call (engine/models/llama.py, fp32 weights held by
 * linear.c: fp32 blocks or GGUF Q4_1 / Q8_0 records): per layer RMSNorm, qkv projection (+ bias),
 * rotate-half RoPE on q and k, the new K/V written into the cache, masked softmax attention over the
 * cache (GQA), output projection, residual, RMSNorm, gate/up projection, SiLU(g) * u, down
 * projection, residual.
 *
 * Why: the torch version of a SmolLM2 decode step spent ~10 ms of its ~19 in the Python and op
 * overhead of ~25 small ops per layer x 30 layers (cProfile), against ~9 ms of weight streaming.
 *
 * Lossless: every quantity of a row is computed from that row alone, in a fixed order (the norms'
 * and dot products' sums run over features in order; attention sums over keys in order), by the
 * same code for any T, any row offset and any thread: a 1-token decode step and a T-token verify
 * pass give a row the same bits. This replaces the torch pass for every pass of a model that takes
 * it (decode, verify, tree, prefill), so all passes share these numerics.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LR_VEC 1
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define LR_V512 1 /* attend_group in 16 lanes: the same operations on each value, so the same bits */
#if defined(__AVX512BW__) && defined(__AVX512BF16__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define LR_AMX 1 /* attend_group_amx: attention on AMX-BF16 tiles */
#endif
#endif
#endif

int bf16_rows_on_amx(void); /* bf16_rows.c: the bf16 products run on AMX (the tile state granted) */

int linear_rows_f32(const float *x, int64_t ldx, int64_t R, int64_t K, const float *Wp, int64_t N,
                    const float *bias, float *y, int nthreads);
int linear_rows_q(const float *x, int64_t ldx, int64_t R, int64_t K, const uint8_t *Wq, int qtype, int64_t N,
                  const float *bias, float *y, int nthreads);

/* per-layer table of int64 slots, filled by engine/models/llama.py */
enum {
    S_LN1, S_LN2, S_WQKV, S_QQKV, S_BQKV, S_WO, S_QO, S_BO, S_WGU, S_QGU, S_BGU, S_WD, S_QD, S_BD, S_NSLOTS
};

static int proj(const float *x, int64_t R, int64_t K, const int64_t *L, int w, int q, int b, int64_t N, float *y, int nt) {
    const void *W = (const void *)(intptr_t)L[w];
    const float *bias = (const float *)(intptr_t)L[b];
    if (L[q] == 0) return linear_rows_f32(x, K, R, K, (const float *)W, N, bias, y, nt);
    return linear_rows_q(x, K, R, K, (const uint8_t *)W, (int)L[q], N, bias, y, nt);
}

#ifdef LR_VEC
/* the eight lanes of v summed in a fixed tree */
static inline float hsum8(__m256 v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}

/* exp(x): x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for e^r, 2^n put in the exponent;
 * about 1 ulp over the normal range, 0 below -87.3 (the softmax's masked -inf included), clamped at
 * 88.7. One body for both widths (P: the intrinsics' prefix, W: the width, RND: round to nearest),
 * so exp16 gives exp8's value in every lane (tests/test_exp16_s48.py); y = the value before the
 * underflow's zeros. */
#define LR_EXP(P, W, RND, x, y)                                                                                      \
    do {                                                                                                             \
        x = P##_max_ps(P##_min_ps(x, P##_set1_ps(88.7228f)), P##_set1_ps(-87.3365f));                               \
        const __typeof__(x) n_ = RND(P##_mul_ps(x, P##_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); \
        __typeof__(x) r_ = P##_fnmadd_ps(n_, P##_set1_ps(0.693359375f), x);                                          \
        r_ = P##_fnmadd_ps(n_, P##_set1_ps(-2.12194440e-4f), r_);                                                    \
        __typeof__(x) p_ = P##_set1_ps(1.9875691500e-4f);                                                            \
        p_ = P##_fmadd_ps(p_, r_, P##_set1_ps(1.3981999507e-3f));                                                    \
        p_ = P##_fmadd_ps(p_, r_, P##_set1_ps(8.3334519073e-3f));                                                    \
        p_ = P##_fmadd_ps(p_, r_, P##_set1_ps(4.1665795894e-2f));                                                    \
        p_ = P##_fmadd_ps(p_, r_, P##_set1_ps(1.6666665459e-1f));                                                    \
        p_ = P##_fmadd_ps(p_, r_, P##_set1_ps(5.0000001201e-1f));                                                    \
        p_ = P##_fmadd_ps(p_, P##_mul_ps(r_, r_), P##_add_ps(r_, P##_set1_ps(1.0f)));                                \
        /* 2^n as two factors so that n = 128 (x near 88.7) stays finite */                                          \
        const __typeof__(P##_cvtps_epi32(n_)) e_ = P##_cvtps_epi32(n_), h_ = P##_srai_epi32(e_, 1);                  \
        const __typeof__(x) s1_ = P##_castsi##W##_ps(P##_slli_epi32(P##_add_epi32(h_, P##_set1_epi32(127)), 23));    \
        const __typeof__(x) s2_ = P##_castsi##W##_ps(P##_slli_epi32(P##_add_epi32(P##_sub_epi32(e_, h_), P##_set1_epi32(127)), 23)); \
        y = P##_mul_ps(P##_mul_ps(p_, s1_), s2_);                                                                    \
    } while (0)

/* exp(x) for eight lanes (LR_EXP) */
static inline __m256 exp8(__m256 x) {
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365f), _CMP_LT_OQ);
    __m256 y;
    LR_EXP(_mm256, 256, _mm256_round_ps, x, y);
    return _mm256_andnot_ps(under, y);
}
#endif

/* y = w * (x * 1 / sqrt(mean(x^2) + eps)); the sum of squares in eight lanes over features in
 * order, then a fixed tree (one chain where D % 8 != 0) */
static void rms_row(const float *x, const float *w, int64_t D, float eps, float *y) {
    float ss = 0.0f;
#ifdef LR_VEC
    if (D % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < D; i += 8) {
            const __m256 v = _mm256_loadu_ps(x + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        ss = hsum8(acc);
    } else
#endif
        for (int64_t i = 0; i < D; i++) ss = fmaf(x[i], x[i], ss);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = 0; i < D; i++) y[i] = w[i] * (x[i] * inv);
}

#ifdef LR_V512
/* exp(x) for sixteen lanes (LR_EXP): each lane's value is exp8's, bit for bit */
static inline __m512 exp16(__m512 x) {
    const __mmask16 under = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365f), _CMP_LT_OQ);
    __m512 y;
    LR_EXP(_mm512, 512, _mm512_roundscale_ps, x, y);
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}
#endif

/* a = SiLU(g) * u over F features: sixteen lanes at a time where the build has them, then eight,
 * then one; a lane's value is the same in each (exp16 is exp8 lane by lane) */
#define LR_SILU(P, L, EXP)                                                                              \
    for (; i + L <= F; i += L) {                                                                        \
        const __typeof__(EXP(P##_setzero_ps())) gv = P##_loadu_ps(g + i);                              \
        const __typeof__(gv) den = P##_add_ps(P##_set1_ps(1.0f), EXP(P##_sub_ps(P##_setzero_ps(), gv))); \
        P##_storeu_ps(a + i, P##_mul_ps(P##_div_ps(gv, den), P##_loadu_ps(u + i)));                    \
    }
static void silu_mul(const float *g, const float *u, float *a, int64_t F) {
    int64_t i = 0;
#ifdef LR_V512
    LR_SILU(_mm512, 16, exp16)
#endif
#ifdef LR_VEC
    LR_SILU(_mm256, 8, exp8)
#endif
    for (; i < F; i++) a[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
}

/* silu_mul over rows [t0, t1) of a pass's gate/up products (gu: T x 2F) into act (T x F), the
 * rows shared out over the pool's threads: at 16 rows the loop on one thread was ~0.25 ms of a
 * ~7 ms bf16 verify pass while the other core waited. Each row's bits are silu_mul's. */
typedef struct {
    const float *gu;
    float *act;
    int64_t F;
} silu_job;

static void silu_part(void *ctx, pool_region *region) {
    const silu_job *J = (const silu_job *)ctx;
    int64_t t0, t1;
    while (pool_claim(region, &t0, &t1))
        for (int64_t t = t0; t < t1; t++) silu_mul(J->gu + t * 2 * J->F, J->gu + t * 2 * J->F + J->F, J->act + t * J->F, J->F);
}

/* rotate-half RoPE on the first R features of one head vector, in place */
static void rope_head(float *v, const float *cos, const float *sin, int64_t R) {
    const int64_t h = R / 2;
    for (int64_t i = 0; i < h; i++) {
        const float a = v[i], b = v[i + h];
        v[i] = a * cos[i] + (-b) * sin[i];
        v[i + h] = b * cos[i + h] + a * sin[i + h];
    }
}

/* dot product over E features: eight lanes (E % 8 == 0) or one chain; either way a fixed order */
static inline float dot(const float *a, const float *b, int64_t E) {
#ifdef LR_VEC
    if (E % 8 == 0) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < E; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
        float t[8];
        _mm256_storeu_ps(t, acc);
        return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
    }
#endif
    float s = 0.0f;
    for (int64_t i = 0; i < E; i++) s = fmaf(a[i], b[i], s);
    return s;
}

/* o += p * v over E features (elementwise, so no order question) */
static inline void axpy(float p, const float *v, float *o, int64_t E) {
    for (int64_t i = 0; i < E; i++) o[i] = fmaf(p, v[i], o[i]);
}

#ifdef LR_VEC
/* eight cached K or V features from element i: fp32, or bf16 (bf = 1; exact widening, the bits
 * shifted into the high half) */
static inline __attribute__((always_inline)) __m256 kv8(const void *base, int64_t i, const int bf) {
    if (bf)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i))), 16));
    return _mm256_loadu_ps((const float *)base + i);
}

/* the largest of vmax's eight lanes, in every lane */
static inline __m256 max8(__m256 vmax) {
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    return _mm256_set1_ps(_mm_cvtss_f32(m4));
}

/* a query's c kept scores sg[0, c) -> e^(s - mx) in place (padded with zeros to a multiple of 8),
 * summed in eight lanes over the keys in order, then the fixed tree; returns 1 / the sum */
static inline float exp_in_place(float *sg, int64_t c, __m256 mx) {
    for (int64_t j = c; j < ((c + 7) & ~(int64_t)7); j++) sg[j] = -INFINITY;
    __m256 vsum = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < c; j0 += 8) {
        const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + j0), mx));
        vsum = _mm256_add_ps(vsum, e);
        _mm256_storeu_ps(sg + j0, e);
    }
    return 1.0f / hsum8(vsum);
}

#define GQ 24 /* most queries attend_group takes at once */
/* attend_row (below: what one head computes, and why its bits depend on nothing else) for ng <= GQ
 * queries that share a KV head (GQA): query g at q[g], its mask row mrow[g] (NULL: sees every key),
 * its output at out[g]; the heads of one row or of several rows. Each query runs the same
 * operations in the same order as alone (attend_row is this code with ng = 1); only the loops are
 * interchanged: a block of 8 keys (then of 16 values) is read once from the cache and used by
 * every query while it sits in L1, where one query at a time streamed the whole K and V from L2
 * (an 8-row pass's value loop ran at L2's bandwidth). s and idx hold ng x ss scratch,
 * ss >= end + 8. E % 8 == 0, E <= 128. */
static inline __attribute__((always_inline)) void attend_group_nv(const int64_t nv, const int bf, const float *const *q, int ng,
                                                                   const void *Kc, const void *Vc, const uint8_t *const *mrow, int64_t end,
                                                                   int64_t E, float scale, float *s, int32_t *idx, int64_t ss,
                                                                   float *const *out) {
    const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax[GQ];
    for (int g = 0; g < ng; g++) vmax[g] = ninf;
    float kbuf[8 * 128] __attribute__((aligned(32))); /* bf16 cache: the block's 8 keys widened once for all queries */
    for (int64_t j0 = 0; j0 < end; j0 += 8) {
        const float *Kb = bf ? kbuf : (const float *)Kc + j0 * E; /* key j0 + k at Kb + k E */
        if (bf)
            for (int64_t k = 0; k < 8 && j0 + k < end; k++)
                for (int64_t c = 0; c < nv; c++) _mm256_store_ps(kbuf + k * E + 8 * c, kv8(Kc, (j0 + k) * E + 8 * c, 1));
        __m256 vkeep = _mm256_setzero_ps();
        for (int g = 0; g < ng; g++) {
            if (g == 0 || mrow[g] != mrow[g - 1]) { /* a row's heads are adjacent and share its mask */
                float keep[8];
                for (int k = 0; k < 8; k++) keep[k] = (j0 + k < end && (!mrow[g] || mrow[g][j0 + k])) ? 0.0f : -INFINITY;
                vkeep = _mm256_loadu_ps(keep);
            }
            __m256 qv[16];
            for (int64_t c = 0; c < nv; c++) qv[c] = _mm256_loadu_ps(q[g] + 8 * c);
            /* key k's products summed over the features in order (one chain a key), then the eight
             * keys' lanes in a fixed tree of hadds; each pair is folded as soon as it is done so
             * that the query and two chains stay in registers */
            __m256 pair[4];
            for (int k2 = 0; k2 < 4; k2++) {
                __m256 a0 = _mm256_setzero_ps(), a1 = a0;
                const int64_t j = j0 + 2 * k2;
                if (j < end)
                    for (int64_t c = 0; c < nv; c++) a0 = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(Kb + 2 * k2 * E + 8 * c), a0);
                if (j + 1 < end)
                    for (int64_t c = 0; c < nv; c++) a1 = _mm256_fmadd_ps(qv[c], _mm256_loadu_ps(Kb + (2 * k2 + 1) * E + 8 * c), a1);
                pair[k2] = _mm256_hadd_ps(a0, a1);
            }
            const __m256 s0123 = _mm256_hadd_ps(pair[0], pair[1]);
            const __m256 s4567 = _mm256_hadd_ps(pair[2], pair[3]);
            __m256 sc = _mm256_mul_ps(_mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31)), vscale);
            sc = _mm256_add_ps(sc, vkeep);
            vmax[g] = _mm256_max_ps(vmax[g], sc);
            _mm256_storeu_ps(s + g * ss + j0, sc);
        }
    }
    int64_t n[GQ], nmax = 0;
    float inv[GQ];
    for (int g = 0; g < ng; g++) {
        float *sg = s + g * ss;
        int32_t *ig = idx + g * ss;
        int64_t c = 0;
        for (int64_t j = 0; j < end; j++)
            if (sg[j] != -INFINITY) { sg[c] = sg[j]; ig[c++] = (int32_t)j; }
        inv[g] = exp_in_place(sg, c, max8(vmax[g]));
        n[g] = c;
        nmax = c > nmax ? c : nmax;
    }
    for (int64_t c0 = 0; c0 < nv; c0 += 8) { /* value sums, 64 features at a time in registers */
        const int64_t nc = nv - c0 < 8 ? nv - c0 : 8;
        float held[GQ][64]; /* each head's running sums between key blocks (stored and reloaded: exact) */
        for (int g = 0; g < ng; g++) memset(held[g], 0, sizeof held[g]);
        float vbuf[16 * 64] __attribute__((aligned(32))); /* bf16 cache, several queries: rows t0.. widened once */
        for (int64_t t0 = 0; t0 < nmax; t0 += 16) {
            const int64_t tb = t0 + 16 < nmax ? t0 + 16 : nmax;
            if (bf && ng > 1)
                for (int64_t t = t0; t < tb; t++)
                    for (int64_t c = 0; c < nc; c++) _mm256_store_ps(vbuf + (t - t0) * 64 + 8 * c, kv8(Vc, t * E + 8 * (c0 + c), 1));
            for (int g = 0; g < ng; g++) {
                const int64_t t1 = t0 + 16 < n[g] ? t0 + 16 : n[g];
                if (t0 >= t1) continue;
                const float *sg = s + g * ss;
                const int32_t *ig = idx + g * ss;
                __m256 o[8];
                for (int64_t c = 0; c < nc; c++) o[c] = _mm256_loadu_ps(held[g] + 8 * c);
                /* the widened block serves a query whose keys here are rows t0..t1 themselves (ig is
                 * increasing: its ends decide); a tree row's own keys past them read the cache */
                if (bf && ng > 1 && ig[t0] == t0 && ig[t1 - 1] == t1 - 1) {
                    for (int64_t t = t0; t < t1; t++) {
                        const __m256 pj = _mm256_set1_ps(sg[t]);
                        for (int64_t c = 0; c < nc; c++) o[c] = _mm256_fmadd_ps(pj, _mm256_load_ps(vbuf + (t - t0) * 64 + 8 * c), o[c]);
                    }
                } else {
                    for (int64_t t = t0; t < t1; t++) {
                        const __m256 pj = _mm256_set1_ps(sg[t]);
                        const int64_t vr = (int64_t)ig[t] * E + 8 * c0;
                        for (int64_t c = 0; c < nc; c++) o[c] = _mm256_fmadd_ps(pj, kv8(Vc, vr + 8 * c, bf), o[c]);
                    }
                }
                for (int64_t c = 0; c < nc; c++) _mm256_storeu_ps(held[g] + 8 * c, o[c]);
            }
        }
        for (int g = 0; g < ng; g++) {
            const __m256 vinv = _mm256_set1_ps(inv[g]);
            for (int64_t c = 0; c < nc; c++)
                _mm256_storeu_ps(out[g] + 8 * (c0 + c), _mm256_mul_ps(_mm256_loadu_ps(held[g] + 8 * c), vinv));
        }
    }
}

#ifdef LR_V512
/* attend_group_nv in 512-bit registers (E % 16 == 0): every value goes through the same operations
 * in the same order as there, so a row's bits are the AVX2 build's.
 * - scores: two keys a register (key 2p in lanes 0-7, key 2p + 1 in lanes 8-15; the block's keys
 *   copied once, paired, for all the queries), each lane's product chain over the features in
 *   order as before, then the halves folded by the same tree of hadds;
 * - the keys a query sees compacted sixteen at a time (register compress: the same order);
 * - value sums sixteen features a register (elementwise: the same chains over keys). */
static inline __attribute__((always_inline)) __m512 kv16x(const void *base, int64_t i, const int bf) {
    if (bf)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)base + i))), 16));
    return _mm512_loadu_ps((const float *)base + i);
}

/* a query's scores sg[0, end) -> the kept ones (not -inf) in order at sg[0, c), their keys' indices
 * at ig[0, c); returns c. In place: a block is loaded before anything is stored over it, and the
 * 16-lane stores end at or before the block's end (c <= j). */
static inline int64_t compact_kept(float *sg, int32_t *ig, int64_t end) {
    const __m512 ninf16 = _mm512_set1_ps(-INFINITY);
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    int64_t c = 0, j = 0;
    for (; j + 16 <= end; j += 16) {
        const __m512 v = _mm512_loadu_ps(sg + j);
        const __mmask16 keep = _mm512_cmp_ps_mask(v, ninf16, _CMP_NEQ_UQ);
        _mm512_storeu_ps(sg + c, _mm512_maskz_compress_ps(keep, v));
        _mm512_storeu_si512(ig + c, _mm512_maskz_compress_epi32(keep, _mm512_add_epi32(iota, _mm512_set1_epi32((int)j))));
        c += __builtin_popcount((unsigned)keep);
    }
    for (; j < end; j++)
        if (sg[j] != -INFINITY) { sg[c] = sg[j]; ig[c++] = (int32_t)j; }
    return c;
}

static inline __attribute__((always_inline)) void attend_group_nv512(const int64_t nv, const int bf, const float *const *q, int ng,
                                                                      const void *Kc, const void *Vc, const uint8_t *const *mrow, int64_t end,
                                                                      int64_t E, float scale, float *s, int32_t *idx, int64_t ss,
                                                                      float *const *out) {
    const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    __m256 vmax[GQ];
    for (int g = 0; g < ng; g++) vmax[g] = ninf;
    /* the block's 8 keys as 4 pairs: pair p, feature chunk c at kp + (p nv + c) 16 (key 2p's 8
     * features, then key 2p + 1's); keys past the end are zeros (their lanes are masked) */
    float kp[4 * 16 * 16] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < end; j0 += 8) {
        for (int64_t k = 0; k < 8; k++) {
            float *dst = kp + (k >> 1) * nv * 16 + (k & 1) * 8;
            if (j0 + k < end)
                for (int64_t c = 0; c < nv; c++) _mm256_store_ps(dst + c * 16, kv8(Kc, (j0 + k) * E + 8 * c, bf));
            else
                for (int64_t c = 0; c < nv; c++) _mm256_store_ps(dst + c * 16, _mm256_setzero_ps());
        }
        __m256 vkeep = _mm256_setzero_ps();
        for (int g = 0; g < ng; g++) {
            if (g == 0 || mrow[g] != mrow[g - 1]) {
                float keep[8];
                for (int k = 0; k < 8; k++) keep[k] = (j0 + k < end && (!mrow[g] || mrow[g][j0 + k])) ? 0.0f : -INFINITY;
                vkeep = _mm256_loadu_ps(keep);
            }
            __m512 qv[16];
            for (int64_t c = 0; c < nv; c++) qv[c] = _mm512_broadcast_f32x8(_mm256_loadu_ps(q[g] + 8 * c));
            __m256 pair[4];
            for (int p = 0; p < 4; p++) {
                __m512 a = _mm512_setzero_ps();
                if (j0 + 2 * p < end)
                    for (int64_t c = 0; c < nv; c++) a = _mm512_fmadd_ps(qv[c], _mm512_load_ps(kp + (p * nv + c) * 16), a);
                pair[p] = _mm256_hadd_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
            }
            const __m256 s0123 = _mm256_hadd_ps(pair[0], pair[1]);
            const __m256 s4567 = _mm256_hadd_ps(pair[2], pair[3]);
            __m256 sc = _mm256_mul_ps(_mm256_add_ps(_mm256_permute2f128_ps(s0123, s4567, 0x20), _mm256_permute2f128_ps(s0123, s4567, 0x31)), vscale);
            sc = _mm256_add_ps(sc, vkeep);
            vmax[g] = _mm256_max_ps(vmax[g], sc);
            _mm256_storeu_ps(s + g * ss + j0, sc);
        }
    }
    int64_t n[GQ], nmax = 0;
    float inv[GQ];
    for (int g = 0; g < ng; g++) {
        float *sg = s + g * ss;
        const int64_t c = compact_kept(sg, idx + g * ss, end);
        inv[g] = exp_in_place(sg, c, max8(vmax[g]));
        n[g] = c;
        nmax = c > nmax ? c : nmax;
    }
    for (int64_t c0 = 0; c0 < nv; c0 += 8) { /* value sums, 64 features at a time in registers */
        const int64_t nc = (nv - c0 < 8 ? nv - c0 : 8) / 2; /* 16-feature registers */
        float held[GQ][64] __attribute__((aligned(64)));
        for (int g = 0; g < ng; g++) memset(held[g], 0, sizeof held[g]);
        float vbuf[16 * 64] __attribute__((aligned(64)));
        for (int64_t t0 = 0; t0 < nmax; t0 += 16) {
            const int64_t tb = t0 + 16 < nmax ? t0 + 16 : nmax;
            if (ng > 1)
                for (int64_t t = t0; t < tb; t++)
                    for (int64_t c = 0; c < nc; c++) _mm512_store_ps(vbuf + (t - t0) * 64 + 16 * c, kv16x(Vc, t * E + 8 * c0 + 16 * c, bf));
            for (int g = 0; g < ng; g++) {
                const int64_t t1 = t0 + 16 < n[g] ? t0 + 16 : n[g];
                if (t0 >= t1) continue;
                const float *sg = s + g * ss;
                const int32_t *ig = idx + g * ss;
                __m512 o[4];
                for (int64_t c = 0; c < nc; c++) o[c] = _mm512_load_ps(held[g] + 16 * c);
                if (ng > 1 && ig[t0] == t0 && ig[t1 - 1] == t1 - 1) {
                    for (int64_t t = t0; t < t1; t++) {
                        const __m512 pj = _mm512_set1_ps(sg[t]);
                        for (int64_t c = 0; c < nc; c++) o[c] = _mm512_fmadd_ps(pj, _mm512_load_ps(vbuf + (t - t0) * 64 + 16 * c), o[c]);
                    }
                } else {
                    for (int64_t t = t0; t < t1; t++) {
                        const __m512 pj = _mm512_set1_ps(sg[t]);
                        const int64_t vr = (int64_t)ig[t] * E + 8 * c0;
                        for (int64_t c = 0; c < nc; c++) o[c] = _mm512_fmadd_ps(pj, kv16x(Vc, vr + 16 * c, bf), o[c]);
                    }
                }
                for (int64_t c = 0; c < nc; c++) _mm512_store_ps(held[g] + 16 * c, o[c]);
            }
        }
        for (int g = 0; g < ng; g++) {
            const __m512 vinv = _mm512_set1_ps(inv[g]);
            for (int64_t c = 0; c < nc; c++)
                _mm512_storeu_ps(out[g] + 8 * c0 + 16 * c, _mm512_mul_ps(_mm512_load_ps(held[g] + 16 * c), vinv));
        }
    }
}
#endif

/* E / 8 a compile-time constant for the common head sizes (SmolLM2: 64): the feature loops unroll
 * into registers instead of a chain of runtime bound checks and stack spills (the scores' loop
 * spent a third of its time there, perf, 8-row pass). Same operations in the same order. */
static void attend_group(const float *const *q, int ng, const void *Kc, const void *Vc, int bf, const uint8_t *const *mrow,
                         int64_t end, int64_t E, float scale, float *s, int32_t *idx, int64_t ss, float *const *out) {
#ifdef LR_V512
#define AG(NV, BF) attend_group_nv512(NV, BF, q, ng, Kc, Vc, mrow, end, E, scale, s, idx, ss, out)
    if (E == 64) { if (bf) AG(8, 1); else AG(8, 0); return; }
    if (E == 128) { if (bf) AG(16, 1); else AG(16, 0); return; }
    if (E % 16 == 0) { if (bf) AG(E / 8, 1); else AG(E / 8, 0); return; }
#undef AG
#endif
#define AG(NV, BF) attend_group_nv(NV, BF, q, ng, Kc, Vc, mrow, end, E, scale, s, idx, ss, out)
    if (E == 64) { if (bf) AG(8, 1); else AG(8, 0); }
    else if (E == 128) { if (bf) AG(16, 1); else AG(16, 0); }
    else if (bf) AG(E / 8, 1);
    else AG(E / 8, 0);
#undef AG
}
#endif

/* One query row of one head against keys [0, end) of its KV head (rows of E floats), keys with
 * mrow[j] == 0 left out (mrow NULL: none). Softmax(q . k * scale) weights, out = sum_j p_j v_j.
 *
 * A row's bits depend only on the row, its keys and which of them it sees, never on how many rows
 * ride in the pass or where its keys sit: the scores are eight-lane dot products reduced in a
 * fixed tree, the keys it sees are compacted in order before the lane sums of e^(s - max), and the
 * value sum runs over them in order. */
static void attend_row(const float *q, const void *Kv, const void *Vv, int bf, const uint8_t *mrow, int64_t end, int64_t E,
                       float scale, float *s, float *out) {
#ifdef LR_VEC
    if (E % 8 == 0 && E <= 128) { /* attend_group's code for one head: the same operations */
        attend_group(&q, 1, Kv, Vv, bf, &mrow, end, E, scale, s, (int32_t *)(s + end + 8), end + 8, &out);
        return;
    }
#endif
    (void)bf; /* a bf16 cache only with the vector path (llama_rows_f32 checks) */
    const float *Kc = (const float *)Kv, *Vc = (const float *)Vv;
    float mx = -INFINITY;
    for (int64_t j = 0; j < end; j++) {
        if (mrow && !mrow[j]) continue;
        s[j] = dot(q, Kc + j * E, E) * scale;
        if (s[j] > mx) mx = s[j];
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < end; j++) {
        if (mrow && !mrow[j]) continue;
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    const float inv = 1.0f / sum;
    memset(out, 0, sizeof(float) * (size_t)E);
    for (int64_t j = 0; j < end; j++) {
        if (mrow && !mrow[j]) continue;
        axpy(s[j] * inv, Vc + j * E, out, E);
    }
}

/* fp32 -> bf16, round to nearest even (torch's .to(torch.bfloat16) for every finite value; NaN
 * stays a NaN) */
static inline uint16_t to_bf16(float f) {
    uint32_t b;
    memcpy(&b, &f, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40);
    return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}
#ifdef LR_AMX
/* Attention on AMX-BF16 tiles (bf16 cache, E % 32 == 0, E <= 128), where the CPU's bf16 products
 * run on AMX too (bf16_rows_on_amx(); SPECCHAT_AMX_ATTN=0 keeps attend_group). Why: a 16-row
 * verify pass's attention ran ~23 cycles per query and key in attend_group's FMA chains (a 16-row
 * pass at 300 tokens of context 16.6 ms against 11.3 at 30, 2-core Xeon), where two tile products
 * per 16 keys x 16 queries do the scores and two per 32 keys the value sums.
 *
 * Numerics (one path per process, like the products): the queries and the softmax weights enter
 * as two bf16 halves each (bf16_split: hi + lo, each product taken for both) and the sums are the
 * tiles' own, so the bits differ from attend_group's, but a query's bits still
 * depend only on that query, its keys and which of them it sees, never on the other queries in the
 * tile or the pass, so a 1-token step and a verify pass agree:
 * - scores: C[key][query] += K[key] . q over 32-feature chunks in order; a key's score is its own
 *   tile element, whatever else rides in the tile; masked keys are -inf;
 * - the keys a query sees compacted in order (as attend_group does), e^(s - max) and their sum in
 *   sixteen lanes over the compacted keys, then a fixed tree (exp_in_place16);
 * - value sums over the compacted keys in blocks of 32 in order, each block one tile product per 16
 *   features into the query's row of the accumulator (a key past the query's count weighs an exact
 *   zero and reads a zero row), then times 1 / sum. A tree row's keys are gathered through its
 *   compacted order, so they sit where a chain's would. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} lr_tilecfg;

static void amx_attn_config(void) {
    lr_tilecfg c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) { c.colsb[t] = 64; c.rows[t] = 16; }
    _tile_loadconfig(&c);
}

/* 32 floats (a: the first 16) as two bf16 vectors, hi = bf16(x) and lo = bf16(x - hi), each to
 * nearest even (vcvtne2ps2bf16, denormals to zero): hi + lo carries ~16 of x's 24 bits, so the tile
 * products of both halves keep attention's inputs about as exact as the cache's bf16 K/V (bf16
 * queries and weights alone took SmolLM2's mean logit error against an fp32 pass from 0.037 to
 * 0.047; split, 0.040) */
static inline void bf16_split32(__m512 a, __m512 b, __m512i *hi, __m512i *lo) {
    const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
    const __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
    *hi = h;
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
}

/* exp_in_place in sixteen lanes: sg[0, c) -> e^(s - mx) in place (nothing written past c), summed
 * in sixteen lanes over the keys in order, then _mm512_reduce_add_ps's fixed tree; 1 / the sum */
static inline float exp_in_place16(float *sg, int64_t c, float mx) {
    const __m512 vmx = _mm512_set1_ps(mx);
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < c; j0 += 16) {
        const __mmask16 k = c - j0 >= 16 ? 0xffff : (__mmask16)((1u << (c - j0)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + j0), vmx))); /* exp8's value a lane */
        vsum = _mm512_add_ps(vsum, e);
        _mm512_mask_storeu_ps(sg + j0, k, e);
    }
    return 1.0f / _mm512_reduce_add_ps(vsum);
}

/* how many of a query's compacted keys sit at their own index (ig[t] == t): a prefix, as ig
 * increases strictly from ig[t] >= t */
static inline int64_t identity_prefix(const int32_t *ig, int64_t n) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (ig[mid] == mid) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* the A tiles of value block t0: queries g0 .. g0 + m - 1's weights e^(s - max) over its tn keys
 * (the rest zeros) as bf16 hi and lo halves; rows m.. stay as the caller zeroed them */
static inline void p_rows(uint16_t pb[2][16][32], const float *s, int64_t ss, int g0, int m, int64_t t0, int64_t tn) {
    const __mmask16 k0 = tn >= 16 ? 0xffff : (__mmask16)((1u << tn) - 1);
    const __mmask16 k1 = tn >= 32 ? 0xffff : tn <= 16 ? 0 : (__mmask16)((1u << (tn - 16)) - 1);
    for (int r = 0; r < m; r++) {
        const float *sg = s + (g0 + r) * ss + t0;
        __m512i h, l;
        bf16_split32(_mm512_maskz_loadu_ps(k0, sg), _mm512_maskz_loadu_ps(k1, sg + 16), &h, &l);
        _mm512_store_si512(pb[0][r], h);
        _mm512_store_si512(pb[1][r], l);
    }
}

/* nf B tiles (16 features each, from feature fh) of the V rows of compacted keys t0 .. t0 + 31:
 * tile f, row i holds keys 2i and 2i + 1's pairs (the even key low); keys at or past nn are zero
 * rows. ig NULL: key t is cache row t. */
static inline void v_tiles(uint32_t *vb, const uint16_t *V16, int64_t E, const int32_t *ig, int64_t t0, int64_t nn,
                           int64_t fh, int nf) {
    static const uint16_t zero_row[128] __attribute__((aligned(64))) = {0};
    const __m512i ilo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                         39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i ihi = _mm512_add_epi16(ilo, _mm512_set1_epi16(16));
    for (int i = 0; i < 16; i++) {
        const int64_t ta = t0 + 2 * i, tb = ta + 1;
        const uint16_t *ra = ta < nn ? V16 + (ig ? (int64_t)ig[ta] : ta) * E + fh : zero_row;
        const uint16_t *rb = tb < nn ? V16 + (ig ? (int64_t)ig[tb] : tb) * E + fh : zero_row;
        for (int p = 0; p < nf / 2; p++) {
            const __m512i a = _mm512_loadu_si512(ra + 32 * p), b = _mm512_loadu_si512(rb + 32 * p);
            _mm512_store_si512(vb + (2 * p) * 256 + 16 * i, _mm512_permutex2var_epi16(a, ilo, b));
            _mm512_store_si512(vb + (2 * p + 1) * 256 + 16 * i, _mm512_permutex2var_epi16(a, ihi, b));
        }
    }
}

/* the value sums' accumulators: tiles 0 .. nf - 1 (nf = 2 or 4: 32 or 64 features) */
static inline void amx_zero_acc(int nf) {
    _tile_zero(0);
    _tile_zero(1);
    if (nf > 2) { _tile_zero(2); _tile_zero(3); }
}

static inline void amx_load_acc(const float *a, int64_t E, int nf) {
    _tile_loadd(0, a, E * 4);
    _tile_loadd(1, a + 16, E * 4);
    if (nf > 2) { _tile_loadd(2, a + 32, E * 4); _tile_loadd(3, a + 48, E * 4); }
}

static inline void amx_store_acc(int f, float ob[16][16]) {
    if (f == 0) _tile_stored(0, ob, 64);
    else if (f == 1) _tile_stored(1, ob, 64);
    else if (f == 2) _tile_stored(2, ob, 64);
    else _tile_stored(3, ob, 64);
}

/* accumulators += P (hi, then lo) . V over one block of 32 keys, nf feature tiles at vb */
static inline void amx_accumulate(uint16_t pb[2][16][32], const uint32_t *vb, int nf) {
    _tile_loadd(4, pb[0], 64);
    _tile_loadd(7, pb[1], 64);
    _tile_loadd(5, vb, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(0, 7, 5);
    _tile_loadd(6, vb + 256, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(1, 7, 6);
    if (nf > 2) {
        _tile_loadd(5, vb + 512, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_dpbf16ps(2, 7, 5);
        _tile_loadd(6, vb + 768, 64);
        _tile_dpbf16ps(3, 4, 6);
        _tile_dpbf16ps(3, 7, 6);
    }
}

static void attend_group_amx(const float *const *q, int ng, const void *Kc, const void *Vc, const uint8_t *const *mrow,
                             int64_t end, int64_t E, float scale, float *s, int32_t *idx, int64_t ss, float *xs,
                             float *const *out) {
    const int nfc = (int)(E / 32), nqt = (ng + 15) / 16;
    /* the queries as B tiles: tile (qt, c) row i, column n = query 16 qt + n's features 32c + 2i, +1 */
    uint16_t qb[2][2][4][16][16][2] __attribute__((aligned(64))); /* [hi, lo][qt][c][i][n][pair] */
    for (int h = 0; h < 2; h++)
        for (int qt = 0; qt < nqt; qt++) memset(qb[h][qt], 0, sizeof qb[0][0][0] * (size_t)nfc);
    const __m512i rows16 = _mm512_set_epi32(240, 224, 208, 192, 176, 160, 144, 128, 112, 96, 80, 64, 48, 32, 16, 0);
    for (int g = 0; g < ng; g++)
        for (int c = 0; c < nfc; c++) { /* the chunk's 16 pairs down column g % 16 */
            __m512i h, l;
            bf16_split32(_mm512_loadu_ps(q[g] + 32 * c), _mm512_loadu_ps(q[g] + 32 * c + 16), &h, &l);
            _mm512_i32scatter_epi32((uint32_t *)qb[0][g / 16][c] + g % 16, rows16, h, 4);
            _mm512_i32scatter_epi32((uint32_t *)qb[1][g / 16][c] + g % 16, rows16, l, 4);
        }
    uint16_t kpad[16 * 128] __attribute__((aligned(64)));
    float sb[16][16] __attribute__((aligned(64)));
    const __m512 vscale = _mm512_set1_ps(scale), ninf16 = _mm512_set1_ps(-INFINITY);
    __m512 vmx[GQ];
    for (int g = 0; g < ng; g++) vmx[g] = ninf16;
    const uint16_t *K16 = (const uint16_t *)Kc, *V16 = (const uint16_t *)Vc;
    for (int64_t j0 = 0; j0 < end; j0 += 16) {
        const int64_t kn = end - j0 < 16 ? end - j0 : 16;
        const uint16_t *Kb = K16 + j0 * E;
        /* the block two ahead on its way: a layer's cache is not in L2 when its turn comes (every
         * layer's keys and values at a few hundred tokens of context exceed it), and a tile load
         * that waits on memory holds up the products behind it */
        if (j0 + 32 < end)
            for (int64_t l = 0; l < 16 * E * 2; l += 64) _mm_prefetch((const char *)(K16 + (j0 + 32) * E) + l, _MM_HINT_T0);
        if (kn < 16) { /* the last block: its keys, then zero rows (never past the cache's end) */
            memset(kpad, 0, sizeof(uint16_t) * 16 * (size_t)E);
            memcpy(kpad, Kb, sizeof(uint16_t) * (size_t)(kn * E));
            Kb = kpad;
        }
        _tile_zero(0);
        if (nqt > 1) _tile_zero(1);
        for (int c = 0; c < nfc; c++) {
            _tile_loadd(2, Kb + 32 * c, E * 2);
            _tile_loadd(3, qb[0][0][c], 64);
            _tile_dpbf16ps(0, 2, 3);
            _tile_loadd(4, qb[1][0][c], 64);
            _tile_dpbf16ps(0, 2, 4);
            if (nqt > 1) {
                _tile_loadd(3, qb[0][1][c], 64);
                _tile_dpbf16ps(1, 2, 3);
                _tile_loadd(4, qb[1][1][c], 64);
                _tile_dpbf16ps(1, 2, 4);
            }
        }
        for (int qt = 0; qt < nqt; qt++) {
            if (qt == 0) _tile_stored(0, sb, 64);
            else _tile_stored(1, sb, 64);
            const int nq = ng - 16 * qt < 16 ? ng - 16 * qt : 16;
            const __mmask16 valid = kn == 16 ? 0xffff : (__mmask16)((1u << kn) - 1);
            for (int n = 0; n < nq; n++) { /* query n's column: its 16 keys' scores, masked ones -inf */
                const int g = 16 * qt + n;
                __mmask16 seen = valid;
                if (mrow[g]) seen = _mm_mask_cmpneq_epi8_mask(valid, _mm_maskz_loadu_epi8(valid, mrow[g] + j0), _mm_setzero_si128());
                const __m512 v = _mm512_mask_blend_ps(seen, ninf16, _mm512_mul_ps(_mm512_i32gather_ps(rows16, &sb[0][n], 4), vscale));
                _mm512_mask_storeu_ps(s + g * ss + j0, valid, v);
                vmx[g] = _mm512_max_ps(vmx[g], v);
            }
        }
    }
    int64_t n[GQ];
    float inv[GQ];
    for (int g = 0; g < ng; g++) { /* attend_group_nv512's compaction; the exponentials in 16 lanes */
        float *sg = s + g * ss;
        const int64_t c = compact_kept(sg, idx + g * ss, end);
        inv[g] = exp_in_place16(sg, c, _mm512_reduce_max_ps(vmx[g]));
        n[g] = c;
    }
    /* value sums. The blocks every query reads in the cache's own order (the committed prefix:
     * every row of a pass sees it all) are gathered once into V tiles for all the queries, up to 16
     * a tile; the rest per set of queries that see the same keys (a row's heads; every query
     * without a mask), their rows' accumulators carried over exactly (stored fp32, reloaded). Either
     * way a query's sums run over its compacted keys block by block in order. */
    const int nc16 = (int)(E / 16);
    int64_t pre = end;
    for (int g = 0; g < ng; g++) {
        const int64_t L = identity_prefix(idx + g * ss, n[g]);
        pre = L < pre ? L : pre;
    }
    pre &= ~(int64_t)31;
    uint32_t *vsh = (uint32_t *)xs;                     /* pre / 32 blocks x nc16 tiles of 256 pairs */
    float *acc = xs + (pre / 32) * nc16 * 256;           /* (ng + 16) x E: each query's sums after the prefix */
    uint16_t pb[2][16][32] __attribute__((aligned(64))); /* the weights' hi and lo halves (bf16_split32) */
    uint32_t vb[4][256] __attribute__((aligned(64)));     /* a set's B tiles: 16 key pairs x 16 features */
    float ob[16][16] __attribute__((aligned(64)));
    if (pre > 0) {
        for (int64_t b = 0; b < pre / 32; b++) v_tiles(vsh + b * nc16 * 256, V16, E, NULL, 32 * b, pre, 0, nc16);
        memset(acc + (int64_t)ng * E, 0, sizeof(float) * 16 * (size_t)E);
        for (int q0 = 0; q0 < ng; q0 += 16) {
            const int mq = ng - q0 < 16 ? ng - q0 : 16;
            memset(pb, 0, sizeof pb);
            for (int64_t fh = 0; fh < E; fh += 64) {
                const int nf = (int)((E - fh < 64 ? E - fh : 64) / 16); /* 2 or 4 accumulator tiles */
                amx_zero_acc(nf);
                for (int64_t b = 0; b < pre / 32; b++) {
                    p_rows(pb, s, ss, q0, mq, 32 * b, 32);
                    amx_accumulate(pb, vsh + (b * nc16 + fh / 16) * 256, nf);
                }
                for (int f = 0; f < nf; f++) {
                    amx_store_acc(f, ob);
                    for (int r = 0; r < mq; r++) memcpy(acc + (int64_t)(q0 + r) * E + fh + 16 * f, ob[r], sizeof ob[r]);
                }
            }
        }
    }
    for (int g0 = 0, g1; g0 < ng; g0 = g1) {
        for (g1 = g0 + 1; g1 < ng && g1 - g0 < 16 && mrow[g1] == mrow[g0] && n[g1] == n[g0]; g1++) {}
        const int m = g1 - g0;
        const int64_t nn = n[g0];
        const int32_t *ig = idx + g0 * ss;
        memset(pb, 0, sizeof pb);
        for (int64_t fh = 0; fh < E; fh += 64) {
            const int nf = (int)((E - fh < 64 ? E - fh : 64) / 16);
            if (pre > 0) amx_load_acc(acc + (int64_t)g0 * E + fh, E, nf); /* rows past the set: others' sums, left as they are */
            else amx_zero_acc(nf);
            for (int64_t t0 = pre; t0 < nn; t0 += 32) {
                p_rows(pb, s, ss, g0, m, t0, nn - t0 < 32 ? nn - t0 : 32);
                v_tiles(vb[0], V16, E, ig, t0, nn, fh, nf);
                amx_accumulate(pb, vb[0], nf);
            }
            for (int f = 0; f < nf; f++) {
                amx_store_acc(f, ob);
                for (int r = 0; r < m; r++) {
                    const __m512 vinv = _mm512_set1_ps(inv[g0 + r]);
                    _mm512_storeu_ps(out[g0 + r] + fh + 16 * f, _mm512_mul_ps(_mm512_load_ps(ob[r]), vinv));
                }
            }
        }
    }
}
#endif

/* A per-thread scratch of at least n floats, kept between calls and freed when its thread ends
 * (the app decodes each reply on a worker thread). */
typedef struct { size_t n; float *p; } kept_buf;
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;
static void buf_free(void *v) {
    kept_buf *b = (kept_buf *)v;
    free(b->p);
    free(b);
}
static void buf_init(void) { (void)pthread_key_create(&buf_key, buf_free); }
static float *pass_buffer(size_t n) {
    (void)pthread_once(&buf_once, buf_init);
    kept_buf *b = (kept_buf *)pthread_getspecific(buf_key);
    if (!b) {
        if (!(b = (kept_buf *)calloc(1, sizeof *b))) return NULL;
        if (pthread_setspecific(buf_key, b)) { free(b); return NULL; }
    }
    if (b->n < n) {
        free(b->p);
        b->p = (float *)malloc(sizeof(float) * n);
        b->n = b->p ? n : 0;
    }
    return b->p;
}

typedef struct {
    const float *qkv;
    const void *kc, *vc; /* this layer's cache, fp32 or bf16 (kv16) */
    int kv16;
    const uint8_t *mask;
    float *o;
    int64_t ldm, T, H, G, E, QKV, P, end;
    int64_t chunks; /* 0: an item is one (row, head); else an item is one KV head's G heads of the
                     * rows of one of `chunks` even row ranges (attend_group) */
    float scale;
    int amx; /* attend_group_amx (amx_attention) */
    atomic_int failed;
} att_job;

/* KV head k's rows of this layer's cache (base: A->kc or A->vc) */
static inline const void *kv_head(const att_job *A, const void *base, int64_t k) {
    return (const char *)base + k * A->P * A->E * (A->kv16 ? 2 : 4);
}

/* One past the last key any of rows [t0, t1) sees (the pass's end where there is no mask): the
 * keys after it are masked for every query of the group, so attend_group can stop there and give
 * the same bits (their scores would be -inf, left out before the max, the sums and the values). A
 * prefill chunk's early rows see only the first keys of the chunk: without it they scored every
 * key up to the chunk's end, twice the score work of a causal first chunk. */
static inline int64_t group_end(const att_job *A, int64_t t0, int64_t t1) {
    if (!A->mask) return A->end;
    int64_t e = 0;
    for (int64_t t = t0; t < t1; t++) {
        const uint8_t *m = A->mask + t * A->ldm;
        int64_t j = A->end;
        while (j > e && !m[j - 1]) j--;
        e = j > e ? j : e;
    }
    return e > 0 ? e : A->end;
}

/* one thread's part of a layer's attention items, claimed in chunks (engine/native/pool.c) */
static void att_part(void *ctx, pool_region *region) {
    att_job *A = (att_job *)ctx;
    int64_t a0, a1;
    if (!pool_claim(region, &a0, &a1)) return;
    const int64_t ss = (A->end + 15) & ~(int64_t)7;
    const int64_t nq = A->chunks ? ((A->T + A->chunks - 1) / A->chunks) * A->G : 1; /* most queries an item */
    /* scores and key indices (2 nq ss); with AMX its value scratch: the prefix's V tiles and the
     * queries' accumulators (attend_group_amx) */
    const int64_t xn = A->amx ? ((A->end + 31) / 32) * (A->E / 16) * 256 + (nq + 16) * A->E : 0;
    float *s = (float *)aligned_alloc(64, sizeof(float) * (size_t)(((2 * nq * ss + xn) + 15) & ~(int64_t)15));
    if (!s) {
        atomic_store(&A->failed, 1);
        while (pool_claim(region, &a0, &a1)) {} /* nobody computes these: the call fails */
        return;
    }
#ifdef LR_AMX
    if (A->amx) amx_attn_config();
#endif
    do for (int64_t th = a0; th < a1; th++) {
#ifdef LR_VEC
        if (A->chunks) {
            const int64_t KV = A->H / A->G, k = th % KV, c = th / KV;
            const int64_t t0 = c * A->T / A->chunks, t1 = (c + 1) * A->T / A->chunks;
            const float *qs[GQ];
            const uint8_t *ms[GQ];
            float *os[GQ];
            int ng = 0;
            for (int64_t t = t0; t < t1; t++)
                for (int64_t g = 0; g < A->G; g++, ng++) {
                    const int64_t hd = k * A->G + g;
                    qs[ng] = A->qkv + t * A->QKV + hd * A->E;
                    ms[ng] = A->mask ? A->mask + t * A->ldm : NULL;
                    os[ng] = A->o + t * A->H * A->E + hd * A->E;
                }
#ifdef LR_AMX
            if (A->amx) {
                attend_group_amx(qs, ng, kv_head(A, A->kc, k), kv_head(A, A->vc, k), ms, A->end, A->E, A->scale, s,
                                 (int32_t *)(s + ng * ss), ss, s + 2 * nq * ss, os);
                continue;
            }
#endif
            attend_group(qs, ng, kv_head(A, A->kc, k), kv_head(A, A->vc, k), A->kv16, ms, group_end(A, t0, t1), A->E, A->scale,
                         s, (int32_t *)(s + ng * ss), ss, os);
            continue;
        }
#endif
        const int64_t t = th / A->H, hd = th % A->H, k = hd / A->G;
#ifdef LR_AMX
        if (A->amx) {
            const float *q1 = A->qkv + t * A->QKV + hd * A->E;
            const uint8_t *m1 = A->mask ? A->mask + t * A->ldm : NULL;
            float *o1 = A->o + t * A->H * A->E + hd * A->E;
            attend_group_amx(&q1, 1, kv_head(A, A->kc, k), kv_head(A, A->vc, k), &m1, A->end, A->E, A->scale, s,
                             (int32_t *)(s + ss), ss, s + 2 * nq * ss, &o1);
            continue;
        }
#endif
        attend_row(A->qkv + t * A->QKV + hd * A->E, kv_head(A, A->kc, k), kv_head(A, A->vc, k), A->kv16,
                   A->mask ? A->mask + t * A->ldm : NULL, A->end, A->E, A->scale, s, A->o + t * A->H * A->E + hd * A->E);
    } while (pool_claim(region, &a0, &a1));
#ifdef LR_AMX
    if (A->amx) _tile_release();
#endif
    free(s);
}

/* 1 where a pass with a bf16 cache and head size E runs its attention on AMX tiles
 * (attend_group_amx): this build has them, E % 32 == 0 and E <= 128, the bf16 products run on AMX
 * (bf16_rows_on_amx: the tile state granted; SPECCHAT_BF16_PATH=avx512 turns both off) and
 * SPECCHAT_AMX_ATTN is not 0. Read once per process, like the products' path. */
int llama_rows_amx_attention(int64_t E) {
#ifdef LR_AMX
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("SPECCHAT_AMX_ATTN");
        on = bf16_rows_on_amx() && !(e && !strcmp(e, "0"));
    }
    return on && E % 32 == 0 && E <= 128;
#else
    (void)E;
    return 0;
#endif
}


/* 1 where a pass's attention runs grouped (attend_group: the query heads that share a KV head, of
 * several rows, read each K/V block once) for head size E and G query heads a KV head; else every
 * (row, head) streams its keys alone, which at long prefill chunks is slower than the torch pass's
 * batched attention (llama.py: such models prefill long chunks there) */
int llama_rows_grouped(int64_t E, int64_t G) {
#ifdef LR_VEC
    return E % 8 == 0 && E <= 128 && G > 1 && G <= GQ;
#else
    (void)E, (void)G;
    return 0;
#endif
}

/* 1 where llama_rows_f32 takes a bf16 cache (kv16): the vector attention, head sizes % 8 == 0, <= 128 */
int llama_rows_kv16_ok(int64_t E) {
#ifdef LR_VEC
    return E % 8 == 0 && E <= 128;
#else
    (void)E;
    return 0;
#endif
}

/* x (T, D) the residual stream, updated in place. cos/sin (T, R). mask (T, start + T) with row
 * stride ldm, nonzero = may attend, or NULL (every row sees rows [0, start + T)). The caches
 * kbase / vbase are (nlayers, KV, P, E), contiguous, fp32, or bf16 where kv16 (the q8 compute
 * type's cache: half the bytes a decode step reads, the new rows rounded to nearest even).
 * Returns 0, 1 if a buffer could not be allocated, 3 for a kv16 this build or E cannot take, or
 * the failing linear's code. */
int llama_rows_f32(float *x, int64_t T, int64_t D, int64_t H, int64_t KV, int64_t E, int64_t F, int64_t R,
                   const int64_t *layers, int64_t nlayers, void *kbase, void *vbase, int64_t P, int64_t start,
                   const float *cos, const float *sin,
                   const uint8_t *mask, int64_t ldm, float eps, float scale, int nthreads, int kv16) {
    const int64_t G = H / KV, QKV = (H + 2 * KV) * E, end = start + T;
    if (kv16 && !llama_rows_kv16_ok(E)) return 3;
    const int64_t es = kv16 ? 2 : 4; /* bytes a cached feature */
    const int amx = kv16 && llama_rows_amx_attention(E);
    if (nthreads < 1) nthreads = 1;
    const size_t n = (size_t)T * (size_t)(D + QKV + H * E + 2 * F + F + D);
    /* the pass's activations live in a per-thread buffer kept between calls: a fresh one past
     * glibc's mmap threshold (16 rows of SmolLM2 take 467 KB) was mapped and zero-filled by the
     * kernel on every call (clear_page was 9% of a 16-row verify's profile) */
    float *buf = pass_buffer(n);
    if (!buf) return 1;
    float *h = buf, *qkv = h + T * D, *o = qkv + T * QKV, *gu = o + T * H * E, *act = gu + T * 2 * F, *tmp = act + T * F;
    int rc = 0;
    for (int64_t l = 0; l < nlayers && !rc; l++) {
        const int64_t *L = layers + l * S_NSLOTS;
        const float *ln1 = (const float *)(intptr_t)L[S_LN1], *ln2 = (const float *)(intptr_t)L[S_LN2];
        char *kc = (char *)kbase + l * KV * P * E * es, *vc = (char *)vbase + l * KV * P * E * es;
        for (int64_t t = 0; t < T; t++) rms_row(x + t * D, ln1, D, eps, h + t * D);
        if ((rc = proj(h, T, D, L, S_WQKV, S_QQKV, S_BQKV, QKV, qkv, nthreads))) break;
        for (int64_t t = 0; t < T; t++) {
            float *row = qkv + t * QKV;
            for (int64_t hh = 0; hh < H + KV; hh++) rope_head(row + hh * E, cos + t * R, sin + t * R, R);
            for (int64_t k = 0; k < KV; k++) {
                const int64_t at = (k * P + start + t) * E;
                if (kv16) {
                    uint16_t *kd = (uint16_t *)kc + at, *vd = (uint16_t *)vc + at;
                    for (int64_t e = 0; e < E; e++) {
                        kd[e] = to_bf16(row[(H + k) * E + e]);
                        vd[e] = to_bf16(row[(H + KV + k) * E + e]);
                    }
                } else {
                    memcpy((float *)kc + at, row + (H + k) * E, sizeof(float) * (size_t)E);
                    memcpy((float *)vc + at, row + (H + KV + k) * E, sizeof(float) * (size_t)E);
                }
            }
        }
        /* the query heads that share a KV head, of as many rows as still leaves two items a thread,
         * go together (attend_group: the K and V blocks read once for all of them). Fewest row
         * ranges: an 8-row SmolLM2 verify runs 2 x 3 items of 4 rows x 3 heads. A 1-row step
         * groups too when every thread still gets an item (SmolLM2: 3 items for 2 threads): one
         * head an item read each KV head's cache once a head, which at long contexts cost more
         * than the uneven split (bench/ab_native.py --rows 1, 2-core AVX2 EPYC, bf16 cache:
         * 2,000 tokens of context 12.38 -> 10.77 ms, 600: 7.95 -> 7.58). */
        int64_t chunks = 0;
#ifdef LR_VEC
        if (llama_rows_grouped(E, G) && T * KV >= nthreads) {
            chunks = (2 * nthreads + KV - 1) / KV;
            const int64_t most = GQ / G; /* rows an item can hold */
            if (chunks < (T + most - 1) / most) chunks = (T + most - 1) / most;
            if (chunks > T) chunks = T;
        }
#endif
        att_job A = {qkv, kc, vc, kv16, mask, o, ldm, T, H, G, E, QKV, P, end, chunks, scale, amx, 0};
        const int64_t items = chunks ? KV * chunks : T * H;
        pool_run(T * H * end * E > 32768 ? nthreads : 1, items, items >= 8 * nthreads ? 2 : 1, att_part, &A);
        const int failed = atomic_load(&A.failed);
        if (failed) { rc = 1; break; }
        if ((rc = proj(o, T, H * E, L, S_WO, S_QO, S_BO, D, tmp, nthreads))) break;
        for (int64_t i = 0; i < T * D; i++) x[i] += tmp[i];
        for (int64_t t = 0; t < T; t++) rms_row(x + t * D, ln2, D, eps, h + t * D);
        if ((rc = proj(h, T, D, L, S_WGU, S_QGU, S_BGU, 2 * F, gu, nthreads))) break;
        silu_job SJ = {gu, act, F};
        pool_run(T >= 4 ? nthreads : 1, T, 1, silu_part, &SJ);
        if ((rc = proj(act, T, F, L, S_WD, S_QD, S_BD, D, tmp, nthreads))) break;
        for (int64_t i = 0; i < T * D; i++) x[i] += tmp[i];
    }
    return rc;
}
