/* test_cache_safety.c: what a hostile user or an odd file system can put in the kernel cache's way,
 * without NVRTC: a FIFO or a symbolic link in place of an entry, its alias or the secret (no hang, never
 * followed, a miss that the next store replaces); an entry relabelled with another key and a recomputed
 * checksum, or copied from another cache (not served: the MAC needs this cache's secret); a root that
 * another user owns or that others may write (refused: nothing read from or written to it); the choice
 * of the directory (never cut); and the one parser of boolean environment variables. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, mkfifo, symlink, lchown, setenv */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctest.h"
#include "fuser/cache.h"
#include "fuser/cuda.h"
#include "fuser/env.h"
#include "fuser/hash.h"
#include "test_cache.h"

/* NOTE: a load that blocks (opening a FIFO without O_NONBLOCK waits for a writer forever) must fail the
 * run, not hang it: SIGALRM's default action ends the process. */
#define NO_HANG_SECONDS 30

#define OTHER_UID 4242 /* a user that is not this one (chown to it needs root: skipped otherwise) */

static int load_status(const char *root, const char *key, int by_alias, fuser_err *err)
{
    fuser_cubin out;
    fuser_cache_meta m;
    fuser_err_clear(err);
    int rc = fuser_cache_load(root, key, by_alias, &out, &m, err);
    fuser_cubin_free(&out);
    return rc;
}

/* A module of `size` bytes compiled (as far as the cache can tell) from `source`, stored under root. */
static void store_one(const char *root, const char *source, size_t size, fuser_cubin *c, fuser_cache_meta *m)
{
    fuser_err err;
    fuser_err_clear(&err);
    make_cubin(c, size);
    make_meta(m, source);
    CHECK(fuser_cache_store(root, m, c, &err) == FUSER_OK);
}

/* The bytes of the file at path into buf[0..n); returns how many. */
static size_t read_bytes(const char *path, unsigned char *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    size_t got = f ? fread(buf, 1, n, f) : 0;
    if (f)
        fclose(f);
    return got;
}

static void secret_path(const char *root, char *path, size_t n)
{
    snprintf(path, n, "%s/v%d/secret", root, FUSER_CACHE_FORMAT);
}

