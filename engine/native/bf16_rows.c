/* bf16-weight products with bf16-rounded activations and fp32 sums: the CPU `bf16` compute type's
 * products inside the C pass (engine/native/llama_rows.c; engine/models/llama.py `keep_bf16`).
 *
 * Why: through oneDNN a 1-row bf16 decode step of SmolLM2-135M streamed its 270 MB of weights at
 * ~20 GB/s (12-14 ms of products, bench/results/2026-11-27-session22 section 3) while the q8 C pass
 * streams its records at ~30 GB/s, and the torch pass spent the rest of a step between products.
 * Here the weights stream once per pass for up to eight rows at a time and each 64 bytes of them
 * feed one AVX-512 BF16 `vdpbf16ps` per row (32 multiply-adds).
 *
 * Numerics (what lossless is defined against for this compute type): a row x (fp32) is rounded to
 * bf16 (to nearest even, denormals to zero: `vcvtneps2bf16`), and every output is one chain over the
 * input pairs (2p, 2p + 1), p = 0 .. K/2 - 1 in order, started from zero:
 *
 *     acc = acc + x[2p + 1] w[2p + 1]   then   acc = acc + x[2p] w[2p]
 *
 * each a single rounding to nearest even (the bf16 products are exact in fp32) with denormal inputs
 * and results taken as zero, as `vdpbf16ps` does (checked bit for bit against this scalar form on
 * the Zen 4 EPYC: 3.2M random lanes, and the denormal cases); the bias is added last. A row's bits
 * depend on that row alone, whatever the row count, grouping or thread, so a 1-token decode step
 * and a k-token verify pass agree. SPECCHAT_BF16_PATH=scalar runs the scalar form (tests compare).
 *
 * Where the CPU has AMX-BF16 (and Linux grants the tile state) the products run on AMX's tiles
 * instead (the AMX section below; SPECCHAT_BF16_PATH=avx512 keeps the vector path): a 16-row verify
 * pass then costs about what a 1-row step does. Those sums round as the hardware rounds them, not
 * as the chain above, but a row's bits still depend on that row alone; one path runs per process,
 * so lossless holds on each.
 *
 * Where the CPU has AVX2 and FMA but no AVX-512 BF16 (Zen 2/3, Intel before Cooper Lake) the AVX2
 * section below runs the same chain as fp32 FMAs, bit for bit the scalar form's
 * (SPECCHAT_BF16_PATH=avx2 asks for it on any CPU with the instructions).
 *
 * Layout (engine/models/quant.py `pack_bf16`): per column block of 16 outputs, K/2 vectors of 64
 * bytes; in vector p, 32-bit lane j holds (w[2p][j], w[2p + 1][j]) as two bf16, the even input in
 * the low half (`vdpbf16ps`'s pair; 16 consecutive vectors are one AMX weight tile). Outputs past N
 * in the last block are zero.
 */
#define _DEFAULT_SOURCE /* syscall() under -std=c11 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "pool.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define BF_VEC 1
#endif
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define BF_AVX2_BUILD 1
#endif
#if defined(BF_VEC) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define BF_AMX_BUILD 1
#endif

#define JB 16
#define GMAX 8 /* rows per group (the scalar form's; the vector kernels' per block count: GMAX_B) */

/* the paths, slowest first (bf16_rows_path's values; engine/native/__init__.py `bf16_path` names them) */
enum { BF_SCALAR = 0, BF_AVX2 = 1, BF_AVX512 = 2, BF_AMX = 3 };

#ifdef BF_AMX_BUILD
/* Linux hands out AMX's tile data state only on request (arch_prctl ARCH_REQ_XCOMP_PERM for
 * XFEATURE_XTILEDATA, process-wide); without the grant the first tile instruction faults. */
static int amx_granted(void) { return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0; }
#endif

/* Which kernel runs: AMX's tile products where this build has them and the kernel grants the tile
 * state, else the AVX-512 BF16 one where the build has it, else the AVX2 one (the scalar form's
 * bits, in fp32 FMAs), else the scalar form; SPECCHAT_BF16_PATH=scalar / avx2 / avx512 / amx asks
 * for one (one not available here falls back in that order). Read once per process (tests switch
 * it in a child process); a first call racing on two threads computes the same value either way. */
static int bf_path(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("SPECCHAT_BF16_PATH");
        int want = BF_AMX;
        if (e && !strcmp(e, "scalar")) want = BF_SCALAR;
        else if (e && !strcmp(e, "avx2")) want = BF_AVX2;
        else if (e && !strcmp(e, "avx512")) want = BF_AVX512;
        int best = BF_SCALAR;
#ifdef BF_AVX2_BUILD
        if (want >= BF_AVX2) best = BF_AVX2;
#endif
#ifdef BF_VEC
        if (want >= BF_AVX512) best = BF_AVX512;
#endif
#ifdef BF_AMX_BUILD
        if (want == BF_AMX && amx_granted()) best = BF_AMX;
#endif
        v = best;
    }
    return v;
}

