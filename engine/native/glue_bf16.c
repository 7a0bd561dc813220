/* The small bf16 operations between a llama layer's products, one call each instead of ~25
 * torch ops a layer (engine/models/llama.py LlamaModel._glue_rows; engine/native/__init__.py
 * builds and loads this file).
 *
 * Measured before (2-core Zen 4, SmolLM2-135M in bf16, one decode row): of a ~20 ms step, ~12.5 ms
 * were oneDNN's products and ~7 ms everything else (norms, rotary, SiLU, residual adds, and the
 * interpreter around ~800 torch ops).
 *
 * Every row is computed on its own, in a fixed order (the norm's sum of squares in 16 lanes, then
 * lanes summed pairwise), so a row's bits do not depend on how many rows go together: a decode
 * row, a verify row and a prefill row of the same token and context agree (lossless in bf16).
 * Rounding follows torch's bf16 ops: every op computes in fp32 from bf16 inputs and rounds to
 * nearest even; the residual adds and the rotary's products and sums give torch's bits exactly,
 * the norm and SiLU differ from torch's only in the last bit now and then (their reductions and
 * exp are not torch's).
 *
 * No intrinsics: gcc -O3 -march=native vectorises the loops.
 */
#include <stdint.h>
#include <string.h>
#include <math.h>

#include "bf16.h"

/* sum of squares of n bf16 values in 16 lanes (lane l takes elements l, l+16, ...), the lanes
 * then added pairwise (l + l+8, +4, +2, +1) */
static float sumsq(const uint16_t *x, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            float v = bf2f(x[i + l]);
            acc[l] += v * v;
        }
    for (int l = 0; i + l < n; l++) {
        float v = bf2f(x[i + l]);
        acc[l] += v * v;
    }
    for (int w = 8; w >= 1; w >>= 1)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

/* For rows t < T: x[t] += a[t] (when a is not NULL; bf16 add), then
 * out[t] = bf16(w * bf16(x[t] * rsqrt(mean(x[t]^2) + eps)))   (HF's LlamaRMSNorm in bf16).
 * Strides in elements. */
int bf16_add_rmsnorm(uint16_t *x, int64_t xs, const uint16_t *a, int64_t as, int64_t T, int64_t D,
                     const uint16_t *w, float eps, uint16_t *out, int64_t os) {
    for (int64_t t = 0; t < T; t++) {
        uint16_t *xr = x + t * xs;
        if (a) {
            const uint16_t *ar = a + t * as;
            for (int64_t i = 0; i < D; i++) xr[i] = f2bf(bf2f(xr[i]) + bf2f(ar[i]));
        }
        const float r = 1.0f / sqrtf(sumsq(xr, D) / (float)D + eps);
        uint16_t *o = out + t * os;
        for (int64_t i = 0; i < D; i++) o[i] = f2bf(bf2f(w[i]) * bf2f(f2bf(bf2f(xr[i]) * r)));
    }
    return 0;
}

/* For rows t < T of gu = [gate | up] (each F wide, row stride gs):
 * out[t, i] = bf16(bf16(silu(gate)) * up)   (torch's F.silu(g) * u in bf16). */
int bf16_silu_mul(const uint16_t *gu, int64_t gs, int64_t T, int64_t F, uint16_t *out, int64_t os) {
    for (int64_t t = 0; t < T; t++) {
        const uint16_t *g = gu + t * gs, *u = g + F;
        uint16_t *o = out + t * os;
        for (int64_t i = 0; i < F; i++) {
            const float v = bf2f(g[i]);
            const float e = exp_neg(v < 0.0f ? v : -v);  /* exp(-|v|): sigmoid without overflow */
            const float sig = v < 0.0f ? e / (1.0f + e) : 1.0f / (1.0f + e);
            o[i] = f2bf(bf2f(f2bf(v * sig)) * bf2f(u[i]));
        }
    }
    return 0;
}

/* Rows t < T of a fused projection qkv (row stride qs): H query heads, then K key heads, then K
 * value heads, E wide each. The rotary (rotate-half layout, its first R features; cos/sin rows
 * of stride cs for these rows' positions) is applied in place to the query and key heads, as
 * torch's x*cos + rotate_half(x)*sin in bf16 (each product and the sum rounded); then the key and
 * value heads are written to the caches kc, vc (K, P, E) at rows start + t. */
int bf16_rope_kv(uint16_t *qkv, int64_t qs, int64_t T, int H, int K, int E, int R,
                 const uint16_t *cos, const uint16_t *sin, int64_t cs,
                 uint16_t *kc, uint16_t *vc, int64_t P, int64_t start) {
    if (R > E || R % 2 || R > 1024) return -2;
    const int h = R / 2;
    float xr[1024];
    for (int64_t t = 0; t < T; t++) {
        uint16_t *row = qkv + t * qs;
        const uint16_t *c = cos + t * cs, *s = sin + t * cs;
        for (int head = 0; head < H + K; head++) {
            uint16_t *x = row + (int64_t)head * E;
            for (int i = 0; i < R; i++) xr[i] = bf2f(x[i]);
            for (int i = 0; i < h; i++)
                x[i] = f2bf(bf2f(f2bf(xr[i] * bf2f(c[i]))) + bf2f(f2bf(-xr[i + h] * bf2f(s[i]))));
            for (int i = h; i < R; i++)
                x[i] = f2bf(bf2f(f2bf(xr[i] * bf2f(c[i]))) + bf2f(f2bf(xr[i - h] * bf2f(s[i]))));
        }
        for (int k = 0; k < K; k++) {
            memcpy(kc + ((int64_t)k * P + start + t) * E, row + (int64_t)(H + k) * E, sizeof(uint16_t) * E);
            memcpy(vc + ((int64_t)k * P + start + t) * E, row + (int64_t)(H + K + k) * E, sizeof(uint16_t) * E);
        }
    }
    return 0;
}