void test_cache_special_files(void)
{
    char root[] = "/tmp/fuser-ctest-XXXXXX", path[2048], alias[2048], secret[2048], elsewhere[2048];
    CHECK(mkdtemp(root) != NULL);
    fuser_cubin c;
    fuser_cache_meta m;
    fuser_err err;
    store_one(root, "special files", 2048, &c, &m);
    fuser_cache_path(root, m.key, ".fzk", path, sizeof path);
    fuser_cache_path(root, m.any_key, ".fza", alias, sizeof alias);
    secret_path(root, secret, sizeof secret);

    alarm(NO_HANG_SECONDS);
    /* a FIFO in place of the entry: a miss at once, and the next store replaces it */
    CHECK(unlink(path) == 0 && mkfifo(path, 0600) == 0);
    CHECK(load_status(root, m.key, 0, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "not a regular file");
    CHECK(fuser_cache_store(root, &m, &c, &err) == FUSER_OK && load_status(root, m.key, 0, &err) == FUSER_OK);
    /* in place of the alias */
    CHECK(unlink(alias) == 0 && mkfifo(alias, 0600) == 0);
    CHECK(load_status(root, m.any_key, 1, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "not a regular file");
    /* in place of the secret: a miss; a store makes a new secret (so the old entries are misses) */
    CHECK(unlink(secret) == 0 && mkfifo(secret, 0600) == 0);
    CHECK(load_status(root, m.key, 0, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "cannot use the secret");
    CHECK(fuser_cache_store(root, &m, &c, &err) == FUSER_OK && load_status(root, m.key, 0, &err) == FUSER_OK);
    alarm(0);

    /* a symbolic link in place of the entry, to a valid entry of the same key: never followed */
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere.fzk", root);
    CHECK(rename(path, elsewhere) == 0 && symlink(elsewhere, path) == 0);
    CHECK(load_status(root, m.key, 0, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "a symbolic link");
    struct stat st;
    CHECK(fuser_cache_store(root, &m, &c, &err) == FUSER_OK); /* replaces the link, not its target */
    CHECK(lstat(path, &st) == 0 && S_ISREG(st.st_mode) && load_status(root, m.key, 0, &err) == FUSER_OK);
    /* in place of the secret: not followed either */
    CHECK(rename(secret, elsewhere) == 0 && symlink(elsewhere, secret) == 0);
    CHECK(load_status(root, m.key, 0, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "a symbolic link");

    /* what the cache writes is private: entries and the secret 0600, directories 0700 */
    CHECK(fuser_cache_store(root, &m, &c, &err) == FUSER_OK);
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK(lstat(secret, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0600 && st.st_size == 32);
    char dir[2048];
    snprintf(dir, sizeof dir, "%s/v%d", root, FUSER_CACHE_FORMAT);
    CHECK(stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700);

    /* a file of another user's in place of the entry: not used */
    if (geteuid() == 0 && chown(path, OTHER_UID, OTHER_UID) == 0) {
        CHECK(load_status(root, m.key, 0, &err) == FUSER_E_CACHE);
        CHECK_ERR(&err, FUSER_E_CACHE, "owned by uid 4242");
    }
    fuser_cubin_free(&c);
    walk(root, "", 1);
    rmdir(root);
}

/* The entry of key A rewritten as the entry of key B, its checksum field recomputed the way format 1
 * made it (SHA-256 of header bytes [0, 224), the CUBIN and the log): anyone who can write the file can
 * do that, so only a MAC under a secret can refuse it. */
void test_cache_relabelled_entry(void)
{
    char root[] = "/tmp/fuser-ctest-XXXXXX", other[] = "/tmp/fuser-ctest-XXXXXX", a[2048], b[2048];
    CHECK(mkdtemp(root) != NULL && mkdtemp(other) != NULL);
    fuser_cubin c;
    fuser_cache_meta ma, mb;
    fuser_err err;
    fuser_err_clear(&err);
    store_one(root, "plan A", 3000, &c, &ma);
    make_meta(&mb, "plan B");
    fuser_cache_path(root, ma.key, ".fzk", a, sizeof a);
    fuser_cache_path(root, mb.key, ".fzk", b, sizeof b);

    unsigned char buf[8192];
    size_t n = read_bytes(a, buf, sizeof buf);
    CHECK(n > FUSER_CACHE_HEADER_BYTES);
    memcpy(buf + 64, mb.key, 64); /* the key and the "any NVRTC" key fields */
    memcpy(buf + 128, mb.any_key, 64);
    fuser_sha256_ctx s;
    fuser_sha256_init(&s);
    fuser_sha256_update(&s, buf, 224);
    fuser_sha256_update(&s, buf + FUSER_CACHE_HEADER_BYTES, n - FUSER_CACHE_HEADER_BYTES);
    fuser_sha256_final(&s, buf + 224);
    CHECK(fuser_cache_make_dirs(b, 0, &err) == FUSER_OK);
    write_bytes(b, buf, n);
    CHECK(load_rejects(root, mb.key, b, "MAC mismatch"));

    /* an intact entry copied from another cache (another secret) is a miss too */
    char from_other[2048];
    CHECK(fuser_cache_store(other, &mb, &c, &err) == FUSER_OK);
    fuser_cache_path(other, mb.key, ".fzk", from_other, sizeof from_other);
    write_bytes(b, buf, read_bytes(from_other, buf, sizeof buf));
    CHECK(load_rejects(root, mb.key, b, "MAC mismatch"));
    fuser_cubin_free(&c);
    walk(root, "", 1);
    walk(other, "", 1);
    rmdir(root);
    rmdir(other);
}

void test_cache_secret(void)
{
    char root[] = "/tmp/fuser-ctest-XXXXXX", other[] = "/tmp/fuser-ctest-XXXXXX", path[2048];
    CHECK(mkdtemp(root) != NULL && mkdtemp(other) != NULL);
    unsigned char s1[FUSER_CACHE_SECRET_BYTES], s2[FUSER_CACHE_SECRET_BYTES], s3[FUSER_CACHE_SECRET_BYTES];
    fuser_err err;
    fuser_err_clear(&err);
    CHECK(fuser_cache_secret(root, 0, s1, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "no secret");
    CHECK(fuser_cache_secret(root, 1, s1, &err) == FUSER_OK);
    CHECK(fuser_cache_secret(root, 0, s2, &err) == FUSER_OK && !memcmp(s1, s2, sizeof s1)); /* kept */
    CHECK(fuser_cache_secret(other, 1, s3, &err) == FUSER_OK && memcmp(s1, s3, sizeof s1)); /* random */

    /* an entry stored under it, then the secret made readable by others: refused, then replaced */
    fuser_cubin c;
    fuser_cache_meta m;
    store_one(root, "secret", 500, &c, &m);
    secret_path(root, path, sizeof path);
    CHECK(chmod(path, 0644) == 0);
    CHECK(fuser_cache_secret(root, 0, s2, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "mode 644");
    CHECK(fuser_cache_secret(root, 1, s2, &err) == FUSER_OK && memcmp(s1, s2, sizeof s1));
    char entry[2048];
    fuser_cache_path(root, m.key, ".fzk", entry, sizeof entry);
    CHECK(load_rejects(root, m.key, entry, "MAC mismatch")); /* MAC'd under the old secret: rebuilt */
    write_bytes(path, (const unsigned char *)"short", 5); /* a wrong size is replaced too */
    CHECK(chmod(path, 0600) == 0 && fuser_cache_secret(root, 1, s3, &err) == FUSER_OK && memcmp(s2, s3, sizeof s2));
    CHECK(walk(root, ".secret.", 0) == 0); /* no temporary file left */
    fuser_cubin_free(&c);
    walk(root, "", 1);
    walk(other, "", 1);
    rmdir(root);
    rmdir(other);
}

static int root_refused(const char *why)
{
    char root[FUSER_CACHE_DIR_MAX];
    fuser_err err;
    fuser_err_clear(&err);
    int ok = fuser_cache_root(root, 1, &err) == FUSER_E_CACHE && root[0] == '\0' && strstr(err.msg, why) &&
             strstr(err.msg, "$FUSER_CACHE_DIR");
    if (!ok)
        fprintf(stderr, "expected the root refused (%s), got %d: %s\n", why, err.code, err.msg);
    return ok;
}

/* A valid entry planted in a refused root is not served: fuser_compile_cached without NVRTC would
 * serve it through its alias from a root it may use. */
static void planted_entry_not_served(const char *dir)
{
    fuser_cubin c, out;
    fuser_cache_meta m;
    fuser_err err;
    store_one(dir, "planted", 700, &c, &m);
    setenv("FUSER_NVRTC", "/nonexistent/libnvrtc.so", 1);
    int rc = fuser_compile_cached("planted", "t.cu", NULL, 0, NULL, 0, &out, NULL, &err);
    int state = out.cache.state;
    fuser_cubin_free(&out);
    if (rc == FUSER_OK && state != FUSER_CACHE_HIT) /* NVRTC was loaded before: not testable here */
        goto done;
    CHECK(rc == FUSER_OK && state == FUSER_CACHE_HIT);
    CHECK(chmod(dir, 0777) == 0);
    rc = fuser_compile_cached("planted", "t.cu", NULL, 0, NULL, 0, &out, NULL, &err);
    CHECK(rc == FUSER_E_CUDA && out.data == NULL);
    CHECK_ERR(&err, FUSER_E_CUDA, "no disk cache was consulted");
    CHECK_ERR(&err, FUSER_E_CUDA, "writable by group or others");
    fuser_cubin_free(&out);
    CHECK(chmod(dir, 0700) == 0);
done:
    unsetenv("FUSER_NVRTC");
    fuser_cubin_free(&c);
}

void test_cache_root_checks(void)
{
    char base[] = "/tmp/fuser-ctest-XXXXXX", dir[2048], link[2048], root[FUSER_CACHE_DIR_MAX];
    CHECK(mkdtemp(base) != NULL);
    fuser_err err;
    fuser_err_clear(&err);
    unsetenv("FUSER_CACHE_DISABLE");
    snprintf(dir, sizeof dir, "%s/made/cache", base);
    setenv("FUSER_CACHE_DIR", dir, 1);
    struct stat st;
    CHECK(fuser_cache_root(root, 0, &err) == FUSER_OK && !strcmp(root, dir) && stat(dir, &st) != 0);
    CHECK(fuser_cache_root(root, 1, &err) == FUSER_OK && stat(dir, &st) == 0 && (st.st_mode & 0777) == 0700);
    snprintf(link, sizeof link, "%s/made", base);
    CHECK(stat(link, &st) == 0 && (st.st_mode & 0777) == 0700); /* the missing parents too */

    CHECK(chmod(dir, 0777) == 0 && root_refused("writable by group or others (mode 777)"));
    CHECK(chmod(dir, 01777) == 0 && root_refused("writable by group or others")); /* sticky, as /tmp */
    CHECK(chmod(dir, 0770) == 0 && root_refused("writable by group or others (mode 770)"));
    CHECK(chmod(dir, 0755) == 0 && fuser_cache_root(root, 1, &err) == FUSER_OK); /* readable is fine */
    CHECK(chmod(dir, 0700) == 0);
    planted_entry_not_served(dir);
    if (geteuid() == 0 && chown(dir, OTHER_UID, OTHER_UID) == 0) {
        CHECK(root_refused("is owned by uid 4242, not by this user (uid 0)"));
        CHECK(chown(dir, 0, 0) == 0);
    }
    /* a link in place of the root: followed when this user made it, refused when another did */
    snprintf(link, sizeof link, "%s/link", base);
    CHECK(symlink(dir, link) == 0);
    setenv("FUSER_CACHE_DIR", link, 1);
    CHECK(fuser_cache_root(root, 1, &err) == FUSER_OK && !strcmp(root, link));
    if (geteuid() == 0 && lchown(link, OTHER_UID, OTHER_UID) == 0)
        CHECK(root_refused("is a symbolic link owned by uid 4242"));
    /* a file in place of the root */
    snprintf(link, sizeof link, "%s/file", base);
    write_bytes(link, (const unsigned char *)"x", 1);
    setenv("FUSER_CACHE_DIR", link, 1);
    CHECK(root_refused("is not a directory"));
    unsetenv("FUSER_CACHE_DIR");
    walk(base, "", 1);
    rmdir(base);
}

/* ---- the environment ---- */

static void set_or_unset(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
}

/* The cache directory for these variables (NULL: unset), and the status. */
static int dir_for(const char *dir, const char *xdg, const char *home, const char *tmp, char *out,
                   const char **from, fuser_err *err)
{
    set_or_unset("FUSER_CACHE_DIR", dir);
    set_or_unset("XDG_CACHE_HOME", xdg);
    set_or_unset("HOME", home);
    set_or_unset("TMPDIR", tmp);
    fuser_err_clear(err);
    return fuser_cache_dir(out, from, err);
}

void test_cache_dir_choice(void)
{
    const char *names[] = {"FUSER_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "TMPDIR"};
    char *saved[4], dir[FUSER_CACHE_DIR_MAX], want[64], *long_path = malloc(1200);
    for (int i = 0; i < 4; i++)
        saved[i] = getenv(names[i]) ? strdup(getenv(names[i])) : NULL;
    const char *from;
    fuser_err err;
    CHECK(dir_for("/a/b", "/x", "/h", NULL, dir, &from, &err) == FUSER_OK && !strcmp(dir, "/a/b"));
    CHECK(!strcmp(from, "$FUSER_CACHE_DIR"));
    CHECK(dir_for(NULL, "/x", "/h", NULL, dir, &from, &err) == FUSER_OK && !strcmp(dir, "/x/fuser"));
    CHECK(dir_for(NULL, "relative", "/h", NULL, dir, &from, &err) == FUSER_OK && !strcmp(dir, "/h/.cache/fuser"));
    CHECK(!strcmp(from, "$HOME/.cache/fuser"));
    /* no HOME: a directory of this user's own, never a shared /tmp/.cache */
    snprintf(want, sizeof want, "/t/fuser-%lu", (unsigned long)geteuid());
    CHECK(dir_for(NULL, NULL, NULL, "/t", dir, &from, &err) == FUSER_OK && !strcmp(dir, want));
    snprintf(want, sizeof want, "/tmp/fuser-%lu", (unsigned long)geteuid());
    CHECK(dir_for(NULL, NULL, "", "relative", dir, &from, &err) == FUSER_OK && !strcmp(dir, want));
    CHECK(dir_for(NULL, NULL, NULL, NULL, dir, &from, &err) == FUSER_OK && !strcmp(dir, want));
    CHECK(!strcmp(from, "/tmp/fuser-<uid>"));

    /* a path that does not fit is an error naming the variable and the length, never a cut path */
    memset(long_path, 'a', 1199);
    long_path[0] = '/';
    long_path[1023] = '\0';
    CHECK(dir_for(long_path, NULL, "/h", NULL, dir, &from, &err) == FUSER_OK && strlen(dir) == 1023);
    long_path[1023] = 'a';
    long_path[1024] = '\0';
    CHECK(dir_for(long_path, NULL, "/h", NULL, dir, &from, &err) == FUSER_E_CACHE && dir[0] == '\0');
    CHECK_ERR(&err, FUSER_E_CACHE, "from $FUSER_CACHE_DIR is 1024 bytes long");
    long_path[1024] = 'a';
    long_path[1100] = '\0';
    CHECK(dir_for(NULL, NULL, long_path, NULL, dir, &from, &err) == FUSER_E_CACHE && dir[0] == '\0');
    CHECK_ERR(&err, FUSER_E_CACHE, "from $HOME/.cache/fuser is 1113 bytes long");
    fuser_env e; /* what fuser.env() shows: nothing rather than a cut path */
    setenv("FUSER_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    fuser_env_query(0, NULL, 0, &e);
    CHECK(e.cache_dir[0] == '\0');
    unsetenv("FUSER_LIBCUDA");
    for (int i = 0; i < 4; i++) {
        set_or_unset(names[i], saved[i]);
        free(saved[i]);
    }
    free(long_path);
}

void test_env_flags(void)
{
    const char *on[] = {"1", "true", "TRUE", "True", "yes", "Yes", "on", "ON"};
    const char *off[] = {"0", "false", "FALSE", "no", "No", "off", "OFF", ""};
    const char *bad[] = {"2", "-1", "flase", "yes please", " 1", "1 ", "enable", "disabled", "0x1", "y"};
    fuser_err err;
    int v;
    for (size_t i = 0; i < sizeof on / sizeof on[0]; i++)
        CHECK(fuser_parse_flag("FUSER_X", on[i], &v, &err) == FUSER_OK && v == 1);
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        CHECK(fuser_parse_flag("FUSER_X", off[i], &v, &err) == FUSER_OK && v == 0);
    CHECK(fuser_parse_flag("FUSER_X", NULL, &v, &err) == FUSER_OK && v == 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fuser_err_clear(&err);
        CHECK(fuser_parse_flag("FUSER_X", bad[i], &v, &err) == FUSER_E_VALUE && v == 0);
        char want[64];
        snprintf(want, sizeof want, "$FUSER_X='%s' is not a boolean", bad[i]);
        CHECK_ERR(&err, FUSER_E_VALUE, want);
        CHECK_ERR(&err, FUSER_E_VALUE, FUSER_FLAG_SPELLINGS);
    }
    char odd[200]; /* control characters are shown as '?', a long value is cut with "..." */
    memset(odd, 'z', sizeof odd - 1);
    odd[sizeof odd - 1] = '\0';
    odd[0] = '\n';
    CHECK(fuser_parse_flag("FUSER_X", odd, &v, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "='?zzz");
    CHECK_ERR(&err, FUSER_E_VALUE, "zzz...' is not");

    /* the cache switch reads the same parser: "false" keeps the cache on */
    setenv("FUSER_CACHE_DISABLE", "false", 1);
    CHECK(fuser_env_flag("FUSER_CACHE_DISABLE", &v, &err) == FUSER_OK && v == 0);
    setenv("FUSER_CACHE_DISABLE", "Yes", 1);
    CHECK(fuser_env_flag("FUSER_CACHE_DISABLE", &v, &err) == FUSER_OK && v == 1);
    setenv("FUSER_CACHE_DISABLE", "maybe", 1);
    fuser_cubin out;
    CHECK(fuser_compile_cached("x", "t.cu", NULL, 0, NULL, 0, &out, NULL, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "$FUSER_CACHE_DISABLE='maybe' is not a boolean");
    fuser_cubin_free(&out);
    unsetenv("FUSER_CACHE_DISABLE");
}
