/* test_tensor.c: DLTensor validation and fuser.ffn argument validation in the C core. */
#include <stdint.h>
#include <math.h>
#include <stdlib.h>

#include "ctest.h"
#include "fuser/chain.h"
#include "fuser/tensor.h"

static _Alignas(256) char arena[1 << 16];

static DLTensor dl(void *data, int ndim, int64_t *shape, int64_t *strides, uint8_t code, uint8_t bits)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = ndim;
    t.shape = shape;
    t.strides = strides;
    t.dtype.code = code;
    t.dtype.bits = bits;
    t.dtype.lanes = 1;
    return t;
}

void test_tensor_validation(void)
{
    fuser_err err;
    fuser_tensor t;
    int64_t shape[2] = {4, 8}, good[2] = {8, 1}, bad[2] = {1, 4};

    DLTensor d = dl(arena, 2, shape, NULL, kDLBfloat, 16);
    fuser_err_clear(&err);
    CHECK(fuser_tensor_from_dl(&d, "x", &t, &err) == FUSER_OK);
    CHECK(t.dtype == FUSER_BF16 && t.numel == 32 && t.nbytes == 64 && t.data == arena);

    d.strides = good;
    CHECK(fuser_tensor_from_dl(&d, "x", &t, &err) == FUSER_OK);
    d.strides = bad;
    CHECK(fuser_tensor_from_dl(&d, "x", &t, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "x: strides [1, 4] of shape [4, 8] are not contiguous");

    d = dl(arena, 2, shape, NULL, kDLFloat, 64);
    CHECK(fuser_tensor_from_dl(&d, "w", &t, &err) == FUSER_E_TYPE);
    CHECK_ERR(&err, FUSER_E_TYPE, "w: dtype float64 is not supported");

    d = dl(arena, 2, shape, NULL, kDLFloat, 16);
    d.byte_offset = 8;
    CHECK(fuser_tensor_from_dl(&d, "b", &t, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "not 16-byte aligned");
    d.byte_offset = 32;
    CHECK(fuser_tensor_from_dl(&d, "b", &t, &err) == FUSER_OK && t.data == arena + 32);

    int64_t huge[2] = {3, (int64_t)1 << 61}; /* 3 * 2^61 elements fit int64; their bytes do not */
    d = dl(arena, 2, huge, NULL, kDLBfloat, 16);
    CHECK(fuser_tensor_from_dl(&d, "x", &t, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "x: byte count overflows int64");

    int64_t empty[2] = {0, 8};
    d = dl(NULL, 2, empty, bad, kDLFloat, 32); /* zero-size: NULL data and any strides are fine */
    CHECK(fuser_tensor_from_dl(&d, "e", &t, &err) == FUSER_OK && t.numel == 0);

    d = dl(arena, 2, shape, NULL, kDLFloat, 32);
    d.device.device_type = kDLCUDA;
    d.device.device_id = 3;
    CHECK(fuser_tensor_from_dl(&d, "x", &t, &err) == FUSER_OK && t.device == FUSER_CUDA && t.device_id == 3);
    d.device.device_id = -1;
    CHECK(fuser_tensor_from_dl(&d, "x", &t, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "x: DLPack CUDA device id -1 is negative");
    d.device.device_type = kDLROCM;
    CHECK(fuser_tensor_from_dl(&d, "x", &t, &err) == FUSER_E_VALUE);

    CHECK(fuser_dtype_from_name("bf16") == FUSER_BF16 && fuser_dtype_from_name("torch.float16") == FUSER_F16);
    CHECK(fuser_dtype_from_name("float64") == -1);
}

static fuser_tensor mk(fuser_dtype dt, int ndim, int64_t a, int64_t b, size_t at)
{
    fuser_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = a;
    t.shape[1] = b;
    t.numel = ndim == 1 ? a : a * b;
    t.nbytes = t.numel * fuser_dtype_size(dt);
    t.data = arena + at;
    return t;
}

void test_ffn_validation(void)
{
    fuser_err err;
    fuser_chain c;
    fuser_tensor x = mk(FUSER_BF16, 2, 7, 64, 0), wu = mk(FUSER_BF16, 2, 160, 64, 1024),
                 wd = mk(FUSER_BF16, 2, 32, 160, 30000), wg = mk(FUSER_BF16, 2, 160, 64, 1024 + 20480),
                 bd = mk(FUSER_BF16, 1, 32, 0, 50000);
    fuser_ffn_args a = {&x, &wu, &wd, NULL, NULL, NULL, NULL, NULL, "silu"};
    fuser_err_clear(&err);
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_OK);
    CHECK(c.m == 7 && c.k == 64 && c.n == 160 && c.l == 32 && !c.gated && c.act == FUSER_ACT_SILU);

    a.w_gate = &wg;
    a.b_down = &bd;
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_OK && c.gated && c.bias_down && !c.bias_up);

    a.activation = "swiglu";
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "unknown activation 'swiglu'");
    a.activation = "gelu_tanh";

    fuser_tensor out = mk(FUSER_BF16, 2, 7, 32, 0); /* aliases x */
    a.out = &out;
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "out: its memory overlaps x");
    out = mk(FUSER_BF16, 2, 7, 33, 60000);
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "out: expected shape [7, 32]");
    out = mk(FUSER_BF16, 2, 7, 32, 60000);
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_OK);

    wd = mk(FUSER_F16, 2, 32, 160, 30000);
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_E_TYPE);
    CHECK_ERR(&err, FUSER_E_TYPE, "w_down: dtype float16 does not match x's dtype bfloat16");

    /* a quantized chain: e4m3 weights, bfloat16 x, biases and output, fp32 scales by role */
    fuser_tensor qx = mk(FUSER_BF16, 2, 7, 64, 0), qu = mk(FUSER_E4M3, 2, 160, 64, 1024),
                 qg = mk(FUSER_E4M3, 2, 160, 64, 1024 + 10240), qd = mk(FUSER_E4M3, 2, 32, 160, 30000),
                 qb = mk(FUSER_BF16, 1, 32, 0, 50000), qy = mk(FUSER_BF16, 2, 7, 32, 60000),
                 sx = mk(FUSER_F32, 1, 1, 0, 62000), su = mk(FUSER_F32, 1, 160, 0, 62016),
                 sg = mk(FUSER_F32, 1, 160, 0, 62656), sd = mk(FUSER_F32, 1, 32, 0, 63296), sh = mk(FUSER_F32, 0, 1, 0, 63424);
    sh.numel = 1, sh.nbytes = 4;
    fuser_ffn_args q = {&qx, &qu, &qd, &qg, NULL, NULL, &qb, &qy, "silu", {&sx, &su, &sg, &sd, &sh}};
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_OK);
    CHECK(c.dtype == FUSER_E4M3 && c.gated && c.bias_down && fuser_chain_out_dtype(&c) == FUSER_BF16);
    CHECK(fuser_kstep_cols(FUSER_E4M3) == 128 && fuser_kstep_cols(FUSER_BF16) == 64);
    q.scale[FUSER_S_GATE] = NULL;
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "gate_scale: missing; a quantized FFN (float8_e4m3fn) needs its scales");
    q.scale[FUSER_S_GATE] = &sg;
    q.scale[FUSER_S_DOWN] = &su; /* [160], not [d_out] */
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "down_scale: expected shape [32] (one per row of w_down: d_out), got shape [160]");
    q.scale[FUSER_S_DOWN] = &sd;
    sx.dtype = FUSER_BF16;
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_E_TYPE);
    CHECK_ERR(&err, FUSER_E_TYPE, "x_scale: dtype bfloat16; scales are float32");
    sx.dtype = FUSER_F32;
    qb.dtype = FUSER_E4M3;
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_E_TYPE);
    CHECK_ERR(&err, FUSER_E_TYPE, "b_down: dtype float8_e4m3fn; a quantized FFN (float8_e4m3fn w_up) takes x, the biases");
    qb.dtype = FUSER_BF16;
    qd.dtype = FUSER_BF16;
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_E_TYPE);
    CHECK_ERR(&err, FUSER_E_TYPE, "w_down: dtype bfloat16; a quantized FFN (float8_e4m3fn w_up) takes every weight");
    qd.dtype = FUSER_E4M3;
    qx.dtype = FUSER_E4M3; /* x arrives in bfloat16: the kernel quantizes it */
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_E_TYPE);
    CHECK_ERR(&err, FUSER_E_TYPE, "x: dtype float8_e4m3fn; a quantized FFN (float8_e4m3fn weights) takes x in bfloat16");
    qx.dtype = FUSER_BF16;
    q.w_gate = NULL; /* the gate's scale without the gate */
    CHECK(fuser_ffn_validate(&q, &c, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "gate_scale: given for an FFN without w_gate");
    wd = mk(FUSER_BF16, 2, 32, 160, 30000);
    a.scale[FUSER_S_X] = &sx; /* scales on a 16-bit chain */
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_E_VALUE);
    CHECK_ERR(&err, FUSER_E_VALUE, "x_scale: given for bfloat16");
    a.scale[FUSER_S_X] = NULL;
    wd = mk(FUSER_E4M3, 2, 32, 160, 30000); /* an e4m3 weight in a 16-bit chain */
    CHECK(fuser_ffn_validate(&a, &c, &err) == FUSER_E_TYPE);
    CHECK_ERR(&err, FUSER_E_TYPE, "a quantized FFN takes w_up in float8_e4m3fn too");

    /* the activation table holds the definitions */
    CHECK(fuser_act_eval(FUSER_ACT_RELU, -2.0) == 0.0);
    CHECK(fabs(fuser_act_eval(FUSER_ACT_GELU, 1.0) - 0.8413447460685429) < 1e-15);
    CHECK(fabs(fuser_act_eval(FUSER_ACT_GELU_TANH, 1.0) - 0.8411919906082768) < 1e-15);
    CHECK(fabs(fuser_act_eval(FUSER_ACT_SILU, 1.0) - 0.7310585786300049) < 1e-15);
}
