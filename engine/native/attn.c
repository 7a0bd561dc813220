/* Exact-order bf16 attention rows for the CPU engine (engine/native/__init__.py builds and loads it).
 *
 * Every (row, kv head) is computed on its own, start to end, in one fixed order: scores over the
 * row's visible keys in their logical order (the leading contiguous keys [0, n_lead), then its
 * tail keys: a tree row's ancestors), a max, exp-sums and the value sum in that same order, in
 * fp32; the output is rounded to bf16 (round to nearest even, as torch does). Nothing depends on
 * how many rows go together, on which rows they are, or on masked keys between visible ones, so
 * a decode row, a chain-verify row, a tree row and a prefill row that see the same keys get the
 * same bits: what lossless means in bf16 (DESIGN.md; engine/models/common.cached_attention).
 *
 * No intrinsics: the 16-lane accumulators below are what gcc -O3 vectorizes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "bf16.h"
/* multiply-adds fused (one rounding): the attention of one decode row over 300 keys 26.7 -> 22.6 us
 * a layer, 16 rows 177 -> 148 us (2-core Zen 4). The same code computes every row, so rows stay
 * independent of each other. */
#pragma GCC optimize("fp-contract=fast")

typedef float v16f __attribute__((vector_size(64)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));

/* 16 bf16 -> 16 floats (exact: a bf16 is the top half of a float) */
static inline v16f ld_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, 32);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    v16f f;
    memcpy(&f, &u, 64);
    return f;
}

static inline v16f ld_f(const float *p) {
    v16f f;
    memcpy(&f, p, 64);
    return f;
}

