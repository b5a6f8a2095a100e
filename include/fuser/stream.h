/* stream.h: the stream kernel family in the core (see the kind's description in plan.h and the kernel,
 * include/fuser/device/stream.cuh): its exact traffic, its cost, and its CPU interpretation. Called by
 * cost.c and interp.c for plans of kind FUSER_KIND_STREAM.
 *
 * Traffic of a stream plan: hbm is the compulsory bytes (x, weights, biases, y once each); l2 every
 * global load and store of data (in-bounds bytes: x and H tiles by every unit that reads them, weights,
 * the H buffer's stores, biases once per tile, y; and the fp32 split partials written and read back as
 * whole tiles, padding included); the
 * sync words (tickets, ready flags) are not counted. smem: bytes TMA writes into shared memory (whole
 * boxes, zero fill included). dsm: none. */
#ifndef FUSER_STREAM_H
#define FUSER_STREAM_H

#include "fuser/interp.h"
#include "fuser/plan.h"
#include "fuser/target.h"

#ifdef __cplusplus
extern "C" {
#endif

void fuser_stream_traffic(const fuser_plan *p, fuser_traffic *out);
void fuser_stream_cost(fuser_plan *p, const fuser_target *t);
int fuser_stream_interpret(const fuser_plan *p, const fuser_ffn_data *d, fuser_interp_result *res, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_STREAM_H */
