/* bf16 <-> fp32 as torch rounds them, and a vectorisable exp, shared by attn.c, glue_bf16.c and
 * mamba2_step.c. */
#ifndef SPECCHAT_BF16_H
#define SPECCHAT_BF16_H
#include <stdint.h>
#include <string.h>

static inline float bf2f(uint16_t x) {
    uint32_t u = ((uint32_t)x) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* expf for x <= 0 (softmax terms): 2^(x log2 e) with a degree-6 polynomial for 2^f, f in
 * [-0.5, 0.5]; ~2 ulp, branch-free, so a loop of it vectorizes. Underflows to 0 below -87. */
static inline float exp_neg(float x) {
    x = x < -87.0f ? -87.0f : x;
    const float t = x * 1.44269504088896341f;
    const float n = (t + 12582912.0f) - 12582912.0f;  /* round to nearest even (|t| < 2^22), as vectorisable arithmetic */
    const float f = t - n;
    float p = 1.5353362e-4f;
    p = p * f + 1.3398874e-3f;
    p = p * f + 9.6182553e-3f;
    p = p * f + 5.5503334e-2f;
    p = p * f + 2.4022649e-1f;
    p = p * f + 6.9314718e-1f;
    p = p * f + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, 4);
    bits += ((int32_t)n) << 23;
    memcpy(&p, &bits, 4);
    return x <= -87.0f ? 0.0f : p;
}

#endif
