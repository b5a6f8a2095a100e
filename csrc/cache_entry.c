/* cache_entry.c: the kernel cache's key recipe and entry format, MAC included (see
 * include/fuser/cache.h). Pure functions over memory: no files, no environment, no global state. The
 * disk side is cache.c and cache_fs.c. */
#include "fuser/cache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char magic[8] = "FUSERKC"; /* 7 letters and a NUL */

/* ---- key ---- */

/* One serialized item: its length (8 bytes, little endian), then its bytes: `prefix` then data[0..n). */
static void item(fuser_sha256_ctx *s, const char *prefix, const void *data, size_t n)
{
    size_t np = strlen(prefix);
    unsigned char len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (unsigned char)((uint64_t)(np + n) >> (8 * i));
    fuser_sha256_update(s, len, 8);
    fuser_sha256_update(s, prefix, np);
    fuser_sha256_update(s, data, n);
}

static void item_str(fuser_sha256_ctx *s, const char *prefix, const char *text)
{
    item(s, prefix, text, strlen(text));
}

static void item_int(fuser_sha256_ctx *s, const char *prefix, int v)
{
    char buf[16];
    snprintf(buf, sizeof buf, "%d", v);
    item_str(s, prefix, buf);
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const fuser_embedded_file *const *)a)->name, (*(const fuser_embedded_file *const *)b)->name);
}

int fuser_cache_key(const char *source, const char *name, const char *const *extra_opts, int n_extra,
                    const fuser_embedded_file *headers, int nheaders, int nvrtc_major, int nvrtc_minor,
                    char key[FUSER_SHA256_HEX], fuser_err *err)
{
    const char *opts[FUSER_JIT_MAX_OPTIONS];
    int nopts = fuser_jit_options(extra_opts, n_extra, opts, FUSER_JIT_MAX_OPTIONS);
    if (nopts < 0)
        return fuser_fail(err, FUSER_E_VALUE, "too many NVRTC options: %d", n_extra);
    const fuser_embedded_file **sorted = malloc((size_t)(nheaders > 0 ? nheaders : 1) * sizeof *sorted);
    if (!sorted)
        return fuser_fail(err, FUSER_E_NOMEM, "out of memory computing a cache key");
    for (int i = 0; i < nheaders; i++)
        sorted[i] = &headers[i];
    qsort(sorted, (size_t)nheaders, sizeof *sorted, by_name);

    fuser_sha256_ctx s;
    fuser_sha256_init(&s);
    item_str(&s, "", "fuser kernel cache");
    item_int(&s, "format=", FUSER_CACHE_FORMAT);
    item_str(&s, "arch=", FUSER_JIT_ARCH);
    if (nvrtc_major == FUSER_CACHE_ANY_NVRTC) {
        item_str(&s, "nvrtc=", "any");
    } else {
        char version[32];
        snprintf(version, sizeof version, "%d.%d", nvrtc_major, nvrtc_minor);
        item_str(&s, "nvrtc=", version);
    }
    item_str(&s, "name=", name);
    item_str(&s, "", source);
    item_int(&s, "options=", nopts);
    for (int i = 0; i < nopts; i++)
        item_str(&s, "", opts[i]);
    item_int(&s, "headers=", nheaders);
    for (int i = 0; i < nheaders; i++) {
        item_str(&s, "", sorted[i]->name);
        item(&s, "", sorted[i]->data, sorted[i]->size);
    }
    free(sorted);
    unsigned char digest[FUSER_SHA256_BYTES];
    fuser_sha256_final(&s, digest);
    fuser_sha256_hex(digest, key);
    return FUSER_OK;
}

/* ---- entry ---- */

