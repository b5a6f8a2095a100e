/* hash.h: SHA-256 (FIPS 180-4), the digest behind kernel-cache keys and cache-entry checksums.
 *
 * Incremental: init, then update any number of times with any split of the input, then final. The
 * digest depends only on the bytes fed, never on how they were split. No allocation, no global state:
 * the context lives wherever the caller puts it. Not constant-time and not meant for secrets: fuser
 * uses it to name and verify its own files.
 */
#ifndef FUSER_HASH_H
#define FUSER_HASH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FUSER_SHA256_BYTES 32                        /* digest size */
#define FUSER_SHA256_HEX (2 * FUSER_SHA256_BYTES + 1) /* hex digest plus its NUL */

typedef struct fuser_sha256_ctx {
    uint32_t state[8];      /* H0..H7 */
    uint64_t total;         /* bytes fed so far */
    unsigned char block[64];
    size_t used;            /* bytes waiting in `block` */
} fuser_sha256_ctx;

/** Start a new digest. */
void fuser_sha256_init(fuser_sha256_ctx *s);

/** Feed `n` bytes (data may be NULL when n is 0). */
void fuser_sha256_update(fuser_sha256_ctx *s, const void *data, size_t n);

/** Finish: write the 32-byte digest. The context must be re-initialised before reuse. */
void fuser_sha256_final(fuser_sha256_ctx *s, unsigned char out[FUSER_SHA256_BYTES]);

/** One call over one buffer. */
void fuser_sha256(const void *data, size_t n, unsigned char out[FUSER_SHA256_BYTES]);

/** Lower-case hex of a digest, NUL-terminated (65 bytes). */
void fuser_sha256_hex(const unsigned char digest[FUSER_SHA256_BYTES], char out[FUSER_SHA256_HEX]);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_HASH_H */
