/* Read bandwidth of this machine's memory: 96 MB (SmolLM2-135M's q8 records are ~96 MB a token,
 * past any L3 here) summed with AVX2 loads on 1 and 2 threads, best of 10. The bound a 1-row
 * decode step streams against (bench/results/2026-11-25-avx2-q8-kernels.md).
 *
 *   cc -O2 -mavx2 -fopenmp -o /tmp/membw bench/membw.c && /tmp/membw
 */
#define _POSIX_C_SOURCE 199309L
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    const size_t n = (size_t)96 << 20;
    uint8_t *b = aligned_alloc(64, n);
    if (!b) return 1;
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)i;
    for (int nt = 1; nt <= 2; nt++) {
        double best = 1e9;
        int sink = 0;
        for (int r = 0; r < 10; r++) {
            const double t0 = now();
            __m256i acc = _mm256_setzero_si256();
#pragma omp parallel num_threads(nt)
            {
                __m256i a = _mm256_setzero_si256();
#pragma omp for schedule(static)
                for (size_t i = 0; i < n; i += 128)
                    for (int k = 0; k < 4; k++) a = _mm256_add_epi8(a, _mm256_load_si256((const __m256i *)(b + i + 32 * k)));
#pragma omp critical
                acc = _mm256_add_epi8(acc, a);
            }
            const double t = now() - t0;
            best = t < best ? t : best;
            sink += _mm256_extract_epi8(acc, 0);
        }
        printf("%d thread%s: %.1f GB/s (96 MB read in %.2f ms)%s\n", nt, nt > 1 ? "s" : "", n / best / 1e9, best * 1e3, sink == 12345 ? "." : "");
    }
    free(b);
    return 0;
}
