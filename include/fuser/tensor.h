/* tensor.h: the validated tensor view the core works with, made from a DLTensor.
 *
 * fuser_tensor_from_dl() is the single place where a foreign tensor is checked: element type
 * (bfloat16, float16, float32, float8_e4m3fn), device (CPU, CUDA), shape, strides (compact row-major only: a strided
 * view is an error, never a silent wrong result; the Python layer decides on explicit copies), byte
 * offset and alignment. What it accepts, every later stage may rely on.
 */
#ifndef FUSER_TENSOR_H
#define FUSER_TENSOR_H

#include <stdint.h>

#include "fuser/dlpack.h"
#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FUSER_MAX_DIMS 8

/** Element types fuser computes in. Values are stable (used in cache keys and plans). */
typedef enum {
    FUSER_BF16 = 0,
    FUSER_F16 = 1,
    FUSER_F32 = 2,
    FUSER_E4M3 = 3, /* float8_e4m3fn: 8-bit operands of quantized chains (include/fuser/chain.h) */
    FUSER_NUM_DTYPES
} fuser_dtype;

/** Device kinds fuser accepts. */
typedef enum {
    FUSER_CPU = 0,
    FUSER_CUDA = 1,
} fuser_device_kind;

/** Required alignment of a tensor's first element, in bytes: what 16-byte vector loads, cp.async and
 * TMA need. Checked on every device so that errors are the same everywhere. */
#define FUSER_ALIGN_BYTES 16

typedef struct fuser_tensor {
    void *data;           /* first element (DLPack data + byte_offset); NULL only when numel == 0 */
    fuser_dtype dtype;
    fuser_device_kind device;
    int device_id;
    int ndim;
    int64_t shape[FUSER_MAX_DIMS];
    int64_t numel;
    int64_t nbytes;
} fuser_tensor;

/** Size in bytes of one element; name as torch spells it ("bfloat16", "float16", "float32",
 * "float8_e4m3fn"). */
int fuser_dtype_size(fuser_dtype dt);
const char *fuser_dtype_name(fuser_dtype dt);
/** Parse "bfloat16"/"bf16", "float16"/"fp16"/"half", "float32"/"fp32"/"float", "float8_e4m3fn"/"e4m3".
 * -1 if unknown. */
int fuser_dtype_from_name(const char *name);

/** Describe a DLPack element type in torch's spelling ("float64", "int8", "complex64", ...). */
void fuser_dl_dtype_describe(DLDataType dt, char *buf, size_t n);

/** Validate `dl` and fill `out`. `name` is the argument name used in error messages (e.g. "x").
 * Errors: FUSER_E_TYPE for element types, FUSER_E_VALUE for everything else. */
int fuser_tensor_from_dl(const DLTensor *dl, const char *name, fuser_tensor *out, fuser_err *err);

/** Format a shape as "[2, 3, 4]" into buf. */
void fuser_shape_str(const int64_t *shape, int ndim, char *buf, size_t n);

/** Format a device as "cpu" or "cuda:0". */
void fuser_device_str(const fuser_tensor *t, char *buf, size_t n);

/** 1 if the byte ranges of a and b overlap (both non-empty and on the same device). */
int fuser_tensors_overlap(const fuser_tensor *a, const fuser_tensor *b);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_TENSOR_H */
