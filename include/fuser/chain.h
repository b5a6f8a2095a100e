/* chain.h: the chain IR, fuser's description of one two-GEMM chain (a transformer FFN).
 *
 *   plain:  E = act(A . B^T [+ b1]) . D^T [+ b2]
 *   gated:  E = (act(A . Bg^T [+ bg]) * (A . Bu^T [+ bu])) . D^T [+ b2]
 *
 * with A [M, K] (tokens x d_model), B/Bu/Bg [N, K] (d_ff x d_model, nn.Linear layout), D [L, N]
 * (d_out x d_ff) and E [M, L]. Operands are 16-bit (or fp32 on the reference path); accumulation is
 * fp32. This header also owns the activation table, and the validation of fuser.ffn's arguments,
 * which produces a chain from tensors.
 *
 * Quantized chains (dtype FUSER_E4M3, W8A8 with static activation scales): B, Bu, Bg and D are e4m3 with
 * fp32 scales, s_x and s_h one per tensor, s_up, s_gate [N] and s_down [L] one per weight row (output
 * channel); A, the biases and E are bfloat16. A is quantized first, Aq = e4m3(A x (1 / s_x)), and with
 * P = Aq . W^T accumulated in fp32:
 *   U = P_up x (s_x s_up[n]) [+ bu],  G = P_gate x (s_x s_gate[n]) [+ bg],
 *   H = act(G) * U (gated) or act(U),  Hq = e4m3(H x (1 / s_h)) (round to nearest even, saturating at
 *   +-448),  E = (Hq . D^T) x (s_h s_down[l]) [+ b2], rounded to bfloat16.
 * H crosses between the GEMMs in 8 bits, which is what makes the chain's bytes half of a 16-bit one's.
 * In PyTorch's ops (fuser.fp8.eager, the planner's alternative to the fused kernel) the GEMMs are
 * torch._scaled_mm: with both scales inside the GEMM (rowwise) at whole multiples of
 * FUSER_FP8_ROWWISE_TOKENS tokens and from FUSER_FP8_ROWWISE_ALL_TOKENS on, else with a per-tensor scale
 * and the per-row scales applied by one more op (tensorwise): each the faster on the H200 there (rowwise
 * GEMMs a few rows past a multiple of 128 at 144-320 tokens run up to 1.6x slower than tensorwise ones;
 * from 576 tokens on they are the faster whatever the count; benchmarks/RESULTS.md).
 */
#ifndef FUSER_CHAIN_H
#define FUSER_CHAIN_H

#include <stdint.h>

#include "fuser/status.h"
#include "fuser/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FUSER_FP8_ROWWISE_TOKENS 128
#define FUSER_FP8_ROWWISE_ALL_TOKENS 512

/** Whether PyTorch's FP8 ops run rowwise GEMMs at `m` tokens (fuser.fp8.eager_recipe asks this). */
static inline int fuser_fp8_rowwise(int64_t m)
{
    return m >= FUSER_FP8_ROWWISE_ALL_TOKENS || (m >= FUSER_FP8_ROWWISE_TOKENS && m % FUSER_FP8_ROWWISE_TOKENS == 0);
}

/** The fewest token rows from which fuser's eager route puts a plain chain's ReLU or tanh GELU in the up GEMM's
 * cuBLASLt epilogue (over b_up, or a zero bias in its place): torch runs that epilogue from two rows. The
 * runtime's default (fuser.runtime.ZERO_BIAS_MIN_TOKENS); the planner prices the eager route by it. */
#define FUSER_EAGER_EPILOGUE_TOKENS 2

/** Activations. Values are stable (used in cache keys, plans and generated code). */
typedef enum {
    FUSER_ACT_RELU = 0,
    FUSER_ACT_GELU = 1,      /* exact: 0.5 x (1 + erf(x / sqrt 2)) */
    FUSER_ACT_GELU_TANH = 2, /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    FUSER_ACT_SILU = 3,      /* x * sigmoid(x) */
    FUSER_NUM_ACTS
} fuser_act;

/** "relu", "gelu", "gelu_tanh", "silu"; NULL for an invalid value. */
const char *fuser_act_name(fuser_act a);
/** -1 if unknown. */
int fuser_act_from_name(const char *name);
/** "relu, gelu, gelu_tanh, silu": for error messages. */
const char *fuser_act_choices(void);
/** The activation in double precision: the definition every kernel and reference is held to. */
double fuser_act_eval(fuser_act a, double x);

/** One chain. M may be 0 (an empty batch); every other extent is >= 1. */
typedef struct fuser_chain {
    int64_t m;        /* tokens */
    int64_t k;        /* d_model (GEMM1 reduction) */
    int64_t n;        /* d_ff (GEMM1 output, GEMM2 reduction) */
    int64_t l;        /* d_out (GEMM2 output), usually d_model */
    int gated;        /* 1: act(A Bg) * (A Bu) */
    fuser_act act;
    int bias_up;      /* b_up [N] present */
    int bias_gate;    /* b_gate [N] present (gated only) */
    int bias_down;    /* b_down [L] present */
    fuser_dtype dtype;
    int packed;       /* gated, 16-bit: the gate and up weights are the two row halves of one memory, which the
                       * eager route runs as one GEMM (the kernels read them alike, so no kernel depends on it) */
} fuser_chain;

/** Whether fuser's eager route runs `c`'s activation in the up GEMM's epilogue: a plain 16-bit chain with ReLU or
 * tanh GELU from FUSER_EAGER_EPILOGUE_TOKENS rows (one launch and two passes of H fewer than PyTorch's ops). */
static inline int fuser_eager_epilogue(const fuser_chain *c)
{
    return !c->gated && (c->dtype == FUSER_BF16 || c->dtype == FUSER_F16) &&
           (c->act == FUSER_ACT_RELU || c->act == FUSER_ACT_GELU_TANH) && c->m >= FUSER_EAGER_EPILOGUE_TOKENS;
}

/** The dtype of a chain's output and biases: its own, or bfloat16 for a quantized (e4m3) chain. */
fuser_dtype fuser_chain_out_dtype(const fuser_chain *c);

/** Columns of one kernel K step of dtype dt: 128 bytes of a row (64 16-bit columns, 128 e4m3 ones). */
int fuser_kstep_cols(fuser_dtype dt);

/** Check a chain on its own (extents, enum values). */
int fuser_chain_check(const fuser_chain *c, fuser_err *err);

/** A quantized chain's scales, in the order fuser_ffn_args keeps them. */
enum { FUSER_S_X, FUSER_S_UP, FUSER_S_GATE, FUSER_S_DOWN, FUSER_S_H, FUSER_NUM_SCALES };
/** "x_scale", "up_scale", ...: the scales' argument names in messages. */
const char *fuser_scale_name(int i);

/** Arguments of fuser.ffn, as validated views. Absent optional tensors are NULL; `scale` is all NULL
 * for a 16-bit chain and holds the fp32 scales of a quantized one (the gate's only when gated). */
typedef struct fuser_ffn_args {
    const fuser_tensor *x, *w_up, *w_down, *w_gate, *b_up, *b_gate, *b_down, *out;
    const char *activation;
    const fuser_tensor *scale[FUSER_NUM_SCALES];
} fuser_ffn_args;

/** Validate fuser.ffn's arguments against each other and fill `chain` (M = product of x's leading
 * dimensions). Errors name the argument, the expected and the actual value:
 * FUSER_E_TYPE for dtypes, FUSER_E_VALUE for shapes, devices, aliasing and the activation name. */
int fuser_ffn_validate(const fuser_ffn_args *a, fuser_chain *chain, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_CHAIN_H */
