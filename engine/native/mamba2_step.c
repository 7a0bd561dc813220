/* A Mamba-2 model's blocks for a batch of draft rows, fp32, in one call (engine/models/mamba2.py
 * Mamba2._step drafts with it and advance_fast catches a drafter up on several tokens a row;
 * engine/native/__init__.py builds it beside linear.c).
 *
 * Why: a drafter step is a few small products and ~40 tiny torch ops per layer; on a 2-core CPU
 * the ops' dispatch cost more than the products (a 5-token chain of the shipped d480 x 3 drafter:
 * ~16 ms, ~6 of them in the products). Drafting decides only what is proposed, never what is
 * emitted, so this path needs to be close to the torch one (tests: allclose), not bit-equal.
 *
 * Per row, mamba-drafters §4.1 / ALGORITHMS.md §4, the plain recurrence:
 *   u = rms_norm(x) * norm_w;  [z | xBC | dt] = u @ W_in
 *   conv = Σ_k window_k * conv_w[k] + conv_b  (window = the K-1 previous xBC, then this one)
 *   x, B, C = silu(conv);  dt = clamp(softplus(dt + dt_bias));  S = exp(dt A) S + dt x ⊗ B
 *   y = S C + D x;  y = gated_rms_norm(y * silu(z));  x += y @ W_out
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "bf16.h" /* exp_neg */

int linear_rows_f32(const float *x, int64_t ldx, int64_t R, int64_t K, const float *Wp, int64_t N,
                    const float *bias, float *y, int nthreads);
int linear_rows_q(const float *x, int64_t ldx, int64_t R, int64_t K, const uint8_t *Wq, int qtype, int64_t N,
                  const float *bias, float *y, int nthreads);

/* a weight held by linear.c: fp32 blocks (qtype 0) or quantised records (engine/models/quant.py) */
static int product(const float *x, int64_t R, int64_t K, const void *W, int qtype, int64_t N, float *y, int nthreads) {
    if (qtype == 0) return linear_rows_f32(x, K, R, K, (const float *)W, N, 0, y, nthreads);
    return linear_rows_q(x, K, R, K, (const uint8_t *)W, qtype, N, 0, y, nthreads);
}

