/* jit.c: NVRTC compilation of generated CUDA source into an sm_90a CUBIN, and the reading of ptxas'
 * verbose report (registers, spills, shared memory per kernel). See include/fuser/jit.h.
 * No global state: each call creates and destroys its own NVRTC program. */
#include "fuser/jit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuser/embedded.h"

#define NVRTC_SUCCESS 0
/* How much of a failed compile's log goes into the error message (the message is bounded by
 * FUSER_ERRMSG_MAX; the whole log stays in fuser_cubin.log). */
#define LOG_EXCERPT 640

static const char *const base_options[] = {FUSER_JIT_BASE_OPTIONS};
#define N_BASE ((int)(sizeof base_options / sizeof base_options[0]))

int fuser_jit_options(const char *const *extra, int n_extra, const char **out, int max)
{
    if (n_extra < 0 || N_BASE + n_extra > max)
        return -1;
    for (int i = 0; i < N_BASE; i++)
        out[i] = base_options[i];
    for (int i = 0; i < n_extra; i++)
        out[N_BASE + i] = extra[i];
    return N_BASE + n_extra;
}

void fuser_cubin_free(fuser_cubin *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->n_kernels; i++)
        free(c->kernels[i].name);
    free(c->kernels);
    free(c->data);
    free(c->log);
    memset(c, 0, sizeof *c);
}

/* ---- ptxas' report ----
 * The lines read, as NVRTC 12.x/13.x print them with --ptxas-options=-v:
 *   ptxas info    : Compiling entry function 'probe' for 'sm_90a'
 *   ptxas info    : Function properties for probe
 *   ptxas         .     0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
 *   ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem
 * "Function properties" also names non-inlined device functions (no "Used" line follows). */

/* The first occurrence of `word` in line[0..len), or NULL. */
static const char *find(const char *line, size_t len, const char *word)
{
    size_t wl = strlen(word);
    for (size_t i = 0; i + wl <= len; i++)
        if (!memcmp(line + i, word, wl))
            return line + i;
    return NULL;
}

/* The decimal number that ends right before `word` in line[0..len), or -1. */
static int number_before(const char *line, size_t len, const char *word)
{
    const char *end = find(line, len, word), *start = end;
    if (!end)
        return -1;
    while (start > line && start[-1] >= '0' && start[-1] <= '9')
        start--;
    if (start == end)
        return -1;
    long v = 0;
    for (; start < end && v < 1000000000L; start++)
        v = v * 10 + (*start - '0');
    return (int)v;
}

/* The text after `marker` up to `stop` (or the end of the line), as a malloc'd string; NULL when the
 * marker is absent (or out of memory: *nomem is then set). */
static char *text_after(const char *line, size_t len, const char *marker, char stop, int *nomem)
{
    const char *s = find(line, len, marker), *e;
    if (!s)
        return NULL;
    s += strlen(marker);
    for (e = s; e < line + len && *e != stop && *e != '\r'; e++)
        ;
    char *t = malloc((size_t)(e - s) + 1);
    if (!t) {
        *nomem = 1;
        return NULL;
    }
    memcpy(t, s, (size_t)(e - s));
    t[e - s] = '\0';
    return t;
}

static int find_kernel(const fuser_cubin *c, const char *name)
{
    for (int i = 0; i < c->n_kernels; i++)
        if (!strcmp(c->kernels[i].name, name))
            return i;
    return -1;
}

/* Append a kernel named `name` (taking ownership); returns its index or -1 when out of memory. */
static int add_kernel(fuser_cubin *c, char *name)
{
    fuser_kernel_res *k = realloc(c->kernels, (size_t)(c->n_kernels + 1) * sizeof *k);
    if (!k) {
        free(name);
        return -1;
    }
    c->kernels = k;
    k[c->n_kernels] = (fuser_kernel_res){name, -1, -1, -1, -1, -1};
    return c->n_kernels++;
}

/* One line of the report; `entry` is the kernel being compiled, `props` whose properties follow
 * (-1: a device function). Returns -1 when out of memory. */
static int parse_line(fuser_cubin *c, const char *line, size_t len, int *entry, int *props)
{
    int nomem = 0, v;
    char *name;
    if ((name = text_after(line, len, "Compiling entry function '", '\'', &nomem))) {
        *entry = find_kernel(c, name);
        if (*entry >= 0)
            free(name);
        else if ((*entry = add_kernel(c, name)) < 0)
            return -1;
    } else if ((name = text_after(line, len, "Function properties for ", '\n', &nomem))) {
        *props = find_kernel(c, name);
        free(name);
    } else if ((v = number_before(line, len, " bytes spill stores")) >= 0) {
        int load = number_before(line, len, " bytes spill loads");
        c->spill_store_bytes += v;
        c->spill_load_bytes += load > 0 ? load : 0;
        if (*props >= 0) {
            c->kernels[*props].spill_store_bytes = v;
            c->kernels[*props].spill_load_bytes = load;
            c->kernels[*props].stack_bytes = number_before(line, len, " bytes stack frame");
        }
        *props = -1;
    } else if (*entry >= 0 && find(line, len, "Used ") && (v = number_before(line, len, " registers")) >= 0) {
        fuser_kernel_res *k = &c->kernels[*entry];
        int smem = number_before(line, len, " bytes smem");
        k->registers = v;
        k->smem_bytes = smem >= 0 ? smem : 0;
        c->registers = v > c->registers ? v : c->registers;
        c->smem_bytes = k->smem_bytes > c->smem_bytes ? k->smem_bytes : c->smem_bytes;
    }
    return nomem ? -1 : 0;
}

