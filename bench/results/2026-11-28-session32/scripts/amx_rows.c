#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static uint16_t rnd_bf(void){ float f = ((float)rand()/RAND_MAX*2-1) * powf(2.0f, (rand()%16)-8); uint32_t u; memcpy(&u,&f,4); return u>>16;}
#define KT 18
static uint16_t A[16][KT*32], A2[16][KT*32]; static uint16_t B[KT][16][32]; static float C[16][16], C1[16][16];
static void run(int rows, uint16_t (*a)[KT*32], float (*out)[16]){
  cfg_t c; memset(&c,0,sizeof c); c.palette=1;
  c.colsb[0]=64;c.rows[0]=rows; c.colsb[1]=64;c.rows[1]=rows; c.colsb[2]=64;c.rows[2]=16;
  _tile_loadconfig(&c);
  _tile_zero(0);
  for(int t=0;t<KT;t++){ _tile_loadd(1,&a[0][t*32],KT*64); _tile_loadd(2,&B[t][0][0],64); _tile_dpbf16ps(0,1,2);} 
  _tile_stored(0,out,64);
  _tile_release();
}
int main(){
  syscall(SYS_arch_prctl, 0x1023, 18);
  long diff=0, tot=0;
  for(int trial=0; trial<3000; trial++){
    for(int m=0;m<16;m++) for(int i=0;i<KT*32;i++) {A[m][i]=rnd_bf(); A2[m][i]=rnd_bf();}
    for(int t=0;t<KT;t++) for(int k=0;k<16;k++) for(int i=0;i<32;i++) B[t][k][i]=rnd_bf();
    run(16, A, C);
    int R = 1 + rand()%16;
    for(int m=0;m<16;m++){ memcpy(A2[m], A[m], sizeof A[m]); for(int mm=0;mm<16;mm++) if(mm!=0) { for(int i=0;i<KT*32;i++) A2[mm][i]=rnd_bf(); } 
      run(R, A2, C1); /* row m placed at row 0 with R rows */
      for(int n=0;n<16;n++){ tot++; if(memcmp(&C1[0][n],&C[m][n],4)) diff++; }
      (void)0; break; }
    /* also row m at position m of a R>m tile */
    for(int m=0;m<16;m++){ int RR = m+1 + rand()%(16-m); for(int mm=0;mm<16;mm++) for(int i=0;i<KT*32;i++) A2[mm][i] = mm==m? A[m][i] : rnd_bf();
      run(RR, A2, C1); for(int n=0;n<16;n++){ tot++; if(memcmp(&C1[m][n],&C[m][n],4)) diff++; } }
  }
  printf("tot %ld diff %ld\n", tot, diff);
}
