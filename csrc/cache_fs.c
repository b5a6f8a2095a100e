/* cache_fs.c: the kernel cache's file-system side (see include/fuser/cache.h): how a cache file is read
 * (never through a link, never blocking, regular files of this user's only), written (atomically,
 * privately), how directories are made (0700), whether the root may be used at all, and the cache's
 * secret. The entries themselves (paths, load, store) are cache.c's. */
#define _POSIX_C_SOURCE 200809L /* mkstemp, fsync, strerror_r, O_NOFOLLOW, O_DIRECTORY, O_CLOEXEC, lstat */
#include "fuser/cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PATH_BYTES 1280 /* a root (FUSER_CACHE_DIR_MAX) plus "/v2/ab/<64 hex>.fzk.XXXXXX" */

const char *fuser_cache_errtext(int e, char *buf, size_t n)
{
    if (strerror_r(e, buf, n))
        snprintf(buf, n, "errno %d", e);
    return buf;
}

/* ---- reading ---- */

/* Why the file open at fd (fstat'ed into st) must not be used, or NULL. */
static const char *refuse_file(const struct stat *st, size_t max, char *why, size_t nwhy)
{
    if (!S_ISREG(st->st_mode))
        return "not a regular file";
    if (st->st_uid != geteuid()) {
        snprintf(why, nwhy, "owned by uid %lu, not by this user (uid %lu)", (unsigned long)st->st_uid,
                 (unsigned long)geteuid());
        return why;
    }
    if ((unsigned long long)st->st_size > max) {
        snprintf(why, nwhy, "%llu bytes, more than a cache file holds", (unsigned long long)st->st_size);
        return why;
    }
    return NULL;
}

int fuser_cache_read_file(const char *path, size_t max, unsigned char **buf, size_t *n, struct stat *st,
                          char *why, size_t nwhy)
{
    *buf = NULL;
    *n = 0;
    /* NOTE: O_NONBLOCK makes opening a FIFO return at once instead of waiting for a writer; O_NOFOLLOW
     * refuses a symbolic link as the last component (ELOOP). The type is checked on the descriptor. */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            fuser_strlcpy(why, "a symbolic link", nwhy);
        else
            fuser_cache_errtext(e, why, nwhy);
        return e;
    }
    int e = 0;
    const char *bad;
    if (fstat(fd, st) != 0) {
        e = errno;
        fuser_cache_errtext(e, why, nwhy);
    } else if ((bad = refuse_file(st, max, why, nwhy))) {
        e = EPERM;
        if (bad != why)
            fuser_strlcpy(why, bad, nwhy);
    } else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        fuser_cache_errtext(e = errno, why, nwhy);
    } else if (!(*buf = malloc((size_t)st->st_size + 1))) {
        fuser_cache_errtext(e = ENOMEM, why, nwhy);
    }
    while (!e && *n < (size_t)st->st_size) {
        ssize_t got = read(fd, *buf + *n, (size_t)st->st_size - *n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) { /* shrank while we read it: report what we have, the checks will reject it */
            if (got < 0)
                fuser_cache_errtext(e = errno, why, nwhy);
            break;
        }
        *n += (size_t)got;
    }
    close(fd);
    if (e) {
        free(*buf);
        *buf = NULL;
        *n = 0;
    }
    return e;
}

void fuser_cache_drop(const char *path, const struct stat *seen)
{
    struct stat now;
    if (lstat(path, &now) == 0 && now.st_ino == seen->st_ino && now.st_dev == seen->st_dev)
        unlink(path); /* ENOENT (someone else deleted it) is fine */
}

/* ---- writing ---- */

int fuser_cache_make_dirs(const char *path, int whole, fuser_err *err)
{
    char dir[PATH_BYTES], why[128];
    if (fuser_strlcpy(dir, path, sizeof dir) >= sizeof dir)
        return fuser_fail(err, FUSER_E_CACHE, "cache path too long: %s", path);
    char *end = whole ? dir + strlen(dir) : strrchr(dir, '/');
    if (!end || end == dir)
        return FUSER_OK;
    *end = '\0';
    for (char *p = dir + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(dir, 0700) != 0 && errno != EEXIST) /* another process making it first is fine */
            return fuser_fail(err, FUSER_E_CACHE, "cannot create the cache directory %s: %s", dir,
                              fuser_cache_errtext(errno, why, sizeof why));
        *p = saved;
        if (!saved)
            return FUSER_OK;
    }
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

