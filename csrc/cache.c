/* cache.c: the kernel cache on disk (layout, atomic writes, verified reads; see include/fuser/cache.h)
 * and fuser_compile_cached, which the rest of fuser calls to turn source into a module. No global
 * state: the directory comes from the environment on each call. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fsync, fchmod, strerror_r, O_DIRECTORY */
#include "fuser/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuser/cuda.h"

#define PATH_BYTES 1280
#define MAX_ENTRY_BYTES (1u << 30) /* NOTE: fused-FFN CUBINs are a few MB; anything near 1 GiB is not ours */
#define KEY_HEX (FUSER_SHA256_HEX - 1)

int fuser_cache_disabled(void)
{
    const char *v = getenv("FUSER_CACHE_DISABLE");
    return v && *v && strcmp(v, "0") != 0;
}

int fuser_cache_path(const char *root, const char *key, const char *ext, char *buf, size_t n)
{
    int len = snprintf(buf, n, "%s/v%d/%.2s/%s%s", root, FUSER_CACHE_FORMAT, key, key, ext);
    return len >= 0 && (size_t)len < n ? 0 : -1;
}

static const char *errtext(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n))
        snprintf(buf, n, "errno %d", e);
    return buf;
}

/* ---- files ---- */

/* mkdir -p for the directory part of `file` (mode 0755; another process making it first is fine). */
static int make_parent_dirs(const char *file, fuser_err *err)
{
    char dir[PATH_BYTES], why[128];
    fuser_strlcpy(dir, file, sizeof dir);
    char *end = strrchr(dir, '/');
    if (!end || end == dir)
        return FUSER_OK;
    *end = '\0';
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return fuser_fail(err, FUSER_E_CACHE, "cannot create the cache directory %s: %s", dir,
                              errtext(errno, why, sizeof why));
        *p = saved;
        if (!saved)
            return FUSER_OK;
    }
}

/* Read the whole file into *buf (malloc). Returns 0, or errno (ENOENT: absent; EFBIG: too large). */
static int read_file(const char *path, unsigned char **buf, size_t *n, struct stat *st)
{
    *buf = NULL;
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int e = 0;
    if (fstat(fd, st) != 0)
        e = errno;
    else if (!S_ISREG(st->st_mode) || (unsigned long long)st->st_size > MAX_ENTRY_BYTES)
        e = EFBIG;
    else if (!(*buf = malloc((size_t)st->st_size + 1)))
        e = ENOMEM;
    while (!e && *n < (size_t)st->st_size) {
        ssize_t got = read(fd, *buf + *n, (size_t)st->st_size - *n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) { /* shrank while we read it: report what we have, the checks will reject it */
            e = got < 0 ? errno : 0;
            break;
        }
        *n += (size_t)got;
    }
    close(fd);
    if (e) {
        free(*buf);
        *buf = NULL;
    }
    return e;
}

/* Delete an invalid file, unless another process has meanwhile renamed a new one over its name. */
static void drop_invalid(const char *path, const struct stat *seen)
{
    struct stat now;
    if (stat(path, &now) == 0 && now.st_ino == seen->st_ino && now.st_dev == seen->st_dev)
        unlink(path); /* ENOENT (someone else deleted it) is fine */
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t put = write(fd, p, n);
        if (put < 0 && errno == EINTR)
            continue;
        if (put <= 0)
            return put < 0 ? errno : EIO;
        p += put;
        n -= (size_t)put;
    }
    return 0;
}

/* Write `path` atomically: a unique temporary file beside it, fsync, rename over. The temporary file is
 * removed on every failure. */
