#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start; uint8_t r[14]; uint16_t colsb[16]; uint8_t rows[16]; } __attribute__((packed)) cfg_t;
static float bf(uint16_t h){uint32_t u=(uint32_t)h<<16; float f; memcpy(&f,&u,4); return f;}
static uint16_t rnd_bf(void){ float f = ((float)rand()/RAND_MAX*2-1) * powf(2.0f, (rand()%16)-8); uint32_t u; memcpy(&u,&f,4); return u>>16;}
int main(){
  syscall(SYS_arch_prctl, 0x1023, 18);
  cfg_t c; memset(&c,0,sizeof c); c.palette=1;
  for(int i=0;i<8;i++){c.colsb[i]=64;c.rows[i]=16;}
  _tile_loadconfig(&c);
#define KT 4
  static uint16_t A[16][KT*32]; static uint16_t B[KT][16][32]; static float C[16][16];
  int bad[8]={0}; long tot=0;
  for(int trial=0; trial<2000; trial++){
    for(int m=0;m<16;m++) for(int i=0;i<KT*32;i++) A[m][i]=rnd_bf();
    for(int t=0;t<KT;t++) for(int k=0;k<16;k++) for(int i=0;i<32;i++) B[t][k][i]=rnd_bf();
    _tile_zero(0);
    for(int t=0;t<KT;t++){ _tile_loadd(1,&A[0][t*32],KT*64); _tile_loadd(2,&B[t][0][0],64); _tile_dpbf16ps(0,1,2);} 
    _tile_stored(0,C,64);
    for(int m=0;m<16;m++) for(int n=0;n<16;n++){
      float a1=0,a2=0,a3=0; double a4=0; float a5=0;
      for(int t=0;t<KT;t++){ double tilesum=0; for(int k=0;k<16;k++){
        float x0=bf(A[m][t*32+2*k]), x1=bf(A[m][t*32+2*k+1]), w0=bf(B[t][k][2*n]), w1=bf(B[t][k][2*n+1]);
        a1 = a1 + x1*w1; a1 = a1 + x0*w0;          /* odd then even, rounded each */
        a2 = a2 + x0*w0; a2 = a2 + x1*w1;          /* even then odd */
        a3 = (float)((double)a3 + (double)x0*w0 + (double)x1*w1); /* pair exact, one rounding */
        tilesum += (double)x0*w0 + (double)x1*w1;
      }
      a5 = (float)((double)a5 + tilesum); /* per-instruction exact sum, one rounding */
      }
      tot++;
      if(a1!=C[m][n]) bad[0]++; if(a2!=C[m][n]) bad[1]++; if(a3!=C[m][n]) bad[2]++; if(a5!=C[m][n]) bad[3]++;
    }
  }
  printf("tot %ld oddeven %d evenodd %d pair1round %d tile1round %d\n", tot, bad[0],bad[1],bad[2],bad[3]);
}
