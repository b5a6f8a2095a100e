/* test_cache.h: helpers test_cache.c defines and test_cache_safety.c shares: a fake module and its
 * cache metadata, file-tree counting, raw writes, and the check that a load rejected (and deleted) an
 * entry. */
#ifndef FUSER_TEST_CACHE_H
#define FUSER_TEST_CACHE_H

#include <stddef.h>

#include "fuser/cache.h"

/** A module as fuser_jit_compile would return it (not a real CUBIN: nothing loads it). */
void make_cubin(fuser_cubin *c, size_t size);
/** Keys (NVRTC 13.0 and "any") of a compile of `source` named "t.cu". */
void make_meta(fuser_cache_meta *m, const char *source);
/** Files under dir (recursively) whose name contains `part`; with rm, remove everything. */
int walk(const char *dir, const char *part, int rm);
/** Write b[0..n) to path, replacing it. */
void write_bytes(const char *path, const unsigned char *b, size_t n);
/** Whether loading `key` under root is a miss saying `why` that deleted the file at path. */
int load_rejects(const char *root, const char *key, const char *path, const char *why);

#endif /* FUSER_TEST_CACHE_H */
