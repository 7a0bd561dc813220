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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LR_VEC 1
#endif

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

/* y = w * (x * 1 / sqrt(mean(x^2) + eps)), the sum of squares in feature order */
static void rms_row(const float *x, const float *w, int64_t D, float eps, float *y) {
    float ss = 0.0f;
    for (int64_t i = 0; i < D; i++) ss = fmaf(x[i], x[i], ss);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int64_t i = 0; i < D; i++) y[i] = w[i] * (x[i] * inv);
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

/* x (T, D) the residual stream, updated in place. cos/sin (T, R). mask (T, start + T) with row
 * stride ldm, nonzero = may attend, or NULL (every row sees rows [0, start + T)). The caches
 * kbase / vbase are (nlayers, KV, P, E), contiguous. Returns 0, 1 if a buffer could not be allocated, or the failing linear's
 * code. */
int llama_rows_f32(float *x, int64_t T, int64_t D, int64_t H, int64_t KV, int64_t E, int64_t F, int64_t R,
                   const int64_t *layers, int64_t nlayers, float *kbase, float *vbase, int64_t P, int64_t start,
                   const float *cos, const float *sin,
                   const uint8_t *mask, int64_t ldm, float eps, float scale, int nthreads) {
    const int64_t G = H / KV, QKV = (H + 2 * KV) * E, end = start + T;
    if (nthreads < 1) nthreads = 1;
    const size_t n = (size_t)T * (size_t)(D + QKV + H * E + 2 * F + F + D);
    float *buf = (float *)malloc(sizeof(float) * n);
    if (!buf) return 1;
    float *h = buf, *qkv = h + T * D, *o = qkv + T * QKV, *gu = o + T * H * E, *act = gu + T * 2 * F, *tmp = act + T * F;
    int rc = 0;
    for (int64_t l = 0; l < nlayers && !rc; l++) {
        const int64_t *L = layers + l * S_NSLOTS;
        const float *ln1 = (const float *)(intptr_t)L[S_LN1], *ln2 = (const float *)(intptr_t)L[S_LN2];
        float *kc = kbase + l * KV * P * E, *vc = vbase + l * KV * P * E;
        for (int64_t t = 0; t < T; t++) rms_row(x + t * D, ln1, D, eps, h + t * D);
        if ((rc = proj(h, T, D, L, S_WQKV, S_QQKV, S_BQKV, QKV, qkv, nthreads))) break;
        for (int64_t t = 0; t < T; t++) {
            float *row = qkv + t * QKV;
            for (int64_t hh = 0; hh < H + KV; hh++) rope_head(row + hh * E, cos + t * R, sin + t * R, R);
            for (int64_t k = 0; k < KV; k++) {
                memcpy(kc + (k * P + start + t) * E, row + (H + k) * E, sizeof(float) * (size_t)E);
                memcpy(vc + (k * P + start + t) * E, row + (H + KV + k) * E, sizeof(float) * (size_t)E);
            }
        }
        int failed = 0;
#pragma omp parallel num_threads(nthreads) if (T * H * end * E > 32768) reduction(| : failed)
        {
            float *s = (float *)malloc(sizeof(float) * (size_t)end);
            if (!s) {
                failed = 1;
            } else {
#pragma omp for schedule(static)
                for (int64_t th = 0; th < T * H; th++) {
                    const int64_t t = th / H, hd = th % H, k = hd / G;
                    const float *q = qkv + t * QKV + hd * E;
                    const float *Kc = kc + k * P * E, *Vc = vc + k * P * E;
                    const uint8_t *mrow = mask ? mask + t * ldm : NULL;
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
                    float *out = o + t * H * E + hd * E;
                    memset(out, 0, sizeof(float) * (size_t)E);
                    for (int64_t j = 0; j < end; j++) {
                        if (mrow && !mrow[j]) continue;
                        axpy(s[j] * inv, Vc + j * E, out, E);
                    }
                }
                free(s);
            }
        }
        if (failed) { rc = 1; break; }
        if ((rc = proj(o, T, H * E, L, S_WO, S_QO, S_BO, D, tmp, nthreads))) break;
        for (int64_t i = 0; i < T * D; i++) x[i] += tmp[i];
        for (int64_t t = 0; t < T; t++) rms_row(x + t * D, ln2, D, eps, h + t * D);
        if ((rc = proj(h, T, D, L, S_WGU, S_QGU, S_BGU, 2 * F, gu, nthreads))) break;
        for (int64_t t = 0; t < T; t++) {
            const float *g = gu + t * 2 * F, *u = g + F;
            float *a = act + t * F;
            for (int64_t i = 0; i < F; i++) a[i] = (g[i] / (1.0f + expf(-g[i]))) * u[i];
        }
        if ((rc = proj(act, T, F, L, S_WD, S_QD, S_BD, D, tmp, nthreads))) break;
        for (int64_t i = 0; i < T * D; i++) x[i] += tmp[i];
    }
    free(buf);
    return rc;
}