/* Header field offsets (cache.h draws the layout). */
enum {
    OFF_MAGIC = 0, OFF_VERSION = 8, OFF_HEADER_SIZE = 12, OFF_CUBIN_SIZE = 16, OFF_LOG_SIZE = 24,
    OFF_RES = 32, OFF_NVRTC = 48, OFF_KEY = 64, OFF_ANY_KEY = 128, OFF_SUM = 224,
    KEY_HEX = FUSER_SHA256_HEX - 1,
};
_Static_assert(OFF_SUM + FUSER_SHA256_BYTES == FUSER_CACHE_HEADER_BYTES, "header layout");

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t get_le(const unsigned char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* The MAC: HMAC-SHA256 (RFC 2104) under the cache's secret of header bytes [0, OFF_SUM), then the
 * payload. Unlike a plain checksum, which anyone can recompute after editing an entry (for instance
 * relabelling it with another key), it can only be made by whoever holds the secret. */
static void entry_mac(const unsigned char secret[FUSER_CACHE_SECRET_BYTES], const unsigned char *header,
                      const void *cubin, size_t ncubin, const void *log, size_t nlog,
                      unsigned char out[FUSER_SHA256_BYTES])
{
    enum { BLOCK = 64 }; /* SHA-256's block size; the 32-byte secret is zero-padded to it */
    _Static_assert(FUSER_CACHE_SECRET_BYTES <= BLOCK, "the secret fits one block");
    unsigned char ipad[BLOCK], opad[BLOCK], inner[FUSER_SHA256_BYTES];
    memset(ipad, 0x36, sizeof ipad);
    memset(opad, 0x5c, sizeof opad);
    for (int i = 0; i < FUSER_CACHE_SECRET_BYTES; i++) {
        ipad[i] ^= secret[i];
        opad[i] ^= secret[i];
    }
    fuser_sha256_ctx s;
    fuser_sha256_init(&s);
    fuser_sha256_update(&s, ipad, sizeof ipad);
    fuser_sha256_update(&s, header, OFF_SUM);
    fuser_sha256_update(&s, cubin, ncubin);
    fuser_sha256_update(&s, log, nlog);
    fuser_sha256_final(&s, inner);
    fuser_sha256_init(&s);
    fuser_sha256_update(&s, opad, sizeof opad);
    fuser_sha256_update(&s, inner, sizeof inner);
    fuser_sha256_final(&s, out);
}

int fuser_cache_encode(const fuser_cubin *c, const fuser_cache_meta *m,
                       const unsigned char secret[FUSER_CACHE_SECRET_BYTES], unsigned char **buf, size_t *n,
                       fuser_err *err)
{
    size_t nlog = c->log ? c->log_size : 0;
    *n = FUSER_CACHE_HEADER_BYTES + c->size + nlog;
    unsigned char *b = *buf = calloc(1, *n);
    if (!b)
        return fuser_fail(err, FUSER_E_NOMEM, "out of memory encoding a %zu-byte cache entry", *n);
    memcpy(b + OFF_MAGIC, magic, sizeof magic);
    put_le(b + OFF_VERSION, FUSER_CACHE_FORMAT, 4);
    put_le(b + OFF_HEADER_SIZE, FUSER_CACHE_HEADER_BYTES, 4);
    put_le(b + OFF_CUBIN_SIZE, c->size, 8);
    put_le(b + OFF_LOG_SIZE, nlog, 8);
    const int res[6] = {c->registers, c->spill_store_bytes, c->spill_load_bytes, c->smem_bytes, m->nvrtc_major,
                        m->nvrtc_minor};
    for (int i = 0; i < 6; i++)
        put_le(b + OFF_RES + 4 * i, (uint32_t)res[i], 4);
    memcpy(b + OFF_KEY, m->key, KEY_HEX);
    memcpy(b + OFF_ANY_KEY, m->any_key, KEY_HEX);
    if (c->size)
        memcpy(b + FUSER_CACHE_HEADER_BYTES, c->data, c->size);
    if (nlog)
        memcpy(b + FUSER_CACHE_HEADER_BYTES + c->size, c->log, nlog);
    entry_mac(secret, b, b + FUSER_CACHE_HEADER_BYTES, c->size, b + FUSER_CACHE_HEADER_BYTES + c->size, nlog,
              b + OFF_SUM);
    return FUSER_OK;
}

/* Why the header at b (n bytes of file) is not valid, or NULL when it is. */
static const char *check_header(const unsigned char *b, size_t n, const unsigned char *secret, char *why,
                                size_t nwhy)
{
    if (n < FUSER_CACHE_HEADER_BYTES) {
        snprintf(why, nwhy, "truncated: %zu bytes, shorter than the %d-byte header", n, FUSER_CACHE_HEADER_BYTES);
        return why;
    }
    if (memcmp(b + OFF_MAGIC, magic, sizeof magic))
        return "bad magic: not a fuser cache entry";
    uint64_t version = get_le(b + OFF_VERSION, 4), header = get_le(b + OFF_HEADER_SIZE, 4);
    uint64_t ncubin = get_le(b + OFF_CUBIN_SIZE, 8), nlog = get_le(b + OFF_LOG_SIZE, 8);
    if (version != FUSER_CACHE_FORMAT || header != FUSER_CACHE_HEADER_BYTES) {
        snprintf(why, nwhy, "format %llu with a %llu-byte header; this fuser reads format %d (%d bytes)",
                 (unsigned long long)version, (unsigned long long)header, FUSER_CACHE_FORMAT,
                 FUSER_CACHE_HEADER_BYTES);
        return why;
    }
    uint64_t room = n - FUSER_CACHE_HEADER_BYTES;
    if (ncubin > room || nlog != room - ncubin) {
        snprintf(why, nwhy, "sizes do not add up: the header says %llu + %llu payload bytes, the file has %llu",
                 (unsigned long long)ncubin, (unsigned long long)nlog, (unsigned long long)room);
        return why;
    }
    unsigned char sum[FUSER_SHA256_BYTES];
    entry_mac(secret, b, b + FUSER_CACHE_HEADER_BYTES, ncubin, b + FUSER_CACHE_HEADER_BYTES + ncubin, nlog, sum);
    if (memcmp(sum, b + OFF_SUM, sizeof sum))
        return "MAC mismatch: the file is corrupted, or was not written by a fuser holding this cache's secret";
    return NULL;
}

int fuser_cache_decode(const unsigned char *b, size_t n, const unsigned char secret[FUSER_CACHE_SECRET_BYTES],
                       fuser_cubin *out, fuser_cache_meta *m, fuser_err *err)
{
    char why[256];
    memset(out, 0, sizeof *out);
    memset(m, 0, sizeof *m);
    const char *bad = check_header(b, n, secret, why, sizeof why);
    if (bad)
        return fuser_fail(err, FUSER_E_CACHE, "%s", bad);
    size_t ncubin = (size_t)get_le(b + OFF_CUBIN_SIZE, 8), nlog = (size_t)get_le(b + OFF_LOG_SIZE, 8);
    out->data = malloc(ncubin ? ncubin : 1);
    out->log = malloc(nlog + 1);
    if (!out->data || !out->log) {
        fuser_cubin_free(out);
        return fuser_fail(err, FUSER_E_NOMEM, "out of memory reading a %zu-byte cache entry", n);
    }
    memcpy(out->data, b + FUSER_CACHE_HEADER_BYTES, ncubin);
    memcpy(out->log, b + FUSER_CACHE_HEADER_BYTES + ncubin, nlog);
    out->log[nlog] = '\0';
    out->size = ncubin;
    out->log_size = strlen(out->log);
    int rc = fuser_jit_parse_log(out->log, out, err); /* the kernel names */
    if (rc) {
        fuser_cubin_free(out);
        return rc;
    }
    int *res[6] = {&out->registers, &out->spill_store_bytes, &out->spill_load_bytes, &out->smem_bytes,
                   &m->nvrtc_major, &m->nvrtc_minor};
    for (int i = 0; i < 6; i++)
        *res[i] = (int)(uint32_t)get_le(b + OFF_RES + 4 * i, 4);
    memcpy(m->key, b + OFF_KEY, KEY_HEX);
    memcpy(m->any_key, b + OFF_ANY_KEY, KEY_HEX);
    return FUSER_OK;
}
