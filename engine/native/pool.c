/* A persistent worker pool for the C pass's parallel regions (linear.c, llama_rows.c), in place
 * of OpenMP's.
 *
 * Why a pool of our own: libgomp gives every calling thread its own team, and its wait policy is
 * one switch for the whole process. Measured on a 2-core EPYC (SmolLM2 fp32 decode, `stream_chat`,
 * 33 tokens): 60 tok/s with the default policy, 140 with OMP_WAIT_POLICY=ACTIVE on the main thread,
 * but 50 in a worker thread (the app's decode thread): the main thread's idle team spins forever
 * beside the worker's own team. Here one pool serves every calling thread; between regions its
 * workers spin for a bounded time (a pass has ~150 regions a few microseconds apart), then sleep on
 * a condition variable, so an idle or streaming app leaves the cores to the UI.
 *
 * Why claimed chunks: with a static split, a worker the OS preempts (the app's UI thread wakes up
 * 20 times a second on the same two cores) stalls the whole region until it runs again, and a pass
 * has ~150 regions. Here each thread taking part starts on its own contiguous share (what a static
 * split gives it, so the weights stream in order), claims it a chunk at a time from a counter alone
 * in its cache line, and then claims from the others' shares; a worker only joins a region that is
 * still open. The caller does everything a late worker has not claimed and waits only for chunks
 * already in progress. Which thread computes an item never changes its bits (each item is computed
 * whole by one thread, in a fixed order).
 *
 * Protocol: the caller (holding run_lock, one region at a time) sets the region, opens it and
 * bumps `gen`; a worker that sees a new generation increments `inside`, then checks `open_`. The
 * caller, out of items, closes the region and waits for `inside` to reach zero. Both sides write
 * then read (seq_cst), so either the caller waits for the worker or the worker sees the region
 * closed and leaves without touching it (the region lives on the caller's stack).
 * SPECCHAT_SPIN_US sets the spin before sleeping (default 300).
 */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

#define POOL_MAX 64

typedef struct {
    _Alignas(64) _Atomic int64_t next;
    int64_t end;
} share;

struct pool_region {
    share s[POOL_MAX];
    int nshares;
    int64_t chunk;
    pool_fn fn;
    void *ctx;
    _Alignas(64) atomic_int joined; /* shares handed out so far (the caller's is 0) */
};

static _Thread_local int my_share;

static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;   /* one region at a time */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER; /* guards the sleepers' wait */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
/* spun on by idle workers: a line of its own */
static _Alignas(64) atomic_uint gen;       /* bumped once per region */
static _Alignas(64) atomic_int open_;      /* the current region may still be joined */
static pool_region *_Atomic cur;
static atomic_int sleepers;                /* workers in pthread_cond_wait */
static _Alignas(64) atomic_int inside;     /* workers inside the current region */
static int started;                        /* workers running (guarded by run_lock) */
static long spin_ns = -1;

int pool_claim(pool_region *r, int64_t *lo, int64_t *hi) {
    for (int k = 0; k < r->nshares; k++) {
        share *sh = &r->s[(my_share + k) % r->nshares];
        if (atomic_load_explicit(&sh->next, memory_order_relaxed) >= sh->end) continue;
        const int64_t a = atomic_fetch_add(&sh->next, r->chunk);
        if (a >= sh->end) continue;
        *lo = a;
        *hi = a + r->chunk < sh->end ? a + r->chunk : sh->end;
        return 1;
    }
    return 0;
}

