/* codegen.h: code generation: the few lines of CUDA that specialise the kernel template
 * (include/fuser/device/ffn.cuh) for one plan. The constants come from the derived plan, so the
 * kernel, the cost model and the CPU interpreter share one source of truth (csrc/plan.c). */
#ifndef FUSER_CODEGEN_H
#define FUSER_CODEGEN_H

#include <stddef.h>

#include "fuser/plan.h"
#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The generated kernel's entry point (extern "C", one per module). */
#define FUSER_KERNEL_NAME "fuser_ffn"

/** Write the specialisation of derived fused plan p into buf (NUL-terminated). FUSER_E_VALUE for an
 * unfused or underived plan, FUSER_E_INTERNAL if buf is too small. The text depends only on what
 * changes the binary (not on the token count m), so every m a plan is chosen for shares one kernel. */
int fuser_codegen(const fuser_plan *p, char *buf, size_t n, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_CODEGEN_H */