int bf16_rows_path(void) { return bf_path(); }

/* whether the bf16 products run on AMX here (llama_rows.c's attention follows them) */
int bf16_rows_on_amx(void) { return bf_path() == BF_AMX; }

static inline float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* fp32 -> bf16 as vcvtneps2bf16: to nearest even, denormals to signed zero, NaN quieted */
static inline uint16_t to_bf16_daz(float f) {
    const uint32_t u = f2u(f);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* a denormal as signed zero (vdpbf16ps's DAZ on its inputs and FTZ on each sum) */
static inline float daz(float f) {
    const uint32_t u = f2u(f);
    return (u & 0x7f800000u) == 0 ? u2f(u & 0x80000000u) : f;
}

static inline float bf(uint16_t h) { return daz(bf2f(h)); }

/* one row's bf16 activations as K/2 pairs (even input in the low half) */
static void convert_row(const float *x, int64_t K, uint32_t *xp) {
    int64_t i = 0;
#ifdef BF_VEC
    if (bf_path() >= BF_AVX512)
        for (; i + 32 <= K; i += 32) {
            /* cvtne2ps: the second operand's 16 values go to the low half */
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
            _mm512_storeu_si512((void *)(xp + i / 2), (__m512i)v);
        }
#endif
    for (; i < K; i += 2) xp[i / 2] = (uint32_t)to_bf16_daz(x[i]) | ((uint32_t)to_bf16_daz(x[i + 1]) << 16);
}

/* R rows of x as the AMX path reads them: each row's pairs as convert_row makes them, stored
 * chunk-major, chunk c (pairs 16c .. 16c + 15) of row r at xa + (c Rp + r) 16; rows R .. Rp - 1
 * (a row group's padding) zero. A tile of a group's rows at one chunk is then 1 KB in a run, where
 * row-major rows at K/2 pairs apart put it in 16 lines across the buffer (a 16-row pass's tile
 * loads were ~10% of its products' time). K % 32 == 0. */
static void amx_layout(const float *x, int64_t ldx, int64_t R, int64_t Rp, int64_t K, uint32_t *xa) {
    if (Rp == 1) { /* one row: chunk-major is row-major */
        convert_row(x, K, xa);
        return;
    }
    for (int64_t r = 0; r < Rp; r++)
        for (int64_t c = 0; c < K / 32; c++) {
            uint32_t *at = xa + (c * Rp + r) * JB;
            if (r < R) convert_row(x + r * ldx + 32 * c, 32, at);
            else memset(at, 0, sizeof(uint32_t) * JB);
        }
}

/* acc[g * 16 + j] = the chain of row r0 + g (g < G) over one column block (rec: K/2 vectors) */
static void rows_scalar(const uint32_t *xp, int64_t K, int64_t r0, int64_t G, const uint32_t *rec, float *acc) {
    const int64_t P = K / 2;
    for (int64_t g = 0; g < G; g++) {
        const uint32_t *xr = xp + (r0 + g) * P;
        for (int j = 0; j < JB; j++) {
            float a = 0.0f;
            for (int64_t p = 0; p < P; p++) {
                const uint32_t w = rec[p * JB + j], x = xr[p];
                a = daz(__builtin_fmaf(bf((uint16_t)(x >> 16)), bf((uint16_t)(w >> 16)), a));
                a = daz(__builtin_fmaf(bf((uint16_t)x), bf((uint16_t)w), a));
            }
            acc[g * JB + j] = a;
        }
    }
}

#ifdef BF_VEC
/* G rows x B column blocks (rec, rec + K/2 vectors, ...) at once: G B independent chains hide
 * vdpbf16ps's latency (one row of one block is a single chain of K/2 dependent multiply-adds, which
 * bound a 1-row pass below the memory's rate), and each weight vector and each row's broadcast
 * feed several of them. acc: B blocks of G x 16. Every chain is the same whatever G and B. */
static inline __attribute__((always_inline)) void rows_vec(const int G, const int B, const uint32_t *xp, int64_t K, int64_t r0,
                                                           const uint32_t *rec, float *acc) {
    const int64_t P = K / 2, stride = P * JB;
    __m512 a[24];
    const uint32_t *xr[8];
    for (int i = 0; i < G * B; i++) a[i] = _mm512_setzero_ps();
    for (int g = 0; g < G; g++) xr[g] = xp + (r0 + g) * P;
    for (int64_t p = 0; p < P; p++) {
        __m512bh w[8];
        for (int bb = 0; bb < B; bb++) {
            /* from 3 rows on, the next B blocks' line at this offset into L2: a pass of 3-8 rows
             * computes long enough per byte that B streams alone left the memory idle (SmolLM2's
             * products, 2 threads, interleaved: 4 rows 10.1 -> 8.7 ms, 8 rows 12.8 -> 10.0, 16 rows
             * 20.0 -> 15.4; at 1-2 rows, memory-bound with 8 streams, it cost ~10%). A prefetch past
             * the weights' end does not fault. */
            if (G > 2) _mm_prefetch((const char *)(rec + (B + bb) * stride + p * JB), _MM_HINT_T1);
            w[bb] = (__m512bh)_mm512_loadu_si512((const void *)(rec + bb * stride + p * JB));
        }
        for (int g = 0; g < G; g++) {
            const __m512bh v = (__m512bh)_mm512_set1_epi32((int)xr[g][p]);
            for (int bb = 0; bb < B; bb++) a[g * B + bb] = _mm512_dpbf16_ps(a[g * B + bb], v, w[bb]);
        }
    }
    for (int bb = 0; bb < B; bb++)
        for (int g = 0; g < G; g++) _mm512_storeu_ps(acc + (bb * G + g) * JB, a[g * B + bb]);
}

#define BF_GB(g, b) \
    static void vec_g##g##_b##b(const uint32_t *xp, int64_t K, int64_t r0, const uint32_t *rec, float *acc) { rows_vec(g, b, xp, K, r0, rec, acc); }
BF_GB(1, 1) BF_GB(2, 1) BF_GB(3, 1) BF_GB(4, 1) BF_GB(5, 1) BF_GB(6, 1) BF_GB(7, 1) BF_GB(8, 1)
BF_GB(1, 2) BF_GB(2, 2) BF_GB(3, 2) BF_GB(4, 2) BF_GB(5, 2) BF_GB(6, 2) BF_GB(7, 2) BF_GB(8, 2)
BF_GB(1, 4) BF_GB(2, 4) BF_GB(3, 4) BF_GB(4, 4) BF_GB(5, 4)
BF_GB(1, 8) BF_GB(2, 8)
typedef void (*bf_fn)(const uint32_t *, int64_t, int64_t, const uint32_t *, float *);
/* VEC[log2 B][G]; NULL where G x B does not fit the registers */
static const bf_fn VEC[4][9] = {
    {NULL, vec_g1_b1, vec_g2_b1, vec_g3_b1, vec_g4_b1, vec_g5_b1, vec_g6_b1, vec_g7_b1, vec_g8_b1},
    {NULL, vec_g1_b2, vec_g2_b2, vec_g3_b2, vec_g4_b2, vec_g5_b2, vec_g6_b2, vec_g7_b2, vec_g8_b2},
    {NULL, vec_g1_b4, vec_g2_b4, vec_g3_b4, vec_g4_b4, vec_g5_b4, NULL, NULL, NULL},
    {NULL, vec_g1_b8, vec_g2_b8, NULL, NULL, NULL, NULL, NULL, NULL},
};
static const int GMAX_B[4] = {8, 8, 5, 2}; /* rows a group at 1, 2, 4, 8 blocks */
#endif

#ifdef BF_AVX2_BUILD
/* The AVX2 path (SPECCHAT_BF16_PATH=avx2; the default where the CPU has AVX2 and FMA but neither
 * AVX-512 BF16 nor AMX, as Zen 2/3 and Intel before Cooper Lake): the scalar form's chain, each of
 * its steps one fp32 FMA, 8 outputs a register. Without it such CPUs ran `--dtype bf16` through
 * torch (oneDNN's bf16 products on AVX2), at a third of the C pass's speed.
 *
 * A record vector's 16 lanes are two 8-lane halves; a lane's odd weight as fp32 is its high half
 * (and 0xffff0000), its even one its low half shifted up 16. The activations come as fp32 (xf:
 * each pair's odd input, then its even one, bf16-rounded with denormals as zero, as the chain takes
 * them; pair-major, expand_row) and are broadcast. Denormal weights and results: bf_part sets
 * MXCSR's DAZ and FTZ around the kernel, so each FMA takes a denormal input as zero and flushes a denormal result,
 * the scalar form's daz() on both. (x86 decides a result is tiny after rounding it to 24 bits with
 * an unbounded exponent; the scalar form rounds to the denormal grid first: they differ only for a
 * sum within a quarter of an fp32 denormal ulp of the smallest normal, 2^-126.) One kernel per
 * row group: at >= 6 rows, groups of <= 5 over whole blocks beat groups of 8-10 over half blocks
 * (one sum a row, more chains in flight) at every size measured (session 34, alternated). */
static inline __attribute__((always_inline)) void rows_avx2(const int G, const int B, const float *xf, int64_t R, int64_t K,
                                                            int64_t r0, const uint32_t *rec, float *acc) {
    const int64_t P = K / 2, stride = P * JB;
    const __m256i hi = _mm256_set1_epi32((int)0xffff0000u);
    __m256 a[16];
    const float *x = xf + 2 * r0;
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) a[i] = _mm256_setzero_ps();
    for (int64_t p = 0; p < P; p++, x += 2 * R) {
#pragma GCC unroll 4
        for (int bb = 0; bb < B; bb++) {
            const uint32_t *v = rec + bb * stride + p * JB;
            if (G > 2) _mm_prefetch((const char *)(rec + (B + bb) * stride + p * JB), _MM_HINT_T1);
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)v), w1 = _mm256_loadu_si256((const __m256i *)(v + 8));
            const __m256 o0 = _mm256_castsi256_ps(_mm256_and_si256(w0, hi)), o1 = _mm256_castsi256_ps(_mm256_and_si256(w1, hi));
            const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(w0, 16)), e1 = _mm256_castsi256_ps(_mm256_slli_epi32(w1, 16));
#pragma GCC unroll 8
            for (int g = 0; g < G; g++) {
                const __m256 xo = _mm256_broadcast_ss(x + 2 * g), xe = _mm256_broadcast_ss(x + 2 * g + 1);
                const int c = 2 * (g * B + bb);
                a[c] = _mm256_fmadd_ps(xo, o0, a[c]);
                a[c + 1] = _mm256_fmadd_ps(xo, o1, a[c + 1]);
                a[c] = _mm256_fmadd_ps(xe, e0, a[c]);
                a[c + 1] = _mm256_fmadd_ps(xe, e1, a[c + 1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int bb = 0; bb < B; bb++)
#pragma GCC unroll 8
        for (int g = 0; g < G; g++) {
            _mm256_storeu_ps(acc + (bb * G + g) * JB, a[2 * (g * B + bb)]);
            _mm256_storeu_ps(acc + (bb * G + g) * JB + 8, a[2 * (g * B + bb) + 1]);
        }
}

typedef void (*a2_fn)(const float *, int64_t, int64_t, int64_t, const uint32_t *, float *);

#define BF_A2(g, b) \
    static void avx2_g##g##_b##b(const float *xf, int64_t R, int64_t K, int64_t r0, const uint32_t *rec, float *acc) { \
        rows_avx2(g, b, xf, R, K, r0, rec, acc); \
    }
BF_A2(1, 1) BF_A2(2, 1) BF_A2(3, 1) BF_A2(4, 1) BF_A2(5, 1)
BF_A2(1, 2) BF_A2(2, 2)
BF_A2(1, 4)
/* AVX2[log2 B][G]: 16 ymm registers hold 2 G B sums, a block's 4 weight vectors and a row's 2 inputs */
static const a2_fn AVX2[3][6] = {
    {NULL, avx2_g1_b1, avx2_g2_b1, avx2_g3_b1, avx2_g4_b1, avx2_g5_b1},
    {NULL, avx2_g1_b2, avx2_g2_b2, NULL, NULL, NULL},
    {NULL, avx2_g1_b4, NULL, NULL, NULL, NULL},
};
static const int GMAX_A2[3] = {5, 2, 1}; /* rows a group at 1, 2, 4 blocks */
static int a2_blocks_for(int64_t R) { return R <= 1 ? 2 : R <= 2 ? 1 : 0; }

/* row r (of R) of the activations as the AVX2 kernels take them, pair-major so that a row group's
 * inputs at pair p sit together (one pointer, constant offsets): xf[(p R + r) 2] the pair's odd
 * input, [.. + 1] its even one */
static void expand_row(const float *x, int64_t R, int64_t K, int64_t r, float *xf) {
    for (int64_t i = 0; i < K; i += 2) {
        xf[(i / 2 * R + r) * 2] = bf2f(to_bf16_daz(x[i + 1]));
        xf[(i / 2 * R + r) * 2 + 1] = bf2f(to_bf16_daz(x[i]));
    }
}
#endif

#ifdef BF_AMX_BUILD
/* The AMX path (SPECCHAT_BF16_PATH=amx, the default where the CPU has AMX-BF16 and Linux grants
 * the tile state): `tdpbf16ps` multiplies a tile of up to 16 rows x 16 input pairs by a 16 pairs x
 * 16 columns tile of the records above, which are already its pair-interleaved layout (16
 * consecutive vectors of a column block are one 1 KB tile). A pass streams each weight once for up
 * to 16 rows, as the vector path does for 8, but at ~16x the multiply-adds a cycle, so a 16-row
 * verify costs about what a 1-row step does where the vector path's products were compute-bound
 * (2-core Xeon with AMX, session 32). Numerics: each output is a chain over the K/32 tiles of the
 * input, started from zero, each tile's 32 products added as the hardware adds them: Intel does not
 * specify that rounding (it matches none of the one-rounding-per-product or per-pair chains in
 * fp32; checked on 0.5M random lanes), but it is deterministic and a row's bits depend on that row
 * alone (checked: any tile row count 1-16, any other rows), so a 1-token step and a k-token verify
 * agree on this path as on the others; one path runs per process. Matrices with K % 32 != 0 take
 * the vector path (per matrix, whatever the row count). */
#define AMX_NB 4 /* column blocks a step of one row group: C tiles 0-3, the rows' tile 4, weight tiles 5-7 */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) amx_cfg;

/* tiles 0-4 of `take` rows, 6-7 of 16 (weights), 5 of `take` rows for two row groups (a second
 * rows tile: amx_blocks2) else of 16 (a third weight tile: amx_blocks) */
static void amx_config(int take, int two) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = (uint8_t)(t >= 6 || (t == 5 && !two) ? 16 : take);
    }
    _tile_loadconfig(&c);
}

