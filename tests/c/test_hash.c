/* test_hash.c: SHA-256 against the FIPS 180-4 / NIST CSHA256 example vectors, at padding boundaries,
 * and for every way of splitting the input across update() calls. */
#include <stdlib.h>

#include "ctest.h"
#include "fuser/hash.h"

static void hex_of(const void *data, size_t n, char out[FUSER_SHA256_HEX])
{
    unsigned char d[FUSER_SHA256_BYTES];
    fuser_sha256(data, n, d);
    fuser_sha256_hex(d, out);
}

static int digest_is(const void *data, size_t n, const char *want)
{
    char hex[FUSER_SHA256_HEX];
    hex_of(data, n, hex);
    if (strcmp(hex, want))
        fprintf(stderr, "sha256 of %zu bytes: got %s, want %s\n", n, hex, want);
    return !strcmp(hex, want);
}

void test_sha256_vectors(void)
{
    /* the NIST example messages (FIPS 180-2 appendix B, "SHA-256 examples") */
    static const struct { const char *msg; const char *hex; } v[] = {
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmn"
         "opqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        CHECK(digest_is(v[i].msg, strlen(v[i].msg), v[i].hex));
    CHECK(digest_is(NULL, 0, v[1].hex));

    /* one million 'a' (the long NIST message), fed in uneven pieces */
    enum { MILLION = 1000000 };
    char *a = malloc(MILLION);
    CHECK(a != NULL);
    if (!a)
        return;
    memset(a, 'a', MILLION);
    CHECK(digest_is(a, MILLION, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));
    fuser_sha256_ctx s;
    fuser_sha256_init(&s);
    for (size_t off = 0, step = 1; off < MILLION; off += step, step = step * 3 % 997 + 1)
        fuser_sha256_update(&s, a + off, off + step > MILLION ? MILLION - off : step);
    unsigned char d[FUSER_SHA256_BYTES];
    char hex[FUSER_SHA256_HEX];
    fuser_sha256_final(&s, d);
    fuser_sha256_hex(d, hex);
    CHECK(!strcmp(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"));

    /* lengths around the padding boundaries (55/56 bytes: one or two final blocks); values from
     * Python's hashlib */
    static const struct { size_t n; const char *hex; } edge[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
    };
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        CHECK(digest_is(a, edge[i].n, edge[i].hex));
    free(a);
}

void test_sha256_splits(void)
{
    /* every split point of a 200-byte message into two update() calls gives the one-shot digest */
    unsigned char msg[200], want[FUSER_SHA256_BYTES], got[FUSER_SHA256_BYTES];
    for (int i = 0; i < 200; i++)
        msg[i] = (unsigned char)(i * 37 + 11);
    fuser_sha256(msg, sizeof msg, want);
    int same = 1;
    for (size_t cut = 0; cut <= sizeof msg; cut++) {
        fuser_sha256_ctx s;
        fuser_sha256_init(&s);
        fuser_sha256_update(&s, msg, cut);
        fuser_sha256_update(&s, NULL, 0);
        fuser_sha256_update(&s, msg + cut, sizeof msg - cut);
        fuser_sha256_final(&s, got);
        same &= !memcmp(got, want, sizeof want);
    }
    CHECK(same);
    /* and a one-byte change changes it */
    msg[100] ^= 1;
    fuser_sha256(msg, sizeof msg, got);
    CHECK(memcmp(got, want, sizeof want) != 0);
}