/* A new private temporary file beside `path` holding data[0..n), fsync'ed; its name goes to tmp. mkstemp
 * creates it exclusively (O_CREAT | O_EXCL, mode 0600): it never follows a link nor opens a file that
 * was there. Returns 0 or an errno, with *step naming what failed; nothing is left behind on failure. */
static int write_temp(const char *path, const void *data, size_t n, char *tmp, size_t ntmp, const char **step)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    *step = "name";
    if (snprintf(tmp, ntmp, "%.*s.%s.XXXXXX", (int)(base - path), path, base) >= (int)ntmp)
        return ENAMETOOLONG;
    *step = "create";
    int fd = mkstemp(tmp);
    if (fd < 0)
        return errno;
    fcntl(fd, F_SETFD, FD_CLOEXEC); /* a process forked meanwhile must not inherit it */
    *step = "write";
    int e = write_all(fd, data, n);
    if (!e && fsync(fd) != 0) {
        e = errno;
        *step = "fsync";
    }
    if (close(fd) != 0 && !e) {
        e = errno;
        *step = "close";
    }
    if (e)
        unlink(tmp);
    return e;
}

/* Make a rename in the directory of `path` durable; best effort. */
static void sync_dir(const char *path)
{
    char dir[PATH_BYTES];
    const char *slash = strrchr(path, '/');
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 0, path);
    int dfd = open(dir[0] ? dir : (slash ? "/" : "."), O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
}

int fuser_cache_write_file(const char *path, const void *data, size_t n, fuser_err *err)
{
    char tmp[PATH_BYTES + 16], why[128];
    const char *step;
    int e = write_temp(path, data, n, tmp, sizeof tmp, &step);
    if (!e && rename(tmp, path) != 0) {
        e = errno;
        step = "rename";
        unlink(tmp);
    }
    if (e)
        return fuser_fail(err, FUSER_E_CACHE, "cannot store %s (%s: %s)", path, step,
                          fuser_cache_errtext(e, why, sizeof why));
    sync_dir(path);
    return FUSER_OK;
}

/* ---- the root ---- */

/* Why the existing root must not be used, into why; NULL when it may (or when it is missing). */
static const char *unsafe_root(const char *root, char *why, size_t n)
{
    struct stat link, st;
    unsigned long me = (unsigned long)geteuid();
    if (lstat(root, &link) != 0)
        return NULL; /* missing: loads miss, a store says why it cannot make it */
    /* a link in place of the root is followed only when this user made it (a link planted in a shared
     * directory such as /tmp belongs to whoever planted it) */
    if (S_ISLNK(link.st_mode) && link.st_uid != me)
        snprintf(why, n, "is a symbolic link owned by uid %lu, not by this user (uid %lu)",
                 (unsigned long)link.st_uid, me);
    else if (stat(root, &st) != 0)
        return NULL;
    else if (!S_ISDIR(st.st_mode))
        snprintf(why, n, "is not a directory");
    else if (st.st_uid != me)
        snprintf(why, n, "is owned by uid %lu, not by this user (uid %lu)", (unsigned long)st.st_uid, me);
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        snprintf(why, n, "is writable by group or others (mode %03o)", (unsigned)(st.st_mode & 0777));
    else
        return NULL;
    return why;
}

int fuser_cache_root(char root[FUSER_CACHE_DIR_MAX], int create, fuser_err *err)
{
    const char *from;
    int rc = fuser_cache_dir(root, &from, err);
    if (rc != FUSER_OK)
        return rc;
    if (create)
        fuser_cache_make_dirs(root, 1, NULL); /* a failure shows in the checks, or when storing */
    char why[160];
    if (!unsafe_root(root, why, sizeof why))
        return FUSER_OK;
    rc = fuser_fail(err, FUSER_E_CACHE, "the kernel cache directory %s (from %s) %s: fuser neither reads nor "
                    "writes it and keeps kernels in memory only; use a directory of your own that only you can "
                    "write (chmod 700), or set $FUSER_CACHE_DIR to one", root, from, why);
    root[0] = '\0';
    return rc;
}

