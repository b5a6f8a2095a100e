/* status.h: how the C core reports failure.
 *
 * Every fallible core function returns an int status (FUSER_OK or one of the codes below) and, on
 * failure, writes a human-readable message into the caller's fuser_err. The core never aborts, never
 * prints and never calls Python; the binding (python/) turns codes into Python exceptions:
 *
 *   FUSER_E_TYPE        -> TypeError     (wrong dtype, not a tensor)
 *   FUSER_E_VALUE       -> ValueError    (shapes, strides, devices, names, alignment)
 *   FUSER_E_UNSUPPORTED -> fuser.UnsupportedError (valid input the fused path cannot run)
 *   FUSER_E_CUDA        -> fuser.CudaError
 *   FUSER_E_COMPILE     -> fuser.CompileError (carries the NVRTC log)
 *   FUSER_E_CACHE       -> fuser.CacheError
 *   FUSER_E_NOMEM       -> MemoryError
 *   FUSER_E_INTERNAL    -> fuser.FuserError (a bug in fuser: please report it)
 */
#ifndef FUSER_STATUS_H
#define FUSER_STATUS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FUSER_OK = 0,
    FUSER_E_TYPE,
    FUSER_E_VALUE,
    FUSER_E_UNSUPPORTED,
    FUSER_E_CUDA,
    FUSER_E_COMPILE,
    FUSER_E_CACHE,
    FUSER_E_NOMEM,
    FUSER_E_INTERNAL,
};

#define FUSER_ERRMSG_MAX 1024

/* The error out-parameter of every fallible core call. Owned by the caller (usually on its stack), so
 * the core holds no error state of its own and is re-entrant. */
typedef struct fuser_err {
    int code;                    /* FUSER_OK while nothing failed */
    char msg[FUSER_ERRMSG_MAX];  /* NUL-terminated; says what was wrong and what to do */
} fuser_err;

/* Record a failure: sets err->code and formats err->msg (printf-style). Returns code, so callers can
 * write `return fuser_fail(err, FUSER_E_VALUE, "...", ...);`. err may be NULL. */
int fuser_fail(fuser_err *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Reset err to FUSER_OK with an empty message. */
void fuser_err_clear(fuser_err *err);

/* Bounded string copy and append (always NUL-terminate when n > 0); return the length they tried to
 * create, so `>= n` means truncated. */
size_t fuser_strlcpy(char *dst, const char *src, size_t n);
size_t fuser_strlcat(char *dst, const char *src, size_t n);

/* Short stable name of a status code ("value", "cuda", ...), for logs and tests. */
const char *fuser_status_name(int code);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_STATUS_H */
