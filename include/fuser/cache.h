/* cache.h: the on-disk kernel cache: CUBINs keyed by everything that changes them.
 *
 * Key: SHA-256 (hex) over a canonical serialization of the inputs of a compile: the cache format
 * version, the target architecture, the NVRTC version (major.minor: all NVRTC reports), the program
 * name, the generated source, the full option list (FUSER_JIT_BASE_OPTIONS then the caller's), and
 * every embedded header's name and bytes (sorted by name). Each item is written as its length (8 bytes,
 * little endian) followed by its bytes, so no two different inputs serialize alike:
 *   "fuser kernel cache", "format=1", "arch=sm_90a", "nvrtc=13.0" (or "nvrtc=any"), "name=<name>",
 *   <source>, "options=<n>", <option>..., "headers=<n>", then <name>, <bytes> per header.
 * Editing any kernel template therefore changes every key (DeepGEMM's include hash).
 *
 * Layout: <fuser_cache_dir()>/v1/<key[0..2]>/<key>.fzk. Directories are made as needed (0755).
 *
 * Entry (.fzk): a 256-byte header, then the CUBIN, then the NVRTC log. All integers little endian:
 *     0   8  magic "FUSERKC\0"
 *     8   4  format version (FUSER_CACHE_FORMAT)
 *    12   4  header size (256)
 *    16   8  CUBIN bytes          24   8  log bytes
 *    32  16  registers, spill store bytes, spill load bytes, static smem bytes (4 x int32)
 *    48   8  NVRTC major, minor (2 x int32) that compiled it
 *    56   8  zero
 *    64  64  the key (hex)       128  64  the "any NVRTC" key (hex, below)
 *   192  32  zero
 *   224  32  SHA-256 of header bytes [0, 224), the CUBIN and the log
 * Reading checks the magic, version, header size, that the lengths add up to the file size exactly,
 * the checksum, and that the key inside is the key looked up. A file failing any check is deleted and
 * reported as a miss: the caller recompiles and rewrites it. It is never loaded.
 *
 * Writes are atomic: a unique temporary file in the same directory (mkstemp; named ".<key>.fzk.XXXXXX"),
 * written, fsync'ed, then rename()d over the final name. Several processes may write the same key at
 * once: each file is complete, the last rename wins. On any failure the temporary file is removed.
 *
 * Without NVRTC (a machine that was given a warm cache), the NVRTC version and so the key are unknown.
 * Each store therefore also writes a small alias, v1/<k[0..2]>/<k>.fza with k the key computed with
 * "nvrtc=any", holding the key of the entry last stored for those inputs. fuser_compile_cached follows
 * it only when NVRTC cannot be loaded.
 *
 * $FUSER_CACHE_DISABLE set to anything but "" or "0" turns the disk cache off (no reads, no writes).
 */
#ifndef FUSER_CACHE_H
#define FUSER_CACHE_H

#include <stddef.h>

#include "fuser/embedded.h"
#include "fuser/hash.h"
#include "fuser/jit.h"
#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FUSER_CACHE_FORMAT 1         /* bump when the entry layout or the key recipe changes */
#define FUSER_CACHE_HEADER_BYTES 256
#define FUSER_CACHE_ANY_NVRTC (-1)   /* nvrtc_major for the "any NVRTC" key of the alias */

/** The cache key of a compile, as hex, into key. nvrtc_major = FUSER_CACHE_ANY_NVRTC gives the alias
 * key. `headers` are the embedded headers to hash (normally fuser_embedded_headers). Fails only with
 * FUSER_E_VALUE (too many options) or FUSER_E_NOMEM. */
int fuser_cache_key(const char *source, const char *name, const char *const *extra_opts, int n_extra,
                    const fuser_embedded_file *headers, int nheaders, int nvrtc_major, int nvrtc_minor,
                    char key[FUSER_SHA256_HEX], fuser_err *err);

/** What an entry records besides the module. */
typedef struct fuser_cache_meta {
    char key[FUSER_SHA256_HEX];      /* the entry's key */
    char any_key[FUSER_SHA256_HEX];  /* its "any NVRTC" key (the alias that points to it) */
    int nvrtc_major, nvrtc_minor;    /* the NVRTC that compiled it */
} fuser_cache_meta;

/** Serialize an entry (format above) into a malloc'd buffer *buf of *n bytes. */
int fuser_cache_encode(const fuser_cubin *c, const fuser_cache_meta *m, unsigned char **buf, size_t *n,
                       fuser_err *err);

/** Verify and parse an entry. FUSER_OK fills out (CUBIN, log, resource numbers; kernel names are read
 * from the log) and m. An invalid entry returns FUSER_E_CACHE saying which check failed; out is then
 * zeroed. Call fuser_cubin_free(out) either way. */
int fuser_cache_decode(const unsigned char *buf, size_t n, fuser_cubin *out, fuser_cache_meta *m, fuser_err *err);

/** The file of `key` under cache root `root`: <root>/v1/<key[0..2]>/<key><ext> (ext ".fzk" or ".fza").
 * Returns -1 when it does not fit in n. */
int fuser_cache_path(const char *root, const char *key, const char *ext, char *buf, size_t n);

/** Read the entry of `key` under `root`. FUSER_OK is a hit (out and m filled). Anything else is a miss:
 * FUSER_E_CACHE with the reason ("no entry <path>", "cannot read <path>: ...", or "invalid entry <path>
 * (why); deleted": the file was unlinked), or FUSER_E_NOMEM. With by_alias, `key` is an "any NVRTC"
 * key: the alias is followed to the entry it names, whose recorded any_key must match. */
int fuser_cache_load(const char *root, const char *key, int by_alias, fuser_cubin *out, fuser_cache_meta *m,
                     fuser_err *err);

/** Write the entry (and its alias) for m->key atomically under `root`. FUSER_OK, or FUSER_E_CACHE
 * saying what failed (no temporary file is left behind). Callers may downgrade the failure: the
 * module itself is valid, as fuser_compile_cached does. */
int fuser_cache_store(const char *root, const fuser_cache_meta *m, const fuser_cubin *c, fuser_err *err);

/** Whether $FUSER_CACHE_DISABLE turns the disk cache off. */
int fuser_cache_disabled(void);

/** What the rest of fuser calls: the module for `source`, from the disk cache or compiled with NVRTC
 * (found through fuser_nvrtc_get with `nvrtc_dirs`) and stored. On success returns FUSER_OK, fills out
 * (out->cache.state/key/note say how) and sets *cache_hit (may be NULL) to 1 when it came from disk.
 * A failure to store is NOT an error: the result is FUSER_OK with out->cache.state =
 * FUSER_CACHE_NOT_STORED and out->cache.note saying why. With NVRTC missing, an entry stored earlier
 * for the same inputs by any NVRTC is still served (through the alias); with none, the NVRTC error
 * (FUSER_E_CUDA) is returned. A compile error is FUSER_E_COMPILE with out->log holding the full log.
 * Call fuser_cubin_free(out) either way. */
int fuser_compile_cached(const char *source, const char *name, const char *const *opts, int nopts,
                         const char *const *nvrtc_dirs, int ndirs, fuser_cubin *out, int *cache_hit,
                         fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_CACHE_H */