/* the 16 lanes summed in a fixed pairwise order: lane l + lane l+8, then +4, +2, +1 */
static inline float hsum(v16f v) {
    v = v + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
    v = v + __builtin_shufflevector(v, v, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
    v = v + __builtin_shufflevector(v, v, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    v = v + __builtin_shufflevector(v, v, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
    return v[0];
}

/* One (row, kv head): G query heads (qf: G x E floats, pre-scaled) over the row's n keys
 * (rows [0, lead) then tl[0 .. n - lead)); writes G x E bf16 outputs at o (head stride E).
 * E % 16 == 0 (the caller checks). Lane l of a dot accumulates e = l, l + 16, ... in order. */
static inline __attribute__((always_inline)) void row_head(
        const float *qf, const uint16_t *kb, const uint16_t *vb, int lead, const int32_t *tl, int n,
        int G, int E, float *s, int64_t ss, float *acc, uint16_t *o) {
    const int V = E / 16;
    v16f Q[G][V];
    for (int g = 0; g < G; g++)
        for (int v = 0; v < V; v++) Q[g][v] = ld_f(qf + g * E + 16 * v);
    for (int j = 0; j < n; j++) {
        const int64_t row = j < lead ? j : tl[j - lead];
        const uint16_t *kr = kb + row * E;
        v16f kx[V];
        for (int v = 0; v < V; v++) kx[v] = ld_bf16(kr + 16 * v);
        for (int g = 0; g < G; g++) {
            v16f a = Q[g][0] * kx[0];
            for (int v = 1; v < V; v++) a += Q[g][v] * kx[v];
            s[g * ss + j] = hsum(a);
        }
    }
    float zs[64];
    const int n16 = (n + 15) & ~15;
    for (int g = 0; g < G; g++) {
        float *sg = s + g * ss;
        float m = -INFINITY;
        for (int j = 0; j < n; j++) m = sg[j] > m ? sg[j] : m;
        for (int j = 0; j < n; j++) sg[j] = exp_neg(sg[j] - m);
        for (int j = n; j < n16; j++) sg[j] = 0.0f;
        v16f z = ld_f(sg);  /* 16 lane sums in key order, then the fixed lane tree */
        for (int j = 16; j < n16; j += 16) z += ld_f(sg + j);
        zs[g] = hsum(z);
    }
    v16f A[G][V];
    for (int g = 0; g < G; g++)
        for (int v = 0; v < V; v++) A[g][v] = (v16f){0};
    for (int j = 0; j < n; j++) {
        const int64_t row = j < lead ? j : tl[j - lead];
        const uint16_t *vr = vb + row * E;
        for (int v = 0; v < V; v++) {
            const v16f x = ld_bf16(vr + 16 * v);
            for (int g = 0; g < G; g++) A[g][v] += s[g * ss + j] * x;
        }
    }
    for (int g = 0; g < G; g++) {
        const float inv = 1.0f / zs[g];
        for (int v = 0; v < V; v++) {
            float r[16];
            v16f y = A[g][v] * inv;
            memcpy(r, &y, 64);
            for (int l = 0; l < 16; l++) o[g * E + 16 * v + l] = f2bf(r[l]);
        }
    }
    (void)acc;
}

/* Rows [t0, t1) of one layer's attention.
 *   q        bf16, element (h, t, e) at q[h*qs_h + t*qs_t + e]   (H = K*G heads; head h = k*G + g)
 *   kc, vc   bf16 caches (K, P, E), contiguous
 *   n_lead   (T,) row t sees keys [0, n_lead[t]) ...
 *   tail     (T, tail_stride) ... then keys tail[t, 0..n_tail[t]) (cache rows), in that order
 *   out      bf16 (T, H*E), contiguous
 * Returns 0; -1 if it could not allocate its scratch; -2 for a shape it does not take
 * (E % 16 != 0 or G > 64: the caller uses torch). */
int attn_rows_bf16(const uint16_t *q, int64_t qs_h, int64_t qs_t,
                   const uint16_t *kc, const uint16_t *vc, int64_t P, int K, int G, int E,
                   const int32_t *n_lead, const int32_t *tail, const int32_t *n_tail, int tail_stride,
                   float scale, uint16_t *out, int t0, int t1) {
    if (E % 16 != 0 || G > 64 || G < 1) return -2;
    int maxk = 1;
    for (int t = t0; t < t1; t++) {
        int n = n_lead[t] + (n_tail ? n_tail[t] : 0);
        if (n > maxk) maxk = n;
    }
    const int64_t ss = (maxk + 15) & ~15;
    const int H = K * G;
    int failed = 0;
    /* rows in parallel on torch's own OpenMP pool (libgomp is shared: this library links the
     * already-loaded one); a row's arithmetic does not depend on the thread that runs it */
#pragma omp parallel if ((int64_t)(t1 - t0) * maxk * H * E > 200000) reduction(| : failed)
    {
        float *s = (float *)malloc(sizeof(float) * ((size_t)G * ss + (size_t)G * E * 2));
        if (!s) {
            failed = 1;
        } else {
            float *qf = s + (size_t)G * ss;   /* G query vectors in fp32, scaled */
            float *acc = qf + (size_t)G * E;
#pragma omp for collapse(2) schedule(static)
            for (int t = t0; t < t1; t++) {
                for (int k = 0; k < K; k++) {
                    const int lead = n_lead[t];
                    const int n = lead + (n_tail ? n_tail[t] : 0);
                    const int32_t *tl = tail ? tail + (int64_t)t * tail_stride : 0;
                    for (int g = 0; g < G; g++) {
                        const uint16_t *qh = q + (int64_t)(k * G + g) * qs_h + (int64_t)t * qs_t;
                        for (int e = 0; e < E; e++) qf[g * E + e] = bf2f(qh[e]) * scale;
                    }
                    const uint16_t *kb = kc + (int64_t)k * P * E, *vb = vc + (int64_t)k * P * E;
                    uint16_t *o = out + (int64_t)t * H * E + (int64_t)k * G * E;
                    if (E == 64 && G == 3)
                        row_head(qf, kb, vb, lead, tl, n, 3, 64, s, ss, acc, o);
                    else if (E == 64)
                        row_head(qf, kb, vb, lead, tl, n, G, 64, s, ss, acc, o);
                    else
                        row_head(qf, kb, vb, lead, tl, n, G, E, s, ss, acc, o);
                }
            }
            free(s);
        }
    }
    return failed ? -1 : 0;
}

