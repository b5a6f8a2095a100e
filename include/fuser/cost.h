/* cost.h: the analytical cost model. Bytes per memory level are counted exactly (the CPU plan
 * interpreter counts the same bytes by doing the work, and tests hold the two equal); time is a
 * minimax over the levels and compute, plus the serial terms (barriers, launch, pipeline ramps). */
#ifndef FUSER_COST_H
#define FUSER_COST_H

#include "fuser/plan.h"
#include "fuser/target.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Exact traffic of a derived fused plan (see fuser_traffic for what each level counts). */
void fuser_plan_traffic(const fuser_plan *p, fuser_traffic *out);

/** Fill p->traffic and p->cost for a derived plan on target t (fused or unfused). */
void fuser_plan_cost(fuser_plan *p, const fuser_target *t);

/** The roofline floor of a chain on t, in microseconds: max(FLOPs / mma rate, compulsory bytes / HBM). */
double fuser_chain_floor_us(const fuser_chain *c, const fuser_target *t);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_COST_H */
