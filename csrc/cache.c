/* cache.c: the kernel cache's entries on disk (paths, verified reads, atomic stores with their alias;
 * see include/fuser/cache.h) and fuser_compile_cached, which the rest of fuser calls to turn source
 * into a module. How files and directories are handled safely is cache_fs.c's. No global state: the
 * directory comes from the environment on each call. */
#define _POSIX_C_SOURCE 200809L
#include "fuser/cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuser/cuda.h"

#define PATH_BYTES 1280
#define MAX_ENTRY_BYTES (1u << 30) /* NOTE: fused-FFN CUBINs are a few MB; anything near 1 GiB is not ours */
#define KEY_HEX (FUSER_SHA256_HEX - 1)

int fuser_cache_path(const char *root, const char *key, const char *ext, char *buf, size_t n)
{
    int len = snprintf(buf, n, "%s/v%d/%.2s/%s%s", root, FUSER_CACHE_FORMAT, key, key, ext);
    return len >= 0 && (size_t)len < n ? 0 : -1;
}

/* ---- entries ---- */

static int is_key(const unsigned char *s, size_t n)
{
    if (n != KEY_HEX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* Read the file of `key` (with extension `ext`) under root into *buf; its path goes to path[PATH_BYTES].
 * FUSER_OK, or FUSER_E_CACHE ("no entry <path>" when absent, "cannot use <path>: why" otherwise). */
static int read_cached(const char *root, const char *key, const char *ext, char *path, unsigned char **buf,
                       size_t *n, struct stat *st, fuser_err *err)
{
    char why[128];
    if (fuser_cache_path(root, key, ext, path, PATH_BYTES))
        return fuser_fail(err, FUSER_E_CACHE, "cache path too long under %s", root);
    int e = fuser_cache_read_file(path, MAX_ENTRY_BYTES, buf, n, st, why, sizeof why);
    if (e)
        return fuser_fail(err, FUSER_E_CACHE, e == ENOENT ? "no entry %s" : "cannot use %s: %s", path, why);
    return FUSER_OK;
}

/* Read the alias of `any_key` into key. FUSER_OK, or FUSER_E_CACHE (absent, unreadable, invalid). */
static int follow_alias(const char *root, const char *any_key, char key[FUSER_SHA256_HEX], fuser_err *err)
{
    char path[PATH_BYTES];
    unsigned char *buf;
    size_t n;
    struct stat st;
    int rc = read_cached(root, any_key, ".fza", path, &buf, &n, &st, err);
    if (rc)
        return rc;
    if (n && buf[n - 1] == '\n')
        n--;
    int ok = is_key(buf, n);
    if (ok) {
        memcpy(key, buf, KEY_HEX);
        key[KEY_HEX] = '\0';
    }
    free(buf);
    if (!ok) {
        fuser_cache_drop(path, &st);
        return fuser_fail(err, FUSER_E_CACHE, "invalid alias %s (not a key); deleted", path);
    }
    return FUSER_OK;
}

int fuser_cache_load(const char *root, const char *key, int by_alias, fuser_cubin *out, fuser_cache_meta *m,
                     fuser_err *err)
{
    char path[PATH_BYTES], entry_key[FUSER_SHA256_HEX];
    unsigned char *buf, secret[FUSER_CACHE_SECRET_BYTES];
    size_t n;
    struct stat st;
    memset(out, 0, sizeof *out);
    memset(m, 0, sizeof *m);
    fuser_strlcpy(entry_key, key, sizeof entry_key);
    int rc = by_alias ? follow_alias(root, key, entry_key, err) : FUSER_OK;
    if (rc == FUSER_OK)
        rc = read_cached(root, entry_key, ".fzk", path, &buf, &n, &st, err);
    if (rc)
        return rc;
    fuser_err derr;
    fuser_err_clear(&derr);
    if ((rc = fuser_cache_secret(root, 0, secret, err)) != FUSER_OK) { /* a miss: a store makes the secret */
        free(buf);
        return rc;
    }
    rc = fuser_cache_decode(buf, n, secret, out, m, &derr);
    free(buf);
    if (rc == FUSER_OK && strcmp(m->key, entry_key) != 0)
        rc = fuser_fail(&derr, FUSER_E_CACHE, "it holds the entry of another key");
    else if (rc == FUSER_OK && by_alias && strcmp(m->any_key, key) != 0)
        rc = fuser_fail(&derr, FUSER_E_CACHE, "its alias key does not match");
    if (rc == FUSER_E_CACHE) {
        fuser_cubin_free(out);
        fuser_cache_drop(path, &st);
        return fuser_fail(err, FUSER_E_CACHE, "invalid entry %s (%s); deleted", path, derr.msg);
    }
    if (rc && err)
        *err = derr;
    return rc;
}

int fuser_cache_store(const char *root, const fuser_cache_meta *m, const fuser_cubin *c, fuser_err *err)
{
    char path[PATH_BYTES], alias[PATH_BYTES];
    if (fuser_cache_path(root, m->key, ".fzk", path, sizeof path) ||
        fuser_cache_path(root, m->any_key, ".fza", alias, sizeof alias))
        return fuser_fail(err, FUSER_E_CACHE, "cache path too long under %s", root);
    unsigned char *buf, secret[FUSER_CACHE_SECRET_BYTES];
    size_t n;
    int rc = fuser_cache_make_dirs(path, 0, err);
    if (rc == FUSER_OK)
        rc = fuser_cache_secret(root, 1, secret, err);
    if (rc == FUSER_OK && (rc = fuser_cache_encode(c, m, secret, &buf, &n, err)) == FUSER_OK) {
        rc = fuser_cache_write_file(path, buf, n, err);
        free(buf);
    }
    if (rc != FUSER_OK)
        return rc;
    char line[FUSER_SHA256_HEX + 1]; /* the alias goes second: it never names an entry not yet written */
    snprintf(line, sizeof line, "%s\n", m->key);
    if ((rc = fuser_cache_make_dirs(alias, 0, err)) == FUSER_OK)
        rc = fuser_cache_write_file(alias, line, strlen(line), err);
    return rc;
}

/* ---- what fuser calls ---- */

/* Whether the disk cache is off for this call, into *off: FUSER_CACHE_DISABLED or FUSER_CACHE_REFUSED
 * with the reason in note, or 0 with the root to use. FUSER_E_VALUE when $FUSER_CACHE_DISABLE is not a
 * boolean. */
static int cache_off(char root[FUSER_CACHE_DIR_MAX], char *note, size_t n, int *off, fuser_err *err)
{
    int disabled;
    int rc = fuser_env_flag("FUSER_CACHE_DISABLE", &disabled, err);
    fuser_err rerr;
    fuser_err_clear(&rerr);
    *off = 0;
    if (rc != FUSER_OK)
        return rc;
    if (disabled) {
        *off = FUSER_CACHE_DISABLED;
        fuser_strlcpy(note, "the disk cache is disabled by $FUSER_CACHE_DISABLE", n);
    } else if (fuser_cache_root(root, 1, &rerr) != FUSER_OK) {
        *off = FUSER_CACHE_REFUSED;
        fuser_strlcpy(note, rerr.msg, n);
    }
    return FUSER_OK;
}

int fuser_compile_cached(const char *source, const char *name, const char *const *opts, int nopts,
                         const char *const *nvrtc_dirs, int ndirs, fuser_cubin *out, int *cache_hit,
                         fuser_err *err)
{
    memset(out, 0, sizeof *out);
    if (cache_hit)
        *cache_hit = 0;
    char root[FUSER_CACHE_DIR_MAX], note[sizeof out->cache.note] = "";
    int off, rc = cache_off(root, note, sizeof note, &off, err);
    if (rc)
        return rc;
    fuser_err nerr, lerr;
    fuser_err_clear(&nerr);
    fuser_err_clear(&lerr);
    const fuser_nvrtc *rtc = fuser_nvrtc_get(nvrtc_dirs, ndirs, &nerr);
    fuser_cache_meta m = {.nvrtc_major = rtc ? rtc->major : 0, .nvrtc_minor = rtc ? rtc->minor : 0};
    rc = fuser_cache_key(source, name, opts, nopts, fuser_embedded_headers, fuser_embedded_header_count,
                         FUSER_CACHE_ANY_NVRTC, 0, m.any_key, err);
    if (rc == FUSER_OK && rtc)
        rc = fuser_cache_key(source, name, opts, nopts, fuser_embedded_headers, fuser_embedded_header_count,
                             rtc->major, rtc->minor, m.key, err);
    if (rc)
        return rc;

    if (!off) {
        fuser_cache_meta found;
        if (fuser_cache_load(root, rtc ? m.key : m.any_key, !rtc, out, &found, &lerr) == FUSER_OK) {
            out->cache.state = FUSER_CACHE_HIT;
            fuser_strlcpy(out->cache.key, found.key, sizeof out->cache.key);
            if (!rtc)
                snprintf(out->cache.note, sizeof out->cache.note, "NVRTC is not available; served the entry "
                         "NVRTC %d.%d compiled for these inputs", found.nvrtc_major, found.nvrtc_minor);
            if (cache_hit)
                *cache_hit = 1;
            return FUSER_OK;
        }
        fuser_strlcpy(note, lerr.msg, sizeof note);
    }
    if (!rtc) {
        if (off == FUSER_CACHE_REFUSED) { /* the cache that could have served it was not consulted: say why */
            fuser_strlcat(nerr.msg, "; no disk cache was consulted: ", sizeof nerr.msg);
            fuser_strlcat(nerr.msg, note, sizeof nerr.msg);
        }
        if (err)
            *err = nerr;
        return nerr.code;
    }
    rc = fuser_jit_compile(rtc, source, name, opts, nopts, out, err);
    fuser_strlcpy(out->cache.key, m.key, sizeof out->cache.key);
    if (rc)
        return rc;
    fuser_err serr;
    fuser_err_clear(&serr);
    if (off) {
        out->cache.state = off;
    } else if (fuser_cache_store(root, &m, out, &serr) != FUSER_OK) {
        out->cache.state = FUSER_CACHE_NOT_STORED;
        fuser_strlcpy(note, serr.msg, sizeof note);
    } else {
        out->cache.state = FUSER_CACHE_STORED;
    }
    fuser_strlcpy(out->cache.note, note, sizeof out->cache.note);
    return FUSER_OK;
}
