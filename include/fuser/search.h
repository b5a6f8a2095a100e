/* search.h: the plan search: enumerate cluster shapes, block tiles, pipeline depth, loop order and
 * gated mode; prune with the named rules (csrc/rules.c); score every survivor with the cost model;
 * keep the best k (the unfused path competes as one more candidate). */
#ifndef FUSER_SEARCH_H
#define FUSER_SEARCH_H

#include <stdint.h>

#include "fuser/plan.h"
#include "fuser/target.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Search levels: a rule is checked as soon as the fields it reads are set. */
typedef enum {
    FUSER_LEVEL_CHAIN = 0, /* chain and target only: no fused plan at all */
    FUSER_LEVEL_SHAPE,     /* + gate mode and cluster shape */
    FUSER_LEVEL_BM,        /* + bm */
    FUSER_LEVEL_BN,        /* + bn */
    FUSER_LEVEL_NITERS,    /* + n_iters */
    FUSER_LEVEL_BL,        /* + order and bl */
    FUSER_LEVEL_FULL,      /* + stages: the plan is derived */
    FUSER_LEVEL_CHOICE,    /* derived, and the searched field it judges was left free by the caller */
    FUSER_NUM_LEVELS
} fuser_level;

typedef struct {
    const char *name;   /* stable identifier, reported in plan.pruned */
    const char *why;    /* one line: what the rule protects */
    fuser_level level;
    /* nonzero: reject. Reads only the fields set at `level` (derived fields only at FULL). */
    int (*reject)(const fuser_plan *p, const fuser_target *t);
} fuser_rule;

extern const fuser_rule fuser_rules[];

/* The K splits the search tries for each phase of a stream plan. */
extern const int fuser_stream_splits[];
extern const int fuser_num_stream_splits;
extern const int fuser_num_rules;

/* Optional restrictions (0 / -1 = free), for tests, tuning and forcing a dataflow. */
typedef struct {
    int cls_m, cls_n, cls_k, cls_l;
    int bm, bn, bl, n_iters, stages;
    int order;          /* -1 free, else fuser_order */
    int gate_mode;      /* -1 free, else fuser_gate_mode */
    int fused;          /* -1 free, 0 unfused only, 1 fused only */
    int kind;           /* -1 free, else fuser_kind (fused plans of that family only) */
    int s1, s2;         /* stream plans: the K splits of phase 1 and phase 2 */
    int phases;         /* stream plans: 2 or 1 (see fuser_plan.phases) */
    int lspan;          /* stream plans, one phase: l-tiles per unit (see fuser_plan.lspan) */
    int dataflows_all;  /* every one of these FUSER_DF_* bits must be used */
    int dataflows_none; /* none of these bits may be used */
} fuser_constraints;

void fuser_constraints_init(fuser_constraints *c);

#define FUSER_MAX_RULES 32

typedef struct {
    int64_t candidates;               /* leaves of the search space (fused) + 1 (unfused) */
    int64_t scored;                   /* candidates that passed every rule and were costed */
    int64_t pruned[FUSER_MAX_RULES];  /* candidates each rule removed, indexed like fuser_rules */
    int64_t constrained;              /* candidates removed by the caller's constraints */
    double search_ms;
} fuser_search_stats;

/** Best `k` plans (ascending predicted time) into out[0..*n_out). Deterministic. Errors: bad chain
 * (FUSER_E_VALUE), or no plan satisfying the constraints (FUSER_E_VALUE saying so). */
int fuser_search(const fuser_chain *c, const fuser_target *t, const fuser_constraints *cons, int k,
                 fuser_plan *out, int *n_out, fuser_search_stats *stats, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_SEARCH_H */