int fuser_jit_parse_log(const char *log, fuser_cubin *out, fuser_err *err)
{
    for (int i = 0; i < out->n_kernels; i++)
        free(out->kernels[i].name);
    free(out->kernels);
    out->kernels = NULL;
    out->n_kernels = 0;
    out->registers = out->spill_store_bytes = out->spill_load_bytes = out->smem_bytes = 0;
    int entry = -1, props = -1;
    for (const char *p = log; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (parse_line(out, p, len, &entry, &props))
            return fuser_fail(err, FUSER_E_NOMEM, "out of memory reading the ptxas report");
        p += len + (nl ? 1 : 0);
    }
    return FUSER_OK;
}

/* ---- compilation ---- */

/* Fetch the program log into out->log (always NUL-terminated when it returns 0). */
static int take_log(const fuser_nvrtc *rtc, fuser_nvrtc_program prog, fuser_cubin *out)
{
    size_t n = 0;
    if (rtc->nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS)
        n = 0;
    out->log = malloc(n + 1);
    if (!out->log)
        return -1;
    out->log[0] = '\0';
    if (n && rtc->nvrtcGetProgramLog(prog, out->log) != NVRTC_SUCCESS)
        out->log[0] = '\0';
    out->log[n] = '\0';
    out->log_size = strlen(out->log);
    return 0;
}

/* The failure message: what failed, then the start of the log, cut at a line end where possible. */
static int compile_failed(const fuser_nvrtc *rtc, int rc, const char *name, const fuser_cubin *out,
                          fuser_err *err)
{
    const char *log = out->log ? out->log : "";
    size_t n = out->log_size;
    const char *more = "";
    if (n > LOG_EXCERPT) {
        n = LOG_EXCERPT;
        while (n > LOG_EXCERPT / 2 && log[n - 1] != '\n')
            n--;
        more = "[... the full log is in CompileError.log]";
    }
    return fuser_fail(err, FUSER_E_COMPILE, "NVRTC %d.%d could not compile %s for %s (%s); the log says:\n%.*s%s",
                      rtc->major, rtc->minor, name, FUSER_JIT_ARCH, rtc->nvrtcGetErrorString(rc), (int)n, log,
                      more);
}

int fuser_jit_compile(const fuser_nvrtc *rtc, const char *source, const char *name, const char *const *extra_opts,
                      int n_extra, fuser_cubin *out, fuser_err *err)
{
    memset(out, 0, sizeof *out);
    const char *opts[FUSER_JIT_MAX_OPTIONS];
    int nopts = fuser_jit_options(extra_opts, n_extra, opts, FUSER_JIT_MAX_OPTIONS - 1);
    if (nopts < 0)
        return fuser_fail(err, FUSER_E_VALUE, "too many NVRTC options: %d given, at most %d", n_extra,
                          FUSER_JIT_MAX_OPTIONS - 1 - N_BASE);
    /* NOTE: NVRTC 12.9+ keeps its own in-process cache (with a driver present): a program compiled a
     * second time comes back without the ptxas report, so registers and spills would read 0 (seen on
     * the H200, NVRTC 13.0). fuser caches on disk itself; the option does not change the binary, so it
     * stays out of the cache key. */
    if (rtc->major > 12 || (rtc->major == 12 && rtc->minor >= 9))
        opts[nopts++] = "--no-cache";
    int nh = fuser_embedded_header_count;
    const char **hdr = malloc(2 * (size_t)(nh > 0 ? nh : 1) * sizeof *hdr);
    if (!hdr)
        return fuser_fail(err, FUSER_E_NOMEM, "out of memory preparing %s", name);
    for (int i = 0; i < nh; i++) {
        hdr[i] = fuser_embedded_headers[i].data;
        hdr[nh + i] = fuser_embedded_headers[i].name;
    }
    fuser_nvrtc_program prog = NULL;
    int rc = rtc->nvrtcCreateProgram(&prog, source, name, nh, hdr, hdr + nh);
    free(hdr);
    if (rc != NVRTC_SUCCESS)
        return fuser_fail(err, FUSER_E_COMPILE, "NVRTC could not create a program for %s: %s", name,
                          rtc->nvrtcGetErrorString(rc));
    int status = FUSER_OK;
    rc = rtc->nvrtcCompileProgram(prog, nopts, opts);
    if (take_log(rtc, prog, out))
        status = fuser_fail(err, FUSER_E_NOMEM, "out of memory reading the NVRTC log of %s", name);
    else if (rc != NVRTC_SUCCESS)
        status = compile_failed(rtc, rc, name, out, err);
    else if ((rc = rtc->nvrtcGetCUBINSize(prog, &out->size)) != NVRTC_SUCCESS || !out->size)
        status = fuser_fail(err, FUSER_E_COMPILE, "NVRTC compiled %s but gave no CUBIN (%s): is %s a real "
                            "architecture?", name, rtc->nvrtcGetErrorString(rc), FUSER_JIT_ARCH);
    else if (!(out->data = malloc(out->size)))
        status = fuser_fail(err, FUSER_E_NOMEM, "out of memory for the %zu-byte CUBIN of %s", out->size, name);
    else if ((rc = rtc->nvrtcGetCUBIN(prog, (char *)out->data)) != NVRTC_SUCCESS)
        status = fuser_fail(err, FUSER_E_COMPILE, "NVRTC could not return the CUBIN of %s: %s", name,
                            rtc->nvrtcGetErrorString(rc));
    else
        status = fuser_jit_parse_log(out->log, out, err);
    rtc->nvrtcDestroyProgram(&prog);
    if (status != FUSER_OK) { /* keep the log (the caller wants it), drop the rest */
        char *log = out->log;
        size_t log_size = out->log_size;
        out->log = NULL;
        fuser_cubin_free(out);
        out->log = log;
        out->log_size = log_size;
    }
    return status;
}
