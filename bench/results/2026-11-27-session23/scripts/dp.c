#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
static float bf(uint16_t h){uint32_t u=(uint32_t)h<<16;float f;memcpy(&f,&u,4);return f;}
static uint32_t rnd(){return (uint32_t)rand()<<16 ^ (uint32_t)rand();}
static uint16_t rbf(){ float f=((rand()/(float)RAND_MAX)-0.5f)*ldexpf(1.0f,(rand()%40)-20); uint32_t u; memcpy(&u,&f,4); return u>>16;}
int main(){ long n=0,ea=0,eb=0,ec=0,ed=0;
 for(int it=0;it<200000;it++){ uint16_t a[32],b[32]; float acc[16];
  for(int i=0;i<32;i++){a[i]=rbf();b[i]=rbf();}
  for(int i=0;i<16;i++){float f=((rand()/(float)RAND_MAX)-0.5f)*ldexpf(1.0f,(rand()%40)-20);acc[i]=f;}
  __m512 A=_mm512_loadu_ps(acc); __m512bh x,y; memcpy(&x,a,64); memcpy(&y,b,64);
  __m512 R=_mm512_dpbf16_ps(A,x,y); float r[16]; _mm512_storeu_ps(r,R);
  for(int i=0;i<16;i++){ float lo=bf(a[2*i])*bf(b[2*i]), hi=bf(a[2*i+1])*bf(b[2*i+1]);
   float va=fmaf(bf(a[2*i]),bf(b[2*i]),fmaf(bf(a[2*i+1]),bf(b[2*i+1]),acc[i])); /* odd first */
   float vb=fmaf(bf(a[2*i+1]),bf(b[2*i+1]),fmaf(bf(a[2*i]),bf(b[2*i]),acc[i])); /* even first */
   float vc=acc[i]+(lo+hi);
   double vdd=(double)acc[i]+(double)lo+(double)hi; float vd=(float)vdd; /* single rounding approx */
   n++; ea+=memcmp(&va,&r[i],4)!=0; eb+=memcmp(&vb,&r[i],4)!=0; ec+=memcmp(&vc,&r[i],4)!=0; ed+=memcmp(&vd,&r[i],4)!=0;}
 }
 printf("n=%ld oddfirst=%ld evenfirst=%ld sumprod=%ld single=%ld\n",n,ea,eb,ec,ed);}
