/* The C pass's worker pool (pool.c): parallel regions whose items are claimed in chunks. */
#ifndef SPECCHAT_POOL_H
#define SPECCHAT_POOL_H
#include <stdint.h>

typedef struct pool_region pool_region;

/* fn(ctx, region) runs on every thread taking part: it loops on pool_claim and may set up
 * per-thread scratch first. */
typedef void (*pool_fn)(void *ctx, pool_region *region);

/* Run a region of n_items, claimed chunk items at a time, on up to nthreads threads (the caller is
 * one of them). Returns when every item is done. */
void pool_run(int nthreads, int64_t n_items, int64_t chunk, pool_fn fn, void *ctx);

/* The next unclaimed items [*lo, *hi) of the region; 0 when none are left. */
int pool_claim(pool_region *region, int64_t *lo, int64_t *hi);

#endif
