#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
volatile float seed[16]={1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16};
__attribute__((noinline)) __m512 dp(long n, __m512bh x, __m512bh w){
 __m512 a[12]; for(int k=0;k<12;k++) a[k]=_mm512_set1_ps(seed[k]);
 for(long i=0;i<n;i++){
#pragma GCC unroll 12
  for(int k=0;k<12;k++) a[k]=_mm512_dpbf16_ps(a[k],x,w); }
 __m512 z=a[0]; for(int k=1;k<12;k++) z=_mm512_add_ps(z,a[k]); return z;}
__attribute__((noinline)) __m512 fm(long n, __m512 x, __m512 w){
 __m512 a[12]; for(int k=0;k<12;k++) a[k]=_mm512_set1_ps(seed[k]);
 for(long i=0;i<n;i++){
#pragma GCC unroll 12
  for(int k=0;k<12;k++) a[k]=_mm512_fmadd_ps(a[k],x,w); }
 __m512 z=a[0]; for(int k=1;k<12;k++) z=_mm512_add_ps(z,a[k]); return z;}
int main(){ long n=50000000/3; float o[16];
 double t=now(); __m512 r=dp(n,(__m512bh)_mm512_set1_epi32(0x3f803f80),(__m512bh)_mm512_set1_epi32(0x3c003c00)); t=now()-t; _mm512_storeu_ps(o,r); printf("dp %.2f G/s %g\n",n*12/t/1e9,o[0]);
 t=now(); r=fm(n,_mm512_set1_ps(0.9999f),_mm512_set1_ps(1e-3f)); t=now()-t; _mm512_storeu_ps(o,r); printf("fma %.2f G/s %g\n",n*12/t/1e9,o[0]);}
