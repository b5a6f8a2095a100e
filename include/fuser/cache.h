/* cache.h: the on-disk kernel cache: CUBINs keyed by everything that changes them, stored so that
 * fuser never loads a file it did not write itself, never follows a link, and never blocks.
 *
 * Key: SHA-256 (hex) over a canonical serialization of the inputs of a compile: the cache format
 * version, the target architecture, the NVRTC version (major.minor: all NVRTC reports), the program
 * name, the generated source, the full option list (FUSER_JIT_BASE_OPTIONS then the caller's), and
 * every embedded header's name and bytes (sorted by name). Each item is written as its length (8 bytes,
 * little endian) followed by its bytes, so no two different inputs serialize alike:
 *   "fuser kernel cache", "format=2", "arch=sm_90a", "nvrtc=13.0" (or "nvrtc=any"), "name=<name>",
 *   <source>, "options=<n>", <option>..., "headers=<n>", then <name>, <bytes> per header.
 * Editing any kernel template therefore changes every key (DeepGEMM's include hash).
 *
 * The directory (the root): fuser_cache_dir (env.h) chooses it; fuser_cache_root checks it before any
 * use. A missing root is made private (mode 0700, and so are the directories under it). An existing
 * one is refused when it (or a symbolic link in its place) belongs to another user, or when group or
 * others may write it, as ccache and CPython's pycache rules do: another local user could otherwise
 * plant code that fuser loads onto the GPU. A refused or too-long root means no disk cache at all:
 * kernels are compiled and kept in memory (FUSER_CACHE_REFUSED, with the reason in the note).
 *
 * Layout: <root>/v2/<key[0..2]>/<key>.fzk, and the cache's secret <root>/v2/secret: 32 random bytes
 * (mode 0600) made the first time an entry is stored. Copying the whole directory copies the secret;
 * an entry copied without it is a miss.
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
 *   224  32  HMAC-SHA256 (RFC 2104) under the secret of header bytes [0, 224), the CUBIN and the log
 * Reading checks the magic, version, header size, that the lengths add up to the file size exactly,
 * the MAC, and that the key inside is the key looked up. A plain checksum would prove integrity only:
 * an entry relabelled with another key and a recomputed checksum would be served. The MAC proves
 * origin: only a fuser holding this cache's secret made the entry, for the key it names. A file failing
 * any check is deleted and reported as a miss: the caller recompiles and rewrites it. It is never loaded.
 *
 * Files are opened without following a symbolic link and without blocking (a FIFO in place of an entry
 * must not hang the process), and used only when the open descriptor is a regular file of this user's;
 * anything else is a miss (and a store replaces it). Writes are atomic: a unique temporary file in the
 * same directory (mkstemp, mode 0600: created exclusively, so it never follows a link or reuses a file;
 * named ".<key>.fzk.XXXXXX"), written, fsync'ed, then rename()d over the final name. Several processes
 * may write the same key at once: each file is complete, the last rename wins. On any failure the
 * temporary file is removed.
 *
 * Without NVRTC (a machine that was given a warm cache), the NVRTC version and so the key are unknown.
 * Each store therefore also writes a small alias, v2/<k[0..2]>/<k>.fza with k the key computed with
 * "nvrtc=any", holding the key of the entry last stored for those inputs. fuser_compile_cached follows
 * it only when NVRTC cannot be loaded; the entry it names must record that alias key under its MAC.
 *
 * $FUSER_CACHE_DISABLE (a boolean, env.h) turns the disk cache off (no reads, no writes).
 */
#ifndef FUSER_CACHE_H
#define FUSER_CACHE_H

#include <stddef.h>

#include "fuser/embedded.h"
#include "fuser/env.h"
#include "fuser/hash.h"
#include "fuser/jit.h"
#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FUSER_CACHE_FORMAT 2         /* bump when the entry layout or the key recipe changes */
#define FUSER_CACHE_HEADER_BYTES 256
#define FUSER_CACHE_SECRET_BYTES 32  /* the cache's secret: the key of every entry's MAC */
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

/** Serialize an entry (format above, MAC'd under `secret`) into a malloc'd buffer *buf of *n bytes. */
int fuser_cache_encode(const fuser_cubin *c, const fuser_cache_meta *m,
                       const unsigned char secret[FUSER_CACHE_SECRET_BYTES], unsigned char **buf, size_t *n,
                       fuser_err *err);

/** Verify (under `secret`) and parse an entry. FUSER_OK fills out (CUBIN, log, resource numbers; kernel
 * names are read from the log) and m. An invalid entry returns FUSER_E_CACHE saying which check failed;
 * out is then zeroed. Call fuser_cubin_free(out) either way. */
int fuser_cache_decode(const unsigned char *buf, size_t n, const unsigned char secret[FUSER_CACHE_SECRET_BYTES],
                       fuser_cubin *out, fuser_cache_meta *m, fuser_err *err);

