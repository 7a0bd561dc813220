#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#include <math.h>
static uint16_t tob(float f){uint32_t u;memcpy(&u,&f,4);return u>>16;}
static float bf(uint16_t h){uint32_t u=(uint32_t)h<<16;float f;memcpy(&f,&u,4);return f;}
static uint16_t rne(float f){uint32_t u;memcpy(&u,&f,4); if((u&0x7f800000)==0) return (u>>16)&0x8000; if((u&0x7fffffff)>0x7f800000) return (u>>16)|0x40; return (u+0x7fff+((u>>16)&1))>>16;}
int main(){ uint16_t a[32]={0},b[32]={0}; float acc[16]={0};
 acc[0]=2e-38f; a[1]=tob(-1.5e-38f); b[1]=tob(1.0f); a[0]=tob(2e-38f); b[0]=tob(1.0f);
 __m512 A=_mm512_loadu_ps(acc); __m512bh x,y; memcpy(&x,a,64); memcpy(&y,b,64);
 float r[16]; _mm512_storeu_ps(r,_mm512_dpbf16_ps(A,x,y));
 float i1=fmaf(bf(a[1]),1.0f,2e-38f); printf("intermediate %g ; result %g ; noflush %g ; flush %g\n", i1, r[0], fmaf(bf(a[0]),1.0f,i1), bf(a[0]));
 /* conversion check */
 long bad=0; for(long it=0; it<2000000; it++){ float f[16]; for(int i=0;i<16;i++){uint32_t u=((uint32_t)rand()<<1)^rand(); if(it%7==0) u&=0x80ffffff; memcpy(&f[i],&u,4);} 
   __m256bh c=_mm512_cvtneps_pbh(_mm512_loadu_ps(f)); uint16_t o[16]; memcpy(o,&c,32);
   for(int i=0;i<16;i++){ if(o[i]!=rne(f[i])){ if(bad<5){uint32_t u;memcpy(&u,&f[i],4);printf("mismatch %08x hw %04x sw %04x\n",u,o[i],rne(f[i]));} bad++;}}}
 printf("conv mismatches %ld\n",bad);}
