#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
#include <immintrin.h>
int linear_rows_bf16(const float *x, int64_t ldx, int64_t R, int64_t K, const uint16_t *W, int64_t N, const float *bias, float *y, int nthreads);
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
volatile uint64_t sink;
static float buf[4096];
int main(int argc,char**argv){
  int R = atoi(argv[1]); int mode = atoi(argv[2]); int nt = argc > 3 ? atoi(argv[3]) : 2; int gap = argc > 4 ? atoi(argv[4]) : 20000;
  int NM = 121; int64_t Ns[4]={960,576,3072,576}, Ks[4]={576,576,576,1536};
  uint16_t *W[121]; int64_t N[121],K[121];
  for(int i=0;i<NM;i++){ N[i]= i==120?49152:Ns[i%4]; K[i]= i==120?576:Ks[i%4];
    W[i]=aligned_alloc(64, N[i]*K[i]*2+64); for(int64_t j=0;j<N[i]*K[i];j++) W[i][j]=0x3c00+(rand()&0xff); }
  float *x=malloc(32*1536*4), *y=malloc(32*49152*4); for(int i=0;i<32*1536;i++) x[i]=(rand()%100)/100.0f;
  for(int i=0;i<4096;i++) buf[i]=i*1e-3f;
  double bestp=1e9,bests=1e9;
  for(int it=0;it<30;it++){ double tp=0,ts=0; for(int i=0;i<NM;i++){ double t0=now(); linear_rows_bf16(x,K[i],R,K[i],W[i],N[i],NULL,y,nt); double t1=now();
     if(mode==1){ uint64_t s=0; for(int k=0;k<gap;k++) s = s*6364136223846793005ULL + k; sink=s; }
     if(mode==2){ __m512 a=_mm512_set1_ps(1.0f); for(int k=0;k<40;k++) for(int j=0;j<4096;j+=16) a=_mm512_fmadd_ps(a,_mm512_loadu_ps(buf+j),a); buf[0]=_mm512_reduce_add_ps(a)*1e-30f; }
     double t2=now(); tp+=t1-t0; ts+=t2-t1; }
     if(tp<bestp)bestp=tp; if(ts<bests)bests=ts; }
  printf("R=%d mode %d products %.2f ms  between %.2f ms\n",R,mode,bestp*1e3,bests*1e3);
}
