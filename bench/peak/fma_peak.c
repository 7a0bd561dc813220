/* Peak throughput of AVX2 fp32 vfmadd231ps (8 multiply-adds an instruction) on one thread:
 * six independent accumulators, operands re-declared live each iteration so nothing is hoisted.
 * gcc -O2 -mavx2 -mfma fma_peak.c -o /tmp/peak && /tmp/peak   (bench/results/2026-11-26-app-frames/ section 5) */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
#define M(k) s##k=_mm256_fmadd_ps(a##k,b,s##k);
int main(){
  __m256 a0=_mm256_set1_ps(1),a1=_mm256_set1_ps(2),a2=_mm256_set1_ps(3),a3=_mm256_set1_ps(4),a4=_mm256_set1_ps(5),a5=_mm256_set1_ps(6);
  __m256 b=_mm256_set1_ps(7);
  __m256 s0=_mm256_setzero_ps(),s1=s0,s2=s0,s3=s0,s4=s0,s5=s0;
  long N=200000000; double t=now();
  for(long i=0;i<N;i++){
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(b));
    M(0) M(1) M(2) M(3) M(4) M(5)
  }
  double dt=now()-t; __m256 z=_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(s0,s1),_mm256_add_ps(s2,s3)),_mm256_add_ps(s4,s5));
  printf("%.2f G fma/s one thread = %.1f GFLOP/s (%d)\n", 6.0*N/dt/1e9, 16*6.0*N/dt/1e9, (int)_mm256_cvtss_f32(z));
}