/* ---- the secret ---- */

/* Fill secret with random bytes from the kernel. */
static int random_bytes(unsigned char *secret, size_t n, fuser_err *err)
{
    char why[128];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    size_t got = 0;
    while (fd >= 0 && got < n) {
        ssize_t r = read(fd, secret + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (got < n)
        return fuser_fail(err, FUSER_E_CACHE, "cannot read random bytes for the cache's secret from "
                          "/dev/urandom: %s", fuser_cache_errtext(e, why, sizeof why));
    return FUSER_OK;
}

/* Make the secret at `path` unless another process made one first: a temporary file linked to the name,
 * which (unlike rename) never replaces a file that is there. */
static int make_secret(const char *path, fuser_err *err)
{
    unsigned char secret[FUSER_CACHE_SECRET_BYTES];
    char tmp[PATH_BYTES + 16], why[128];
    const char *step;
    int rc = random_bytes(secret, sizeof secret, err);
    if (rc != FUSER_OK)
        return rc;
    int e = write_temp(path, secret, sizeof secret, tmp, sizeof tmp, &step);
    if (!e) {
        if (link(tmp, path) != 0 && errno != EEXIST) {
            e = errno;
            step = "link";
        }
        unlink(tmp);
    }
    memset(secret, 0, sizeof secret);
    if (e)
        return fuser_fail(err, FUSER_E_CACHE, "cannot make the cache's secret %s (%s: %s)", path, step,
                          fuser_cache_errtext(e, why, sizeof why));
    sync_dir(path);
    return FUSER_OK;
}

int fuser_cache_secret(const char *root, int create, unsigned char secret[FUSER_CACHE_SECRET_BYTES],
                       fuser_err *err)
{
    char path[PATH_BYTES], why[128];
    if (snprintf(path, sizeof path, "%s/v%d/secret", root, FUSER_CACHE_FORMAT) >= (int)sizeof path)
        return fuser_fail(err, FUSER_E_CACHE, "cache path too long under %s", root);
    for (int attempt = 0; attempt < 3; attempt++) {
        unsigned char *buf;
        size_t n;
        struct stat st;
        int e = fuser_cache_read_file(path, FUSER_CACHE_SECRET_BYTES + 1, &buf, &n, &st, why, sizeof why);
        if (!e && n == FUSER_CACHE_SECRET_BYTES && !(st.st_mode & 077)) {
            memcpy(secret, buf, FUSER_CACHE_SECRET_BYTES);
            free(buf);
            return FUSER_OK;
        }
        free(buf);
        if (!e)
            snprintf(why, sizeof why, "%zu bytes with mode %03o; a secret is %d bytes, mode 600", n,
                     (unsigned)(st.st_mode & 0777), FUSER_CACHE_SECRET_BYTES);
        if (!create)
            return fuser_fail(err, FUSER_E_CACHE, e == ENOENT ? "no secret %s yet" : "cannot use the secret %s: %s",
                              path, why);
        if (e == EPERM || !e) /* invalid: replace it (every entry MAC'd under it becomes a miss) */
            fuser_cache_drop(path, &st);
        else if (e != ENOENT && e != ELOOP)
            return fuser_fail(err, FUSER_E_CACHE, "cannot use the secret %s: %s", path, why);
        else if (e == ELOOP)
            unlink(path);
        int rc = fuser_cache_make_dirs(path, 0, err);
        if (rc == FUSER_OK)
            rc = make_secret(path, err);
        if (rc != FUSER_OK)
            return rc;
    }
    return fuser_fail(err, FUSER_E_CACHE, "cannot settle the cache's secret %s (other processes keep replacing it)",
                      path);
}