/** The file of `key` under cache root `root`: <root>/v2/<key[0..2]>/<key><ext> (ext ".fzk" or ".fza").
 * Returns -1 when it does not fit in n. */
int fuser_cache_path(const char *root, const char *key, const char *ext, char *buf, size_t n);

/** Read the entry of `key` under `root` (a root fuser_cache_root accepted). FUSER_OK is a hit (out and m
 * filled). Anything else is a miss: FUSER_E_CACHE with the reason ("no entry <path>", "cannot use
 * <path>: ..." for a file that is absent, unreadable, a link or not a regular file of this user's, no
 * valid secret yet, or "invalid entry <path> (why); deleted": the file was unlinked), or FUSER_E_NOMEM.
 * With by_alias, `key` is an "any NVRTC" key: the alias is followed to the entry it names, whose
 * recorded any_key must match. */
int fuser_cache_load(const char *root, const char *key, int by_alias, fuser_cubin *out, fuser_cache_meta *m,
                     fuser_err *err);

/** Write the entry (and its alias) for m->key atomically under `root`, making the directories (0700)
 * and the secret as needed. FUSER_OK, or FUSER_E_CACHE saying what failed (no temporary file is left
 * behind). Callers may downgrade the failure: the module itself is valid, as fuser_compile_cached does. */
int fuser_cache_store(const char *root, const fuser_cache_meta *m, const fuser_cubin *c, fuser_err *err);

/** The cache root to use, into root: fuser_cache_dir, then checked as above; with `create`, a missing
 * root is made (mode 0700). FUSER_OK: use it (it exists and is safe, or it is missing: loads miss and
 * a store says why it could not make it). FUSER_E_CACHE: fuser must neither read nor write it (its path
 * is too long, it is not a directory, it belongs to another user, or group or others may write it),
 * saying which and what to do; root is then "". */
int fuser_cache_root(char root[FUSER_CACHE_DIR_MAX], int create, fuser_err *err);

/** The cache's secret under `root` into secret. With create, an absent or invalid one (not a regular
 * file of this user's with mode 0600 and 32 bytes) is replaced by new random bytes, which invalidates
 * every entry MAC'd under the old one. FUSER_OK, or FUSER_E_CACHE saying why there is none. */
int fuser_cache_secret(const char *root, int create, unsigned char secret[FUSER_CACHE_SECRET_BYTES],
                       fuser_err *err);

/* ---- the file-system side, shared by cache.c and cache_fs.c ---- */

struct stat; /* <sys/stat.h>: the callers include it */

/** Read the file at `path` whole into *buf (malloc'd, *n bytes, at most max; *st its fstat): opened with
 * O_NOFOLLOW | O_NONBLOCK, then used only when the open descriptor is a regular file owned by this
 * user. Returns 0; else an errno (ENOENT: absent) with why[nwhy] saying what was wrong. */
int fuser_cache_read_file(const char *path, size_t max, unsigned char **buf, size_t *n, struct stat *st,
                          char *why, size_t nwhy);

/** Write `path` atomically (a private temporary file beside it, fsync, rename over). */
int fuser_cache_write_file(const char *path, const void *data, size_t n, fuser_err *err);

/** mkdir -p, mode 0700, of the directory part of `path` (with `whole`, of all of `path`). */
int fuser_cache_make_dirs(const char *path, int whole, fuser_err *err);

/** Delete the file at `path` if it is still the one `seen` describes (another process may have renamed
 * a new file over it meanwhile). */
void fuser_cache_drop(const char *path, const struct stat *seen);

/** strerror_r into buf, as text for messages. */
const char *fuser_cache_errtext(int e, char *buf, size_t n);

/** What the rest of fuser calls: the module for `source`, from the disk cache or compiled with NVRTC
 * (found through fuser_nvrtc_get with `nvrtc_dirs`) and stored. On success returns FUSER_OK, fills out
 * (out->cache.state/key/note say how) and sets *cache_hit (may be NULL) to 1 when it came from disk.
 * A failure to store is NOT an error: the result is FUSER_OK with out->cache.state =
 * FUSER_CACHE_NOT_STORED and out->cache.note saying why; a root fuser_cache_root refuses is not one
 * either: FUSER_CACHE_REFUSED (nothing read or written there), the note saying why. With NVRTC
 * missing, an entry stored earlier for the same inputs by any NVRTC is still served (through the
 * alias); with none, the NVRTC error (FUSER_E_CUDA) is returned. A compile error is FUSER_E_COMPILE
 * with out->log holding the full log; a $FUSER_CACHE_DISABLE that is not a boolean is FUSER_E_VALUE.
 * Call fuser_cubin_free(out) either way. */
int fuser_compile_cached(const char *source, const char *name, const char *const *opts, int nopts,
                         const char *const *nvrtc_dirs, int ndirs, fuser_cubin *out, int *cache_hit,
                         fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_CACHE_H */
