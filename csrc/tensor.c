/* tensor.c: validation of foreign (DLPack) tensors into fuser_tensor views. See include/fuser/tensor.h.
 * It checks and describes; it never copies data and never owns memory. */
#include "fuser/tensor.h"

#include <stdio.h>
#include <string.h>

/* ---- element types: one table ---- */
static const struct {
    const char *name;
    int size;
    uint8_t dl_code;
    uint8_t dl_bits;
} dtype_table[FUSER_NUM_DTYPES] = {
    [FUSER_BF16] = {"bfloat16", 2, kDLBfloat, 16},
    [FUSER_F16] = {"float16", 2, kDLFloat, 16},
    [FUSER_F32] = {"float32", 4, kDLFloat, 32},
    [FUSER_E4M3] = {"float8_e4m3fn", 1, kDLFloat8_e4m3fn, 8},
};

int fuser_dtype_size(fuser_dtype dt)
{
    return (unsigned)dt < FUSER_NUM_DTYPES ? dtype_table[dt].size : 0;
}

const char *fuser_dtype_name(fuser_dtype dt)
{
    return (unsigned)dt < FUSER_NUM_DTYPES ? dtype_table[dt].name : "?";
}

int fuser_dtype_from_name(const char *name)
{
    static const struct { const char *alias; fuser_dtype dt; } aliases[] = {
        {"bfloat16", FUSER_BF16}, {"bf16", FUSER_BF16},
        {"float16", FUSER_F16},   {"fp16", FUSER_F16},  {"half", FUSER_F16},
        {"float32", FUSER_F32},   {"fp32", FUSER_F32},  {"float", FUSER_F32},
        {"float8_e4m3fn", FUSER_E4M3}, {"e4m3", FUSER_E4M3},
    };
    if (!name)
        return -1;
    if (!strncmp(name, "torch.", 6))
        name += 6;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i].alias))
            return (int)aliases[i].dt;
    return -1;
}

void fuser_dl_dtype_describe(DLDataType dt, char *buf, size_t n)
{
    static const char *const codes[] = {
        [kDLInt] = "int", [kDLUInt] = "uint", [kDLFloat] = "float", [kDLOpaqueHandle] = "handle",
        [kDLBfloat] = "bfloat", [kDLComplex] = "complex", [kDLBool] = "bool",
    };
    if (dt.code == kDLBool) {
        snprintf(buf, n, "bool");
    } else if (dt.code >= kDLFloat8_e3m4 && dt.code <= kDLFloat4_e2m1fn) {
        snprintf(buf, n, "float%u (DLPack type code %u)", dt.bits, dt.code);
    } else if (dt.code < sizeof codes / sizeof codes[0] && codes[dt.code]) {
        snprintf(buf, n, "%s%u", codes[dt.code], dt.bits);
    } else {
        snprintf(buf, n, "unknown (DLPack type code %u, %u bits)", dt.code, dt.bits);
    }
    if (dt.lanes != 1) {
        size_t len = strlen(buf);
        snprintf(buf + len, n > len ? n - len : 0, " x%u lanes", dt.lanes);
    }
}

