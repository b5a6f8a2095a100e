/* status.c: error reporting for the C core (see include/fuser/status.h). No global state. */
#define _POSIX_C_SOURCE 200809L /* strnlen */
#include "fuser/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int fuser_fail(fuser_err *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->code = code;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

void fuser_err_clear(fuser_err *err)
{
    if (err) {
        err->code = FUSER_OK;
        err->msg[0] = '\0';
    }
}

const char *fuser_status_name(int code)
{
    static const char *const names[] = {
        [FUSER_OK] = "ok",
        [FUSER_E_TYPE] = "type",
        [FUSER_E_VALUE] = "value",
        [FUSER_E_UNSUPPORTED] = "unsupported",
        [FUSER_E_CUDA] = "cuda",
        [FUSER_E_COMPILE] = "compile",
        [FUSER_E_CACHE] = "cache",
        [FUSER_E_NOMEM] = "nomem",
        [FUSER_E_INTERNAL] = "internal",
    };
    if (code < 0 || (size_t)code >= sizeof names / sizeof names[0] || !names[code])
        return "unknown";
    return names[code];
}

size_t fuser_strlcpy(char *dst, const char *src, size_t n)
{
    size_t len = strlen(src);
    if (n) {
        size_t c = len < n - 1 ? len : n - 1;
        memcpy(dst, src, c);
        dst[c] = '\0';
    }
    return len;
}

size_t fuser_strlcat(char *dst, const char *src, size_t n)
{
    size_t have = strnlen(dst, n);
    return have == n ? n + strlen(src) : have + fuser_strlcpy(dst + have, src, n - have);
}