static void run_share(pool_region *r, int t) {
    my_share = t;
    r->fn(r->ctx, r);
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

typedef struct {
    unsigned seen; /* the generation before the region it was started for */
} worker_arg;

static void *worker(void *arg) {
    unsigned seen = ((worker_arg *)arg)->seen; /* not a fresh read: the region may already be out */
    free(arg);
    for (;;) {
        unsigned g;
        long t0 = 0;
        for (unsigned k = 1; (g = atomic_load(&gen)) == seen; k++) {
            CPU_RELAX();
            if (k % 256) continue;
            const long t = now_ns();
            if (!t0) {
                t0 = t;
            } else if (t - t0 > spin_ns) { /* idle: sleep until the next region */
                pthread_mutex_lock(&sleep_lock);
                atomic_fetch_add(&sleepers, 1);
                while ((g = atomic_load(&gen)) == seen) pthread_cond_wait(&wake, &sleep_lock);
                atomic_fetch_sub(&sleepers, 1);
                pthread_mutex_unlock(&sleep_lock);
                break;
            }
        }
        seen = g;
        atomic_fetch_add(&inside, 1);
        if (atomic_load(&open_)) {
            pool_region *r = atomic_load(&cur);
            const int t = atomic_fetch_add(&r->joined, 1);
            if (t < r->nshares) run_share(r, t);
        }
        atomic_fetch_sub(&inside, 1);
    }
    return NULL;
}

/* after fork() the child has no workers: start afresh */
static void after_fork_child(void) {
    pthread_mutex_init(&run_lock, NULL);
    pthread_mutex_init(&sleep_lock, NULL);
    pthread_cond_init(&wake, NULL);
    atomic_store(&open_, 0);
    atomic_store(&inside, 0);
    atomic_store(&sleepers, 0);
    started = 0;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_once(void) {
    const char *e = getenv("SPECCHAT_SPIN_US");
    spin_ns = (e ? atol(e) : 300) * 1000L;
    if (spin_ns < 0) spin_ns = 0;
    pthread_atfork(NULL, NULL, after_fork_child);
}

static void set_shares(pool_region *r, int n, int64_t n_items) {
    r->nshares = n;
    for (int t = 0; t < n; t++) {
        const int64_t q = n_items / n, rem = n_items % n;
        const int64_t lo = t * q + (t < rem ? t : rem);
        atomic_init(&r->s[t].next, lo);
        r->s[t].end = lo + q + (t < rem ? 1 : 0);
    }
    atomic_init(&r->joined, 1);
}

void pool_run(int nthreads, int64_t n_items, int64_t chunk, pool_fn fn, void *ctx) {
    pool_region r;
    r.chunk = chunk < 1 ? 1 : chunk, r.fn = fn, r.ctx = ctx;
    if (nthreads > POOL_MAX) nthreads = POOL_MAX;
    if (nthreads <= 1 || n_items <= r.chunk) {
        set_shares(&r, 1, n_items);
        run_share(&r, 0);
        return;
    }
    pthread_once(&once, init_once);
    pthread_mutex_lock(&run_lock);
    while (started < nthreads - 1) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        worker_arg *wa = (worker_arg *)malloc(sizeof(worker_arg));
        int ok = wa != NULL;
        if (ok) {
            wa->seen = atomic_load(&gen);
            ok = pthread_create(&th, &at, worker, wa) == 0;
            if (!ok) free(wa);
        }
        pthread_attr_destroy(&at);
        if (!ok) break;
        started++;
    }
    if (nthreads > started + 1) nthreads = started + 1; /* 1 if no worker could be started */
    set_shares(&r, nthreads, n_items);
    if (nthreads == 1) {
        pthread_mutex_unlock(&run_lock);
        run_share(&r, 0);
        return;
    }
    atomic_store(&cur, &r);
    atomic_store(&open_, 1);
    atomic_fetch_add(&gen, 1);
    if (atomic_load(&sleepers) > 0) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&wake);
        pthread_mutex_unlock(&sleep_lock);
    }
    run_share(&r, 0); /* returns when no items are left to claim */
    atomic_store(&open_, 0);
    for (unsigned k = 1; atomic_load(&inside) > 0; k++) { /* chunks still in progress elsewhere */
        CPU_RELAX();
        if (k % 4096 == 0) sched_yield(); /* a worker was descheduled: let it run */
    }
    pthread_mutex_unlock(&run_lock);
}