static inline float silu(float v) { return v / (1.0f + expf(-v)); }
static inline float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* B rows of T tokens each, in order (row b's tokens at x rows b T .. b T + T - 1): x (B T, Dm)
 * residual, updated in place. conv (B, Cd, K-1) and ssm (B, H, P, N) states, one a row, updated in
 * place token by token. w_in: linear.c blocks of (Dm -> I + Cd + H), or records of qtype q_in;
 * w_out: the same for (I -> Dm) with q_out. conv_w (K, Cd), conv_b (Cd) or NULL, dt_bias (H), A (H),
 * Dsk (H, P), gate_w (I), norm_w (Dm). T > 1 is a drafter catching up on several tokens: the two
 * projections then run over all B T rows at once (the weights stream once, not once a token), and
 * only the recurrence between them runs token by token. Returns 0, or 1 if scratch memory could
 * not be allocated. */
static int block(float *x, int64_t B, int64_t T, int64_t Dm, const float *norm_w, float eps,
                 const void *w_in, int q_in, float *conv, const float *conv_w, const float *conv_b, int64_t K,
                 const float *dt_bias, const float *A, const float *Dsk, const float *gate_w, float gate_eps,
                 const void *w_out, int q_out, float *ssm, int64_t H, int64_t P, int64_t N, int64_t G,
                 float dt_min, float dt_max, int nthreads) {
    const int64_t I = H * P, Cd = I + 2 * G * N, Z = I + Cd + H, R = H / G;
    const int64_t BT = B * T;
    float *u = (float *)malloc(sizeof(float) * (size_t)(BT * Dm + BT * Z + Cd + BT * I + BT * Dm));
    if (!u) return 1;
    float *proj = u + BT * Dm, *act = proj + BT * Z, *y = act + Cd, *out = y + BT * I;
    for (int64_t b = 0; b < BT; b++) {
        const float *xr = x + b * Dm;
        double ss = 0.0;
        for (int64_t d = 0; d < Dm; d++) ss += (double)xr[d] * xr[d];
        const float r = 1.0f / sqrtf((float)(ss / Dm) + eps);
        for (int64_t d = 0; d < Dm; d++) u[b * Dm + d] = norm_w[d] * (xr[d] * r);
    }
    if (product(u, BT, Dm, w_in, q_in, Z, proj, nthreads)) {
        free(u);
        return 1;
    }
    const int64_t k1 = K - 1;
    for (int64_t r = 0; r < BT; r++) { /* row b's tokens in order: each steps its state */
        const int64_t b = r / T;
        const float *pz = proj + r * Z, *pxbc = pz + I, *pdt = pxbc + Cd;
        float *cs = conv + b * Cd * k1, *a = act;
        for (int64_t c = 0; c < Cd; c++) {
            float *st = cs + c * k1;
            float v = conv_b ? conv_b[c] : 0.0f;
            for (int64_t k = 0; k < k1; k++) v += st[k] * conv_w[k * Cd + c];
            v += pxbc[c] * conv_w[k1 * Cd + c];
            for (int64_t k = 0; k + 1 < k1; k++) st[k] = st[k + 1];
            if (k1 > 0) st[k1 - 1] = pxbc[c];
            a[c] = silu(v);
        }
        const float *xs = a, *Bv = a + I, *Cv = Bv + G * N;
        float *yr = y + r * I;
        for (int64_t h = 0; h < H; h++) {
            float dt = softplus(pdt[h] + dt_bias[h]);
            dt = dt < dt_min ? dt_min : (dt > dt_max ? dt_max : dt);
            const float dA = expf(dt * A[h]);
            const float *Bg = Bv + (h / R) * N, *Cg = Cv + (h / R) * N;
            float *S = ssm + ((b * H + h) * P) * N;
            for (int64_t p = 0; p < P; p++) {
                const float dx = dt * xs[h * P + p];
                float *Sp = S + p * N;
                for (int64_t n = 0; n < N; n++) Sp[n] = Sp[n] * dA + dx * Bg[n];  /* vectorised */
                float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};  /* 8 partial sums: a vectorisable dot */
                int64_t n = 0;
                for (; n + 8 <= N; n += 8)
                    for (int l = 0; l < 8; l++) part[l] += Sp[n + l] * Cg[n + l];
                float acc = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
                for (; n < N; n++) acc += Sp[n] * Cg[n];
                yr[h * P + p] = acc + Dsk[h * P + p] * xs[h * P + p];
            }
        }
        const int64_t gi = I / G;
        for (int64_t g = 0; g < G; g++) {
            float *yg = yr + g * gi;
            const float *zg = pz + g * gi;
            double ss = 0.0;
            for (int64_t i = 0; i < gi; i++) {
                yg[i] *= silu(zg[i]);
                ss += (double)yg[i] * yg[i];
            }
            const float r = 1.0f / sqrtf((float)(ss / gi) + gate_eps);
            for (int64_t i = 0; i < gi; i++) yg[i] = yg[i] * r * gate_w[g * gi + i];
        }
    }
    int rc = product(y, BT, I, w_out, q_out, Dm, out, nthreads);
    if (!rc)
        for (int64_t i = 0; i < BT * Dm; i++) x[i] += out[i];
    free(u);
    return rc;
}

/* per-layer table of int64 slots, filled once by engine/models/mamba2.py (Mamba2._c_layers) */
enum { M_NORM, M_WIN, M_QIN, M_CONVW, M_CONVB, M_DTB, M_A, M_D, M_GATE, M_WOUT, M_QOUT, M_NSLOTS };

/* Every block of a model in one call: x (B T, Dm) as block's; conv (nlayers, B, Cd, K-1) and
 * ssm (nlayers, B, H, P, N), contiguous. A draft step was three calls from Python, each of ~25
 * ctypes arguments, and catching up on T tokens was T such steps. Returns block's code. */
int mamba2_layers_f32(float *x, int64_t B, int64_t T, int64_t Dm, const int64_t *tab, int64_t nlayers, float eps,
                      float *conv, float *ssm, int64_t K, int64_t H, int64_t P, int64_t N, int64_t G, float gate_eps,
                      float dt_min, float dt_max, int nthreads) {
    const int64_t Cd = H * P + 2 * G * N;
    for (int64_t l = 0; l < nlayers; l++) {
        const int64_t *L = tab + l * M_NSLOTS;
#define PTR(i) ((const float *)(intptr_t)L[i])
        const int rc = block(x, B, T, Dm, PTR(M_NORM), eps, (const void *)(intptr_t)L[M_WIN], (int)L[M_QIN],
                             conv + l * B * Cd * (K - 1), PTR(M_CONVW), PTR(M_CONVB), K, PTR(M_DTB), PTR(M_A), PTR(M_D),
                             PTR(M_GATE), gate_eps, (const void *)(intptr_t)L[M_WOUT], (int)L[M_QOUT],
                             ssm + l * B * H * P * N, H, P, N, G, dt_min, dt_max, nthreads);
#undef PTR
        if (rc) return rc;
    }
    return 0;
}

