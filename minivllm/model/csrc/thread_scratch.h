// Scratch buffers kept by the calling thread from one call to the next: a fresh allocation per
// call would be mapped and faulted in each time (quant_ops.c's x panel passes malloc's mmap
// threshold at K 1536; greedy_head.c's candidates are 8 KB a row and thread).
#ifndef THREAD_SCRATCH_H
#define THREAD_SCRATCH_H
#include <stdlib.h>

// *buf, grown to at least `bytes` (64-byte aligned, whole cache lines) where *cap is short of
// them; NULL without memory. Call it with a static __thread pointer and capacity per buffer.
static inline void *grow_scratch(void **buf, size_t *cap, size_t bytes) {
    if (bytes > *cap) {
        free(*buf);
        *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        *cap = *buf == NULL ? 0 : bytes;
    }
    return *buf;
}
#endif
