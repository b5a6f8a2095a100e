/* test_cache.c: the kernel cache without NVRTC: key recipe, entry encode/decode, and the disk side
 * (round trip, truncated, byte-flipped, wrong magic/version/key, bad alias, unwritable directory, a
 * full disk) in a temporary $FUSER_CACHE_DIR. Every rejected file must be deleted, never loaded.
 * test_cache_safety.c covers what an attacker or an odd file system could put in the cache's way. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, setenv, truncate */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctest.h"
#include "fuser/cache.h"
#include "fuser/cuda.h"
#include "test_cache.h"

/* The secret entries are MAC'd under in the tests that need no directory. */
static const unsigned char test_secret[FUSER_CACHE_SECRET_BYTES] = "0123456789abcdef0123456789abcdef";

static const char *const log_text =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'probe' for 'sm_90a'\n"
    "ptxas info    : Function properties for probe\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 10 registers, used 1 barriers, 512 bytes smem\n";

/* A module as fuser_jit_compile would return it (the bytes are not a real CUBIN: nothing here loads it). */
void make_cubin(fuser_cubin *c, size_t size)
{
    memset(c, 0, sizeof *c);
    c->data = malloc(size);
    for (size_t i = 0; i < size; i++)
        c->data[i] = (unsigned char)(i * 7 + 3);
    c->size = size;
    c->log = malloc(strlen(log_text) + 1);
    strcpy(c->log, log_text);
    c->log_size = strlen(log_text);
    fuser_jit_parse_log(c->log, c, NULL);
}

void make_meta(fuser_cache_meta *m, const char *source)
{
    memset(m, 0, sizeof *m);
    m->nvrtc_major = 13;
    fuser_cache_key(source, "t.cu", NULL, 0, fuser_embedded_headers, fuser_embedded_header_count, 13, 0, m->key,
                    NULL);
    fuser_cache_key(source, "t.cu", NULL, 0, fuser_embedded_headers, fuser_embedded_header_count,
                    FUSER_CACHE_ANY_NVRTC, 0, m->any_key, NULL);
}

static void key_of(const char *src, const char *name, const char *opt, const fuser_embedded_file *h, int nh,
                   int major, char key[FUSER_SHA256_HEX])
{
    const char *opts[1] = {opt};
    fuser_err err;
    fuser_err_clear(&err);
    CHECK(fuser_cache_key(src, name, opts, opt ? 1 : 0, h, nh, major, 0, key, &err) == FUSER_OK);
}

void test_cache_key(void)
{
    char base[FUSER_SHA256_HEX], k[FUSER_SHA256_HEX];
    const fuser_embedded_file *h = fuser_embedded_headers;
    key_of("src", "a.cu", NULL, h, 2, 13, base);
    CHECK(strlen(base) == 64);
    key_of("src", "a.cu", NULL, h, 2, 13, k);
    CHECK(!strcmp(k, base)); /* deterministic */
    key_of("src ", "a.cu", NULL, h, 2, 13, k);
    CHECK(strcmp(k, base)); /* source */
    key_of("src", "b.cu", NULL, h, 2, 13, k);
    CHECK(strcmp(k, base)); /* name */
    key_of("src", "a.cu", "-lineinfo", h, 2, 13, k);
    CHECK(strcmp(k, base)); /* options */
    key_of("src", "a.cu", NULL, h, 2, 12, k);
    CHECK(strcmp(k, base)); /* NVRTC version */
    key_of("src", "a.cu", NULL, h, 2, FUSER_CACHE_ANY_NVRTC, k);
    CHECK(strcmp(k, base)); /* the alias key is another key */
    key_of("src", "a.cu", NULL, h, 1, 13, k);
    CHECK(strcmp(k, base)); /* a header less */
    fuser_embedded_file edited[2] = {h[0], h[1]}, swapped[2] = {h[1], h[0]};
    edited[1].data = "#pragma once\nnamespace fuser {} \n";
    key_of("src", "a.cu", NULL, edited, 2, 13, k);
    CHECK(strcmp(k, base)); /* header bytes */
    edited[1] = h[1];
    edited[1].name = "fuser/device/Common.cuh";
    key_of("src", "a.cu", NULL, edited, 2, 13, k);
    CHECK(strcmp(k, base)); /* header name */
    key_of("src", "a.cu", NULL, swapped, 2, 13, k);
    CHECK(!strcmp(k, base)); /* canonical: the table's order does not matter */
    /* item boundaries are unambiguous: moving a byte from the name into the source changes the key */
    key_of("xsrc", "a.c", NULL, h, 2, 13, base);
    key_of("src", "a.cx", NULL, h, 2, 13, k);
    CHECK(strcmp(k, base));
}