void fuser_shape_str(const int64_t *shape, int ndim, char *buf, size_t n)
{
    size_t len = 0;
    len += (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && len < n; i++)
        len += (size_t)snprintf(buf + len, n - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (len < n)
        snprintf(buf + len, n - len, "]");
}

void fuser_device_str(const fuser_tensor *t, char *buf, size_t n)
{
    if (t->device == FUSER_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "cuda:%d", t->device_id);
}

static int device_from_dl(DLDevice dev, const char *name, fuser_tensor *out, fuser_err *err)
{
    switch (dev.device_type) {
    case kDLCPU:
    case kDLCUDAHost: /* pinned host memory is ordinary CPU memory for us */
        out->device = FUSER_CPU;
        out->device_id = 0;
        return FUSER_OK;
    case kDLCUDA:
        if (dev.device_id < 0)
            return fuser_fail(err, FUSER_E_VALUE, "%s: DLPack CUDA device id %d is negative", name,
                              (int)dev.device_id);
        out->device = FUSER_CUDA;
        out->device_id = dev.device_id;
        return FUSER_OK;
    case kDLCUDAManaged:
        return fuser_fail(err, FUSER_E_VALUE,
                          "%s: CUDA managed (unified) memory is not supported; copy it to a plain CUDA "
                          "tensor first (e.g. .to('cuda'))", name);
    default:
        return fuser_fail(err, FUSER_E_VALUE,
                          "%s: DLPack device type %d is not supported; fuser takes CPU or CUDA tensors",
                          name, (int)dev.device_type);
    }
}

int fuser_tensor_from_dl(const DLTensor *dl, const char *name, fuser_tensor *out, fuser_err *err)
{
    char buf[160];
    memset(out, 0, sizeof *out);

    /* element type */
    int found = -1;
    for (int i = 0; i < FUSER_NUM_DTYPES; i++)
        if (dl->dtype.code == dtype_table[i].dl_code && dl->dtype.bits == dtype_table[i].dl_bits &&
            dl->dtype.lanes == 1)
            found = i;
    if (found < 0) {
        fuser_dl_dtype_describe(dl->dtype, buf, sizeof buf);
        return fuser_fail(err, FUSER_E_TYPE,
                          "%s: dtype %s is not supported; expected bfloat16, float16 or float32 (or "
                          "float8_e4m3fn for the operands of a quantized FFN)", name, buf);
    }
    out->dtype = (fuser_dtype)found;

    if (device_from_dl(dl->device, name, out, err))
        return err->code;

    /* shape */
    if (dl->ndim < 0 || dl->ndim > FUSER_MAX_DIMS)
        return fuser_fail(err, FUSER_E_VALUE, "%s: %d dimensions; fuser takes tensors of at most %d",
                          name, (int)dl->ndim, FUSER_MAX_DIMS);
    if (dl->ndim > 0 && !dl->shape)
        return fuser_fail(err, FUSER_E_VALUE, "%s: DLPack tensor has no shape array", name);
    out->ndim = dl->ndim;
    int64_t numel = 1;
    for (int i = 0; i < dl->ndim; i++) {
        if (dl->shape[i] < 0)
            return fuser_fail(err, FUSER_E_VALUE, "%s: negative extent %lld in dimension %d", name,
                              (long long)dl->shape[i], i);
        out->shape[i] = dl->shape[i];
        if (dl->shape[i] && numel > INT64_MAX / dl->shape[i])
            return fuser_fail(err, FUSER_E_VALUE, "%s: element count overflows int64", name);
        numel *= dl->shape[i];
    }
    out->numel = numel;
    if (numel > INT64_MAX / (int64_t)fuser_dtype_size(out->dtype))
        return fuser_fail(err, FUSER_E_VALUE, "%s: byte count overflows int64 (%lld elements)", name,
                          (long long)numel);
    out->nbytes = numel * fuser_dtype_size(out->dtype);

    /* strides: compact row-major, ignoring dimensions of extent 1 (their stride is meaningless) */
    if (dl->strides && numel > 0) {
        int64_t expect = 1;
        for (int i = dl->ndim - 1; i >= 0; i--) {
            if (dl->shape[i] != 1 && dl->strides[i] != expect) {
                char sh[160], st[160];
                fuser_shape_str(dl->shape, dl->ndim, sh, sizeof sh);
                fuser_shape_str(dl->strides, dl->ndim, st, sizeof st);
                return fuser_fail(err, FUSER_E_VALUE,
                                  "%s: strides %s of shape %s are not contiguous row-major; "
                                  "pass %s.contiguous()", name, st, sh, name);
            }
            expect *= dl->shape[i];
        }
    }

    /* data pointer and alignment */
    if (numel > 0) {
        if (!dl->data)
            return fuser_fail(err, FUSER_E_VALUE, "%s: non-empty tensor with a NULL data pointer", name);
        out->data = (char *)dl->data + dl->byte_offset;
        uintptr_t addr = (uintptr_t)out->data;
        if (addr % FUSER_ALIGN_BYTES)
            return fuser_fail(err, FUSER_E_VALUE,
                              "%s: data address 0x%llx is not %d-byte aligned (a view that starts %llu bytes "
                              "into an allocation?); pass %s.clone() or an aligned tensor",
                              name, (unsigned long long)addr, FUSER_ALIGN_BYTES,
                              (unsigned long long)(addr % FUSER_ALIGN_BYTES), name);
    }
    return FUSER_OK;
}

int fuser_tensors_overlap(const fuser_tensor *a, const fuser_tensor *b)
{
    if (!a->nbytes || !b->nbytes || a->device != b->device || a->device_id != b->device_id)
        return 0;
    uintptr_t a0 = (uintptr_t)a->data, a1 = a0 + (uintptr_t)a->nbytes;
    uintptr_t b0 = (uintptr_t)b->data, b1 = b0 + (uintptr_t)b->nbytes;
    return a0 < b1 && b0 < a1;
}