/* acc (B blocks of take x 16) = rows [r, r + take) of xp over blocks rec, rec + K/2 vectors, ...;
 * the tiles configured for `take` rows. The weights' lines are prefetched AMX_PD vectors (4 tiles)
 * ahead in each block's stream: tile loads alone left the memory idle (lm_head, 1 row: ~29 -> ~34
 * GB/s). */
#define AMX_PD 64
static inline void amx_zero_sums(void) { /* the C tiles 0-3 */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
}

static inline void amx_prefetch(const int B, const uint32_t *rec, int64_t stride, int64_t p) {
    for (int bb = 0; bb < B; bb++) {
        const char *f = (const char *)(rec + bb * stride + (p + AMX_PD) * JB);
        for (int l = 0; l < 16; l++) _mm_prefetch(f + 64 * l, _MM_HINT_T0);
    }
}

/* xa: the rows' pairs chunk-major (amx_layout): chunk c (16 pairs, one A tile's width) of row r at
 * xa + (c Rp + r) 16, so a tile's rows are one contiguous 1 KB run. dst: the sums' tiles stored
 * straight into y (row stride ldd floats) where the caller's rows, blocks and bias allow, else
 * into acc. */
static void amx_blocks(const int B, const uint32_t *xa, int64_t Rp, int64_t K, int64_t r, const uint32_t *rec, float *acc, int take,
                       float *dst, int64_t ldd) {
    const int64_t P = K / 2, stride = P * JB;
    const uint32_t *xr = xa + r * JB;
    amx_zero_sums();
    for (int64_t p = 0; p < P; p += 16) {
        amx_prefetch(B, rec, stride, p);
        _tile_loadd(4, xr + p * Rp, 64);
        _tile_loadd(5, rec + p * JB, 64);
        _tile_dpbf16ps(0, 4, 5);
        if (B > 1) {
            _tile_loadd(6, rec + stride + p * JB, 64);
            _tile_dpbf16ps(1, 4, 6);
        }
        if (B > 2) {
            _tile_loadd(7, rec + 2 * stride + p * JB, 64);
            _tile_dpbf16ps(2, 4, 7);
        }
        if (B > 3) {
            _tile_loadd(5, rec + 3 * stride + p * JB, 64);
            _tile_dpbf16ps(3, 4, 5);
        }
    }
    float *o = dst ? dst : acc;
    const int64_t ld = dst ? ldd * 4 : 64, step = dst ? JB : take * JB;
    _tile_stored(0, o, ld);
    if (B > 1) _tile_stored(1, o + step, ld);
    if (B > 2) _tile_stored(2, o + 2 * step, ld);
    if (B > 3) _tile_stored(3, o + 3 * step, ld);
}