void test_cache_entry_format(void)
{
    fuser_cubin c, back;
    fuser_cache_meta m, mb;
    fuser_err err;
    unsigned char *buf;
    size_t n;
    make_cubin(&c, 1000);
    make_meta(&m, "entry");
    CHECK(c.registers == 10 && c.smem_bytes == 512 && c.n_kernels == 1);
    CHECK(fuser_cache_encode(&c, &m, test_secret, &buf, &n, &err) == FUSER_OK);
    CHECK(n == FUSER_CACHE_HEADER_BYTES + 1000 + strlen(log_text) && !memcmp(buf, "FUSERKC", 8));
    CHECK(fuser_cache_decode(buf, n, test_secret, &back, &mb, &err) == FUSER_OK);
    CHECK(back.size == 1000 && !memcmp(back.data, c.data, 1000) && !strcmp(back.log, log_text));
    CHECK(back.registers == 10 && back.smem_bytes == 512 && back.spill_store_bytes == 0);
    CHECK(back.n_kernels == 1 && !strcmp(back.kernels[0].name, "probe"));
    CHECK(!strcmp(mb.key, m.key) && !strcmp(mb.any_key, m.any_key) && mb.nvrtc_major == 13);
    fuser_cubin_free(&back);

    /* every truncation and every single-byte flip is rejected */
    int rejected = 0, total = 0;
    for (size_t len = 0; len < n; len += len < 300 ? 1 : 97, total++)
        rejected += fuser_cache_decode(buf, len, test_secret, &back, &mb, &err) == FUSER_E_CACHE;
    CHECK(rejected == total);
    rejected = total = 0;
    for (size_t at = 0; at < n; at += at < 300 ? 1 : 89, total++) {
        buf[at] ^= 0x20;
        rejected += fuser_cache_decode(buf, n, test_secret, &back, &mb, &err) == FUSER_E_CACHE;
        buf[at] ^= 0x20;
    }
    CHECK(rejected == total);
    CHECK(back.data == NULL && back.log == NULL); /* a rejected entry leaves nothing behind */
    unsigned char other_secret[FUSER_CACHE_SECRET_BYTES];
    memcpy(other_secret, test_secret, sizeof other_secret);
    other_secret[31] ^= 1; /* an intact entry under another cache's secret */
    CHECK(fuser_cache_decode(buf, n, other_secret, &back, &mb, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "MAC mismatch");
    buf[0] = 'X';
    CHECK(fuser_cache_decode(buf, n, test_secret, &back, &mb, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "bad magic");
    buf[0] = 'F';
    buf[8] = 1; /* format 1: checksummed, not MAC'd */
    CHECK(fuser_cache_decode(buf, n, test_secret, &back, &mb, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "format 1");
    buf[8] = 3; /* a future format */
    CHECK(fuser_cache_decode(buf, n, test_secret, &back, &mb, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "format 3");
    buf[8] = FUSER_CACHE_FORMAT;
    CHECK(fuser_cache_decode(buf, n - 1, test_secret, &back, &mb, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "sizes do not add up");
    buf[n - 1] ^= 1;
    CHECK(fuser_cache_decode(buf, n, test_secret, &back, &mb, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "MAC mismatch");
    free(buf);
    fuser_cubin_free(&c);
}

/* ---- on disk ---- */

/* Count the files under dir (recursively) whose name contains `part`; remove them all when `rm`. */
int walk(const char *dir, const char *part, int rm)
{
    DIR *d = opendir(dir);
    int count = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
            count += walk(path, part, rm);
            if (rm)
                rmdir(path);
        } else {
            count += strstr(e->d_name, part) != NULL;
            if (rm)
                unlink(path);
        }
    }
    if (d)
        closedir(d);
    return count;
}

void write_bytes(const char *path, const unsigned char *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

int load_rejects(const char *root, const char *key, const char *path, const char *why)
{
    fuser_cubin out;
    fuser_cache_meta m;
    fuser_err err;
    fuser_err_clear(&err);
    int rc = fuser_cache_load(root, key, 0, &out, &m, &err);
    fuser_cubin_free(&out);
    int ok = rc == FUSER_E_CACHE && strstr(err.msg, why) && strstr(err.msg, "deleted") && access(path, F_OK) != 0;
    if (!ok)
        fprintf(stderr, "expected a deleted invalid entry (%s), got %d: %s\n", why, rc, err.msg);
    return ok;
}

void test_cache_disk(void)
{
    char root[] = "/tmp/fuser-ctest-XXXXXX", path[2048], alias[2048];
    CHECK(mkdtemp(root) != NULL);
    setenv("FUSER_CACHE_DIR", root, 1);
    char dir[FUSER_CACHE_DIR_MAX];
    CHECK(fuser_cache_dir(dir, NULL, NULL) == FUSER_OK && !strcmp(dir, root));

    fuser_cubin c, out;
    fuser_cache_meta m, got;
    fuser_err err;
    fuser_err_clear(&err);
    make_cubin(&c, 4096);
    make_meta(&m, "disk");
    CHECK(fuser_cache_load(root, m.key, 0, &out, &got, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "no entry");
    CHECK(fuser_cache_store(root, &m, &c, &err) == FUSER_OK);
    fuser_cache_path(root, m.key, ".fzk", path, sizeof path);
    fuser_cache_path(root, m.any_key, ".fza", alias, sizeof alias);
    char want[2048];
    snprintf(want, sizeof want, "%s/v2/%.2s/%s.fzk", root, m.key, m.key);
    CHECK(!strcmp(path, want) && access(path, R_OK) == 0 && access(alias, R_OK) == 0);
    CHECK(fuser_cache_load(root, m.key, 0, &out, &got, &err) == FUSER_OK);
    CHECK(out.size == 4096 && !memcmp(out.data, c.data, 4096) && out.registers == 10 && !strcmp(got.key, m.key));
    fuser_cubin_free(&out);
    CHECK(fuser_cache_load(root, m.any_key, 1, &out, &got, &err) == FUSER_OK && !strcmp(got.key, m.key));
    fuser_cubin_free(&out);

    unsigned char *buf, secret[FUSER_CACHE_SECRET_BYTES];
    size_t n;
    CHECK(fuser_cache_secret(root, 0, secret, &err) == FUSER_OK); /* made by the first store */
    fuser_cache_encode(&c, &m, secret, &buf, &n, &err);
    write_bytes(path, buf, n / 2); /* truncated */
    CHECK(load_rejects(root, m.key, path, "sizes do not add up"));
    write_bytes(path, buf, 100); /* shorter than the header */
    CHECK(load_rejects(root, m.key, path, "truncated"));
    buf[FUSER_CACHE_HEADER_BYTES + 2000] ^= 0x10; /* a flipped byte in the CUBIN */
    write_bytes(path, buf, n);
    CHECK(load_rejects(root, m.key, path, "MAC mismatch"));
    buf[FUSER_CACHE_HEADER_BYTES + 2000] ^= 0x10;
    buf[1] = 'u'; /* wrong magic */
    write_bytes(path, buf, n);
    CHECK(load_rejects(root, m.key, path, "bad magic"));
    buf[1] = 'U';
    char other[2048]; /* a valid entry under another key's name */
    fuser_cache_meta m2;
    make_meta(&m2, "another");
    fuser_cache_path(root, m2.key, ".fzk", other, sizeof other);
    CHECK(fuser_cache_store(root, &m2, &c, &err) == FUSER_OK && fuser_cache_store(root, &m, &c, &err) == FUSER_OK);
    CHECK(rename(path, other) == 0);
    CHECK(load_rejects(root, m2.key, other, "another key"));
    write_bytes(alias, (const unsigned char *)"not a key\n", 10); /* a bad alias */
    CHECK(fuser_cache_load(root, m.any_key, 1, &out, &got, &err) == FUSER_E_CACHE && access(alias, F_OK) != 0);
    CHECK_ERR(&err, FUSER_E_CACHE, "invalid alias");
    CHECK(walk(root, ".fzk.", 0) == 0); /* no temporary files */
    free(buf);

    /* an unusable directory: a regular file where a directory should be */
    char blocked[2048];
    snprintf(blocked, sizeof blocked, "%s/file", root);
    write_bytes(blocked, (const unsigned char *)"x", 1);
    CHECK(fuser_cache_store(blocked, &m, &c, &err) == FUSER_E_CACHE);
    CHECK_ERR(&err, FUSER_E_CACHE, "cannot create the cache directory");

    /* a full disk (a file-size limit makes write() fail part way): no temporary file is left */
    struct rlimit old, small;
    getrlimit(RLIMIT_FSIZE, &old);
    small = old;
    small.rlim_cur = 1000;
    signal(SIGXFSZ, SIG_IGN);
    walk(root, "", 1);
    if (setrlimit(RLIMIT_FSIZE, &small) == 0) {
        CHECK(fuser_cache_store(root, &m, &c, &err) == FUSER_E_CACHE);
        CHECK_ERR(&err, FUSER_E_CACHE, "(write: File too large)");
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(walk(root, "", 0) == 1 && walk(root, "secret", 0) == 1); /* the (small) secret only */
    }
    fuser_cubin_free(&c);
    walk(root, "", 1);
    rmdir(root);
    unsetenv("FUSER_CACHE_DIR");
}
