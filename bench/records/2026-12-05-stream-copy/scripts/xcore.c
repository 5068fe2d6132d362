// ./xcore [RING [NT]]: two processes pinned to CPU 0 and CPU 1: cache-line ping-pong latency, then a producer-consumer
// copy through a shared ring in 256 KiB pieces (GB/s; RING bytes, 2 MiB by default; NT=1: streaming
// stores). Probe for the 2-CPU VM only.
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>
static void ntcopy(char *d, const char *s, size_t n) { for (size_t i = 0; i < n; i += 32) _mm256_stream_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i))); _mm_sfence(); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); sched_setaffinity(0, sizeof s, &s); }
static unsigned long RING = 2u << 20; static int NT = 0;
#define PIECE (256u << 10)
#define TOTAL (256ull << 20)
struct shared { _Atomic long ping, pong; _Alignas(64) _Atomic unsigned long head; _Alignas(64) _Atomic unsigned long tail; _Alignas(64) char ring[]; };
int main(int argc, char **argv) {
  if (argc > 1)
    RING = strtoul(argv[1], 0, 0);
  if (argc > 2)
    NT = atoi(argv[2]);
  struct shared *s = mmap(0, sizeof *s + RING, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(s, 0, sizeof *s + RING);
  const long N = 200000;
  pid_t pid = fork();
  if (pid == 0) {
    pin(1);
    for (long i = 1; i <= N; i++) { while (atomic_load(&s->ping) != i) ; atomic_store(&s->pong, i); }
    char *dst = malloc(PIECE); unsigned long got = 0;
    while (got < TOTAL) {
      while (atomic_load(&s->head) - got < PIECE) ;
      memcpy(dst, s->ring + (got % RING), PIECE); got += PIECE; atomic_store(&s->tail, got);
    }
    _exit(dst[7] == 1 ? 0 : 1);
  }
  pin(0);
  double t0 = now();
  for (long i = 1; i <= N; i++) { atomic_store(&s->ping, i); while (atomic_load(&s->pong) != i) ; }
  double rt = (now() - t0) / N * 1e6;
  char *src = malloc(PIECE); memset(src, 1, PIECE); unsigned long put = 0;
  t0 = now();
  while (put < TOTAL) {
    while (put - atomic_load(&s->tail) + PIECE > RING) ;
    if (NT) ntcopy(s->ring + (put % RING), src, PIECE); else memcpy(s->ring + (put % RING), src, PIECE); put += PIECE; atomic_store(&s->head, put);
  }
  int st; waitpid(pid, &st, 0);
  printf("rt %.2f us  ring %.1f GB/s\n", rt, TOTAL / (now() - t0) / 1e9);
  return 0;
}