/* One draft step of a drafter, all of it in C: the token's embedding, every block (as
 * mamba2_layers_f32, one row), the final rms_norm, the output layer, and the top k of the softmax
 * over the columns proposals may use (engine/drafters/model.py ModelDrafter: a greedy chain takes
 * the top 1 and its probability, hybrid:auto's Spine the top 3). In Python the same step was ~20
 * torch operations around the C blocks: ~0.2 ms a token, as much as the byte drafter's blocks.
 *
 * mt (int64): Dm, nlayers, layer table, K, H, P, N, G, embed (fp32, rows of Dm), final norm
 * weight, head weight, head qtype, head columns (V), raw width W (the columns before the view;
 * <= V), view columns (int64, or 0: 0 .. W-1), view size, token id of each view index (int64, or
 * 0: the index itself), embedding rows. mf (double): eps, gate_eps, dt_min, dt_max, final norm eps.
 * conv/ssm: one row's state (layers, 1, ...), stepped in place. scratch: max(Dm, V) + Dm floats.
 * Writes the k best ids (ties: the lower view index) and, with want_p, their softmax
 * probabilities; returns 0, 1 on an allocation failure, 2 for a bad token or k. */
int mamba2_draft_step(const int64_t *mt, const double *mf, float *conv, float *ssm, int64_t tok, int64_t k,
                      int want_p, int64_t *out_ids, float *out_p, float *scratch, int nthreads) {
    const int64_t Dm = mt[0], nl = mt[1], K = mt[3], H = mt[4], P = mt[5], N = mt[6], G = mt[7];
    const float *embed = (const float *)(intptr_t)mt[8], *normf = (const float *)(intptr_t)mt[9];
    const void *head = (const void *)(intptr_t)mt[10];
    const int qh = (int)mt[11];
    const int64_t V = mt[12], W = mt[13], nview = mt[15];
    const int64_t *view = (const int64_t *)(intptr_t)mt[14], *ids = (const int64_t *)(intptr_t)mt[16];
    if (k < 1 || k > 16 || tok < 0 || tok >= mt[17] || nview < k) return 2;
    float *x = scratch, *logits = scratch + Dm;
    memcpy(x, embed + tok * Dm, sizeof(float) * (size_t)Dm);
    int rc = mamba2_layers_f32(x, 1, 1, Dm, (const int64_t *)(intptr_t)mt[2], nl, (float)mf[0], conv, ssm, K, H, P, N, G,
                               (float)mf[1], (float)mf[2], (float)mf[3], nthreads);
    if (rc) return rc;
    double ss = 0.0;
    for (int64_t d = 0; d < Dm; d++) ss += (double)x[d] * x[d];
    const float r = 1.0f / sqrtf((float)(ss / Dm) + (float)mf[4]);
    for (int64_t d = 0; d < Dm; d++) x[d] = normf[d] * (x[d] * r);
    /* the head writes V logits after x: logits may not alias x */
    if (product(x, 1, Dm, head, qh, V, logits, nthreads)) return 1;
    (void)W; /* the view's bound: view indices and nview stay below it */
    int64_t best[16];
    float bv[16];
    int64_t nb = 0;
    for (int64_t j = 0; j < nview; j++) {
        const float v = logits[view ? view[j] : j];
        if (nb == k && !(v > bv[k - 1])) continue;  /* NaN never enters */
        int64_t at = nb < k ? nb++ : k - 1;
        while (at > 0 && v > bv[at - 1]) {
            bv[at] = bv[at - 1];
            best[at] = best[at - 1];
            at--;
        }
        bv[at] = v;
        best[at] = j;
    }
    if (nb < k) return 2;
    for (int64_t i = 0; i < k; i++) out_ids[i] = ids ? ids[best[i]] : best[i];
    if (!want_p) return 0;
    /* the softmax's normaliser: sum exp(l - max) in 8 lanes (vectorised; ~1e-6 relative, enough
     * for a confidence that only steers how far to draft), gathered first where there is a view */
    const float mx = bv[0];
    float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t j = 0;
    if (!view) {
        for (; j + 8 <= nview; j += 8)
            for (int l = 0; l < 8; l++) part[l] += exp_neg(logits[j + l] - mx);
    } else {
        for (; j + 8 <= nview; j += 8)
            for (int l = 0; l < 8; l++) part[l] += exp_neg(logits[view[j + l]] - mx);
    }
    float z = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    for (; j < nview; j++) z += exp_neg(logits[view ? view[j] : j] - mx);
    for (int64_t i = 0; i < k; i++) out_p[i] = exp_neg(bv[i] - mx) / z;
    return 0;
}
