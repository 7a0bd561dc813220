// The m largest values of each row of a float32 matrix, sorted descending: what
// torch.topk(x, m).values gives, for the sampling cuts (engine/sampling.py: top-k's k-th value,
// the nucleus's largest probabilities). torch's CPU topk took 44-100 us a row of SmolLM2's
// 49,152 entries for k = 40 and 85-155 us for 256 on a 2-core Xeon (session 47): a tenth to a
// fifth of a 16-row verify pass at temperature > 0.
//
// A row of V entries is cut into S = V / 16 strided blocks (block b: entries b, S + b, ...,
// 15 S + b), so their maxima are 16 element-wise maxima of contiguous stretches (vectorised by
// the compiler). The m-th largest block maximum t has at least m entries >= t (one in each of
// those m blocks), so the m largest entries are among the entries >= t: only the blocks whose
// maximum reaches t are read again, their candidates kept in a min-heap of m, which is then
// sorted (the m-th largest block maximum is found, to the bin, from a histogram of their top
// bits). The values are the row's own floats, so the result equals torch's bit for bit (of tied
// entries, which are kept does not change the values). A NaN (or an infinity) anywhere returns -1
// and leaves the row to torch (which ranks NaN highest).
#include <stdint.h>
#include <stdlib.h>
#include <float.h>
#include <string.h>

static void sift_down(float* h, int64_t n, int64_t i) {
    float v = h[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (!(h[c] < v)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

// The heap h of n holds the n largest values pushed so far (its least at h[0]) once full.
static inline void push(float* h, int64_t* n, int64_t m, float v) {
    if (*n < m) {  // sift up
        int64_t i = (*n)++;
        while (i > 0 && h[(i - 1) / 2] > v) {
            h[i] = h[(i - 1) / 2];
            i = (i - 1) / 2;
        }
        h[i] = v;
    } else if (v > h[0]) {
        h[0] = v;
        sift_down(h, m, 0);
    }
}

// the heap of m sorted in place, descending (the least goes to the back each time)
static void sort_descending(float* h, int64_t m) {
    for (int64_t n = m; n > 1; n--) {
        float least = h[0];
        h[0] = h[n - 1];
        sift_down(h, n - 1, 0);
        h[n - 1] = least;
    }
}

// a float's bits as an unsigned key in the floats' order (negative floats' bits flipped)
static inline uint32_t key(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u ^ ((uint32_t)((int32_t)u >> 31) | 0x80000000u);
}

static inline float unkey(uint32_t k) {
    uint32_t u = k ^ ((k & 0x80000000u) ? 0x80000000u : 0xFFFFFFFFu);
    float v;
    memcpy(&v, &u, 4);
    return v;
}

static int row_top(const float* row, int64_t V, int64_t m, float* out, float* bm, float* heap) {
    const int64_t S = V / 16, tail = V - 16 * S;
    if (S < m) {  // too few blocks for the bound: one heap over the whole row
        int64_t n = 0;
        float bad = 0.0f;
        for (int64_t i = 0; i < V; i++) {
            bad += row[i] * 0.0f;  // NaN for a NaN or an infinity
            push(out, &n, m, row[i]);
        }
        if (bad != 0.0f) return -1;
        sort_descending(out, m);
        return 0;
    }
    float* nan = bm + S;  // 0 unless a NaN or an infinity went through (x * 0)
    for (int64_t b = 0; b < S; b++) {
        bm[b] = row[b];
        nan[b] = row[b] * 0.0f;
    }
    for (int64_t j = 1; j < 16; j++) {
        const float* p = row + j * S;
        for (int64_t b = 0; b < S; b++) {
            float v = p[b];
            bm[b] = v > bm[b] ? v : bm[b];
            nan[b] += v * 0.0f;
        }
    }
    float bad = 0.0f;
    for (int64_t b = 0; b < S; b++) bad += nan[b];
    for (int64_t i = 16 * S; i < V; i++) bad += row[i] * 0.0f;
    if (bad != 0.0f) return -1;
    // t: the least value of the histogram bin (by the top 12 bits of an order-keeping key) where
    // the count of block maxima from the top reaches m; at least m of them are >= t
    uint32_t* count = (uint32_t*)heap;  // 4096 bins
    for (int i = 0; i < 4096; i++) count[i] = 0;
    for (int64_t b = 0; b < S; b++) count[key(bm[b]) >> 20]++;
    int64_t seen = 0;
    int bin = 4095;
    for (; bin > 0; bin--) {
        seen += count[bin];
        if (seen >= m) break;
    }
    const float t = bin > 0 ? unkey((uint32_t)bin << 20) : -FLT_MAX;  // (bin 0: -inf, NaN, the largest negatives)
    int64_t n = 0;
    for (int64_t b = 0; b < S; b++) {
        if (bm[b] < t) continue;
        for (int64_t j = 0; j < 16; j++) {
            float v = row[j * S + b];
            if (v >= t) push(out, &n, m, v);
        }
    }
    for (int64_t i = 0; i < tail; i++) push(out, &n, m, row[16 * S + i]);
    sort_descending(out, m);  // n == m: at least m entries reach t
    return 0;
}

// x: R rows of V floats, row r at x + r * ld; out: R rows of m floats (1 <= m <= V), descending.
// Returns 0; -1 for a NaN or an infinity in x; -2 for bad sizes; -3 out of memory.
int topk_values_f32(const float* x, int64_t R, int64_t V, int64_t ld, int64_t m, float* out) {
    if (R < 0 || V < 1 || m < 1 || m > V || ld < V) return -2;
    float* work = malloc(sizeof(float) * (size_t)(2 * (V / 16) + (m > 4096 ? m : 4096) + 1));
    if (!work) return -3;
    int rc = 0;
    for (int64_t r = 0; r < R && rc == 0; r++)
        rc = row_top(x + r * ld, V, m, out + r * m, work, work + 2 * (V / 16));
    free(work);
    return rc;
}
