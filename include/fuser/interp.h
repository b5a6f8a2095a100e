/* interp.h: the CPU plan interpreter. It executes a plan literally: each simulated block touches only
 * its own shared-memory buffers and reaches peers only through explicit DSM copies in the plan's
 * exchange order; it accumulates in fp32 and rounds to 16 bits exactly where the GPU kernel does (H
 * after the activation, the output at the end); and it counts the bytes every memory level moves.
 * It proves that a dataflow computes the FFN and checks that the cost model counts bytes right. */
#ifndef FUSER_INTERP_H
#define FUSER_INTERP_H

#include <stdint.h>

#include "fuser/plan.h"
#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The tensors of one call: 16-bit (the plan's dtype) row-major data; absent ones NULL. */
typedef struct {
    const uint16_t *x;      /* [M, K] */
    const uint16_t *w_up;   /* [N, K] */
    const uint16_t *w_gate; /* [N, K] (gated) */
    const uint16_t *w_down; /* [L, N] */
    const uint16_t *b_up, *b_gate, *b_down;
    uint16_t *y;            /* [M, L] */
} fuser_ffn_data;

typedef struct {
    fuser_traffic traffic;  /* counted bytes; equals fuser_plan_traffic() for a correct cost model */
    int barriers;           /* cluster barriers each block passed */
    double flops;           /* executed multiply-adds x 2, including padded tiles */
} fuser_interp_result;

/** Run plan p (derived; fused or unfused) on CPU. Fails with FUSER_E_VALUE for a malformed plan or
 * missing tensors, FUSER_E_NOMEM if buffers cannot be allocated, and FUSER_E_INTERNAL if an output
 * element was not written exactly once. */
int fuser_interpret(const fuser_plan *p, const fuser_ffn_data *d, fuser_interp_result *res, fuser_err *err);

/** The activation in fp32, as the kernels evaluate it. */
float fuser_act_f32(fuser_act a, float x);

/** 16-bit conversions with round-to-nearest-even, as the GPU's cvt.rn does. */
float fuser_half_to_float(uint16_t h, fuser_dtype dt);
uint16_t fuser_float_to_half(float f, fuser_dtype dt);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_INTERP_H */