/* Two row groups [r0, r0 + take) and [r1, r1 + take) x B <= 2 blocks: each weight tile loaded
 * once feeds both groups (C tiles 0-1: the first group, 2-3: the second; rows 4, 5; weights 6, 7).
 * acc: the first group's B blocks, then the second's (each take x 16). The same tile products per
 * row as amx_blocks. */
static void amx_blocks2(const int B, const uint32_t *xa, int64_t Rp, int64_t K, int64_t r0, int64_t r1, const uint32_t *rec,
                        float *acc, int take) {
    const int64_t P = K / 2, stride = P * JB;
    const uint32_t *x0 = xa + r0 * JB, *x1 = xa + r1 * JB;
    amx_zero_sums();
    for (int64_t p = 0; p < P; p += 16) {
        amx_prefetch(B, rec, stride, p);
        _tile_loadd(4, x0 + p * Rp, 64);
        _tile_loadd(5, x1 + p * Rp, 64);
        _tile_loadd(6, rec + p * JB, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(2, 5, 6);
        if (B > 1) {
            _tile_loadd(7, rec + stride + p * JB, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    _tile_stored(0, acc, 64);
    if (B > 1) _tile_stored(1, acc + take * JB, 64);
    _tile_stored(2, acc + B * take * JB, 64);
    if (B > 1) _tile_stored(3, acc + (B + 1) * take * JB, 64);
}
#endif

/* y rows [r, r + take) of column block b from acc (take x 16) */
static void put(float *y, const float *bias, const float *acc, int64_t N, int64_t b, int64_t r, int64_t take) {
    const int64_t j0 = b * JB, nj = N - j0 < JB ? N - j0 : JB;
    for (int64_t t = 0; t < take; t++) {
        float *yr = y + (r + t) * N + j0;
        if (bias) {
            for (int64_t j = 0; j < nj; j++) yr[j] = acc[t * JB + j] + bias[j0 + j];
        } else if (nj == JB) {
            memcpy(yr, acc + t * JB, sizeof(float) * JB); /* a fixed size: inlined as one vector move, not a libc call a row and block */
        } else {
            memcpy(yr, acc + t * JB, sizeof(float) * (size_t)nj);
        }
    }
}

typedef struct {
    const uint32_t *xp, *W;
    const float *bias;
    float *y;
    int64_t R, K, N;
    int amx; /* rows in tile groups of `take`: xp chunk-major (amx_layout) over Rp rows, the padding rows zero */
    int64_t take, Rp;
    const float *xf; /* the AVX2 path's activations (expand_row), else NULL */
    int64_t chunk;   /* the AVX2 path: rows a chunk (a2_chunk_rows); xf holds the chunks one after another */
} bf_job;

/* log2 of the blocks at once for a pass of R rows: 8 for 1-2 rows, 4 for 3-5, else 2 (row groups
 * of <= 8). Measured over SmolLM2-135M's weights streamed from memory (2 threads, Zen 4; session
 * 23): 1 row 10.4 -> 7.7-8.4 ms against 1-2 blocks (a row of a block is one chain of dependent
 * multiply-adds: more blocks, more chains in flight); at 16 rows 2 blocks x 8 rows beat 1 x 16
 * (16.6 vs 21.6 ms: every row's broadcast is a load) and 4 x 4 (16.5); a prefetch ahead in the same
 * streams did not pay, the next blocks' into L2 from 3 rows on does (rows_vec). */
static int blocks_for(int64_t R) { return R <= 2 ? 3 : R <= 5 ? 2 : 1; }

#ifdef BF_AMX_BUILD
static void bf_part_amx(const bf_job *J, pool_region *region) {
    const int64_t R = J->R, K = J->K, N = J->N, take = J->take;
    float acc[AMX_NB * 16 * JB] __attribute__((aligned(64)));
    int64_t b0, b1;
    const int two = R > take;
    int configured = 0;
    while (pool_claim(region, &b0, &b1)) {
        /* configured on every call: the configuration is thread state that other AMX code on the
         * thread (oneDNN's bf16 products, torch's drafter passes) replaces and releases */
        if (!configured) {
            amx_config((int)take, two);
            configured = 1;
        }
        for (int64_t b = b0; b < b1;) {
            const int B = b1 - b >= AMX_NB ? AMX_NB : (int)(b1 - b);
            const uint32_t *rec = J->W + b * (K / 2) * JB;
            if (R <= take) { /* one row group: four blocks a step */
                /* the sums straight into y where nothing is added and every column is y's: at 16
                 * rows the copy through acc was ~10% of the products' time */
                const int direct = !J->bias && (b + B) * JB <= N;
                amx_blocks(B, J->xp, J->Rp, K, 0, rec, acc, (int)take, direct ? J->y + b * JB : NULL, N);
                if (!direct)
                    for (int bb = 0; bb < B; bb++) put(J->y, J->bias, acc + bb * take * JB, N, b + bb, 0, R);
                b += B;
                continue;
            }
            const int B2 = B >= 2 ? 2 : 1; /* several row groups: two blocks a step, groups in pairs */
            for (int64_t r = 0; r < R; r += 2 * take) {
                const int64_t keep0 = R - r < take ? R - r : take;
                const int pair = r + take < R; /* an odd last group runs as both of a pair, once kept */
                const int64_t keep1 = pair ? (R - r - take < take ? R - r - take : take) : 0; /* padding rows dropped */
                amx_blocks2(B2, J->xp, J->Rp, K, r, pair ? r + take : r, rec, acc, (int)take);
                for (int bb = 0; bb < B2; bb++) {
                    put(J->y, J->bias, acc + bb * take * JB, N, b + bb, r, keep0);
                    if (keep1) put(J->y, J->bias, acc + (B2 + bb) * take * JB, N, b + bb, r + take, keep1);
                }
            }
            b += B2;
        }
    }
    if (configured) _tile_release(); /* tiles back to their initial state: nothing for a context switch to save */
}
#endif

#ifdef BF_AVX2_BUILD
/* Rows a chunk of a pass of R rows over K inputs on the AVX2 path: every column block a thread
 * claims runs all of one chunk's row groups, then the next chunk's, so a chunk's activations (~96
 * KB of fp32 pairs) stay in L2 while the claim's weights are read once a chunk, instead of all R
 * rows' activations streaming from L3 for every block (a prefill chunk of 256 rows over K = 1536:
 * 1.5 MB a block). A multiple of 5 (whole row groups); SPECCHAT_BF16_CHUNK=N asks for N rows
 * (0: one chunk, the layout before). Each output's chain of FMAs is the same for any chunking. */
static int64_t a2_chunk_rows(int64_t R, int64_t K) {
    static long forced = -2;
    if (forced == -2) {
        const char *e = getenv("SPECCHAT_BF16_CHUNK");
        forced = e && *e ? strtol(e, NULL, 10) : -1;
    }
    if (forced == 0) return R;
    int64_t c = forced > 0 ? (int64_t)forced : (24576 / K) / 5 * 5;
    if (c < 5) c = 5;
    return c < R ? c : R;
}

/* expand_row for whole row chunks (a thread writes only its own chunks' floats) */
typedef struct {
    const float *x;
    int64_t ldx, R, K, chunk;
    float *xf;
} a2_expand_job;

static void a2_expand_part(void *ctx, pool_region *region) {
    const a2_expand_job *E = (const a2_expand_job *)ctx;
    int64_t c0, c1;
    while (pool_claim(region, &c0, &c1))
        for (int64_t c = c0; c < c1; c++) {
            const int64_t r0 = c * E->chunk, Rc = E->R - r0 < E->chunk ? E->R - r0 : E->chunk;
            for (int64_t r = 0; r < Rc; r++) expand_row(E->x + (r0 + r) * E->ldx, Rc, E->K, r, E->xf + r0 * E->K);
        }
}

static void bf_part_avx2(const bf_job *J, pool_region *region) {
    const int64_t R = J->R, K = J->K, N = J->N, C = J->chunk;
    float acc[4 * 5 * JB];
    int64_t b0, b1;
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040u); /* FTZ (bit 15) and DAZ (bit 6): the scalar form's denormals, restored below */
    while (pool_claim(region, &b0, &b1)) {
        for (int64_t c0 = 0; c0 < R; c0 += C) {
            const int64_t Rc = R - c0 < C ? R - c0 : C;
            const float *xc = J->xf + c0 * K; /* the chunk's rows, pair-major among themselves */
            for (int64_t b = b0; b < b1;) {
                const uint32_t *rec = J->W + b * (K / 2) * JB;
                int lb = a2_blocks_for(Rc);
                while (lb > 0 && b + (1 << lb) > b1) lb--;
                const int B = 1 << lb;
                const int64_t gmax = GMAX_A2[lb], groups = (Rc + gmax - 1) / gmax;
                int64_t r = 0;
                for (int64_t g = 0; g < groups; g++) {
                    const int64_t take = (Rc - r + (groups - g) - 1) / (groups - g); /* even groups: 10 -> 4 + 3 + 3 */
                    AVX2[lb][take](xc, Rc, K, r, rec, acc);
                    for (int bb = 0; bb < B; bb++) put(J->y, J->bias, acc + bb * take * JB, N, b + bb, c0 + r, take);
                    r += take;
                }
                b += B;
            }
        }
    }
    _mm_setcsr(csr);
}
#endif

static void bf_part(void *ctx, pool_region *region) {
    const bf_job *J = (const bf_job *)ctx;
#ifdef BF_AVX2_BUILD
    if (J->xf) {
        bf_part_avx2(J, region);
        return;
    }
#endif
#ifdef BF_AMX_BUILD
    if (J->amx) {
        bf_part_amx(J, region);
        return;
    }
#endif
    const int64_t R = J->R, K = J->K, N = J->N;
    float acc[8 * GMAX * JB];
    int64_t b0, b1;
    while (pool_claim(region, &b0, &b1)) {
        for (int64_t b = b0; b < b1;) {
            const uint32_t *rec = J->W + b * (K / 2) * JB;
            int lb = 0;
#ifdef BF_VEC
            if (bf_path() >= BF_AVX512) {
                lb = blocks_for(R);
                while (lb > 0 && b + (1 << lb) > b1) lb--;
            }
#endif
            const int B = 1 << lb;
#ifdef BF_VEC
            const int64_t gmax = bf_path() >= BF_AVX512 ? GMAX_B[lb] : GMAX;
#else
            const int64_t gmax = GMAX;
#endif
            const int64_t groups = (R + gmax - 1) / gmax;
            int64_t r = 0;
            for (int64_t g = 0; g < groups; g++) {
                const int64_t take = (R - r + (groups - g) - 1) / (groups - g); /* even groups: 10 -> 5 + 5 */
#ifdef BF_VEC
                if (bf_path() >= BF_AVX512)
                    VEC[lb][take](J->xp, K, r, rec, acc);
                else
#endif
                    rows_scalar(J->xp, K, r, take, rec, acc);
                for (int bb = 0; bb < B; bb++) put(J->y, J->bias, acc + bb * take * JB, N, b + bb, r, take);
                r += take;
            }
            b += B;
        }
    }
}

/* y (R, N) = x (R, K; row stride ldx) @ W (+ bias), W as above. Returns 0, 1 if the activation
 * buffer could not be allocated, 2 for an odd K. */
int linear_rows_bf16(const float *x, int64_t ldx, int64_t R, int64_t K, const uint16_t *W, int64_t N, const float *bias,
                     float *y, int nthreads) {
    if (K % 2 != 0 || K <= 0) return 2;
    if (R <= 0) return 0;
    int amx = 0;
    int64_t take = R, Rp = R;
#ifdef BF_AMX_BUILD
    if (bf_path() == BF_AMX && K % 32 == 0) {
        const int64_t groups = (R + 15) / 16;
        amx = 1;
        take = (R + groups - 1) / groups; /* even groups: 20 -> 10 + 10, 17 -> 9 + 9 (one padding row) */
        Rp = groups * take;
    }
#endif
    const float *xf = NULL;
    int64_t rchunk = R;
#ifdef BF_AVX2_BUILD
    if (bf_path() == BF_AVX2) { /* the activations as fp32 pairs, odd input first (expand_row), chunk by chunk */
        float *f = (float *)malloc(sizeof(float) * (size_t)(R * K) + 64);
        if (!f) return 1;
        rchunk = a2_chunk_rows(R, K);
        a2_expand_job E = {x, ldx, R, K, rchunk, f};
        const int64_t chunks = (R + rchunk - 1) / rchunk;
        pool_run(chunks > 1 && nthreads > 1 ? nthreads : 1, chunks, 1, a2_expand_part, &E); /* a prefill's rows on every thread */
        xf = f;
    }
#endif
    uint32_t *xp = NULL;
    if (!xf) {
        xp = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)(Rp * K / 2) + 64);
        if (!xp) return 1;
        if (amx) {
            amx_layout(x, ldx, R, Rp, K, xp);
        } else {
            for (int64_t r = 0; r < R; r++) convert_row(x + r * ldx, K, xp + r * (K / 2));
        }
    }
    bf_job J = {xp, (const uint32_t *)W, bias, y, R, K, N, amx, take, Rp, xf, rchunk};
    const int64_t nb = (N + JB - 1) / JB;
    if (nthreads < 1) nthreads = 1;
    const int nt = R * K * N > 65536 ? nthreads : 1;
    /* chunks of ~1/8 of a thread's share, in whole groups of 8 blocks */
    const int64_t chunk = ((nb / (8 * nt) + 7) / 8) * 8;
    pool_run(nt, nb, chunk > 8 ? chunk : 8, bf_part, &J);
    free(xp);
    free((void *)xf);
    return 0;
}

/* Rows `ids` (n) of the [N, K] matrix held as above, widened to fp32 into out (n, K) (Linear.dense,
 * take_cols: a drafter's draft vocabulary). Returns 2 for an odd K, 3 for an id out of range. */
int bf16_rows_f32(const uint16_t *W, int64_t N, int64_t K, const int64_t *ids, int64_t n, float *out) {
    if (K % 2 != 0) return 2;
    for (int64_t t = 0; t < n; t++) {
        const int64_t v = ids[t];
        if (v < 0 || v >= N) return 3;
        const uint16_t *rec = W + (v / JB) * K * JB;
        for (int64_t i = 0; i < K; i++) out[t * K + i] = bf2f(rec[(i / 2) * 2 * JB + (v % JB) * 2 + (i & 1)]);
    }
    return 0;
}