static int write_atomic(const char *path, const void *data, size_t n, fuser_err *err)
{
    char tmp[PATH_BYTES + 16], why[128];
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (snprintf(tmp, sizeof tmp, "%.*s.%s.XXXXXX", (int)(base - path), path, base) >= (int)sizeof tmp)
        return fuser_fail(err, FUSER_E_CACHE, "cache path too long: %s", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return fuser_fail(err, FUSER_E_CACHE, "cannot create a file in the cache directory of %s: %s", path,
                          errtext(errno, why, sizeof why));
    fchmod(fd, 0644); /* mkstemp makes 0600; entries are as readable as the directories (0755) */
    const char *step = "write";
    int e = write_all(fd, data, n);
    if (!e && fsync(fd) != 0) {
        e = errno;
        step = "fsync";
    }
    if (close(fd) != 0 && !e) {
        e = errno;
        step = "close";
    }
    if (!e && rename(tmp, path) != 0) {
        e = errno;
        step = "rename";
    }
    if (e) {
        unlink(tmp);
        return fuser_fail(err, FUSER_E_CACHE, "cannot store %s (%s: %s)", path, step, errtext(e, why, sizeof why));
    }
    char dir[PATH_BYTES]; /* make the rename itself durable; best effort */
    snprintf(dir, sizeof dir, "%.*s", (int)(base - path), path);
    int dfd = open(dir[0] ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return FUSER_OK;
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
 * FUSER_OK, or FUSER_E_CACHE ("no entry <path>" when absent). */
static int read_cached(const char *root, const char *key, const char *ext, char *path, unsigned char **buf,
                       size_t *n, struct stat *st, fuser_err *err)
{
    char why[128];
    if (fuser_cache_path(root, key, ext, path, PATH_BYTES))
        return fuser_fail(err, FUSER_E_CACHE, "cache path too long under %s", root);
    int e = read_file(path, buf, n, st);
    if (e)
        return fuser_fail(err, FUSER_E_CACHE, e == ENOENT ? "no entry %s" : "cannot read %s: %s", path,
                          errtext(e, why, sizeof why));
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
        drop_invalid(path, &st);
        return fuser_fail(err, FUSER_E_CACHE, "invalid alias %s (not a key); deleted", path);
    }
    return FUSER_OK;
}

int fuser_cache_load(const char *root, const char *key, int by_alias, fuser_cubin *out, fuser_cache_meta *m,
                     fuser_err *err)
{
    char path[PATH_BYTES], entry_key[FUSER_SHA256_HEX];
    unsigned char *buf;
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
    rc = fuser_cache_decode(buf, n, out, m, &derr);
    free(buf);
    if (rc == FUSER_OK && strcmp(m->key, entry_key) != 0)
        rc = fuser_fail(&derr, FUSER_E_CACHE, "it holds the entry of another key");
    else if (rc == FUSER_OK && by_alias && strcmp(m->any_key, key) != 0)
        rc = fuser_fail(&derr, FUSER_E_CACHE, "its alias key does not match");
    if (rc == FUSER_E_CACHE) {
        fuser_cubin_free(out);
        drop_invalid(path, &st);
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
    unsigned char *buf;
    size_t n;
    int rc = make_parent_dirs(path, err);
    if (rc == FUSER_OK && (rc = fuser_cache_encode(c, m, &buf, &n, err)) == FUSER_OK) {
        rc = write_atomic(path, buf, n, err);
        free(buf);
    }
    if (rc != FUSER_OK)
        return rc;
    char line[FUSER_SHA256_HEX + 1]; /* the alias goes second: it never names an entry not yet written */
    snprintf(line, sizeof line, "%s\n", m->key);
    if ((rc = make_parent_dirs(alias, err)) == FUSER_OK)
        rc = write_atomic(alias, line, strlen(line), err);
    return rc;
}

/* ---- what fuser calls ---- */

int fuser_compile_cached(const char *source, const char *name, const char *const *opts, int nopts,
                         const char *const *nvrtc_dirs, int ndirs, fuser_cubin *out, int *cache_hit,
                         fuser_err *err)
{
    memset(out, 0, sizeof *out);
    if (cache_hit)
        *cache_hit = 0;
    char root[1024], note[sizeof out->cache.note] = "";
    fuser_cache_dir(root, sizeof root);
    int disabled = fuser_cache_disabled();
    fuser_err nerr, lerr;
    fuser_err_clear(&nerr);
    fuser_err_clear(&lerr);
    const fuser_nvrtc *rtc = fuser_nvrtc_get(nvrtc_dirs, ndirs, &nerr);
    fuser_cache_meta m = {.nvrtc_major = rtc ? rtc->major : 0, .nvrtc_minor = rtc ? rtc->minor : 0};
    int rc = fuser_cache_key(source, name, opts, nopts, fuser_embedded_headers, fuser_embedded_header_count,
                             FUSER_CACHE_ANY_NVRTC, 0, m.any_key, err);
    if (rc == FUSER_OK && rtc)
        rc = fuser_cache_key(source, name, opts, nopts, fuser_embedded_headers, fuser_embedded_header_count,
                             rtc->major, rtc->minor, m.key, err);
    if (rc)
        return rc;

    if (!disabled) {
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
    if (disabled) {
        out->cache.state = FUSER_CACHE_DISABLED;
        fuser_strlcpy(note, "the disk cache is disabled by $FUSER_CACHE_DISABLE", sizeof note);
    } else if (fuser_cache_store(root, &m, out, &serr) != FUSER_OK) {
        out->cache.state = FUSER_CACHE_NOT_STORED;
        fuser_strlcpy(note, serr.msg, sizeof note);
    } else {
        out->cache.state = FUSER_CACHE_STORED;
    }
    fuser_strlcpy(out->cache.note, note, sizeof out->cache.note);
    return FUSER_OK;
}
