/* dlpack.h: fuser's own ABI-identical declaration of DLPack 1.x (https://dmlc.github.io/dlpack).
 *
 * Written from the published specification, not copied. Only what fuser consumes is declared. Each
 * struct's layout is pinned by the static asserts at the bottom: if a field moves, the build fails.
 *
 * Contract reminders (from the spec):
 *   - `strides` may be NULL, meaning compact row-major; strides count elements, not bytes.
 *   - `byte_offset` must be added to `data` before use.
 *   - a zero-size tensor may have a NULL `data`.
 *   - a consumer that takes a capsule renames it "used_dltensor[_versioned]" and later calls `deleter`
 *     exactly once (a NULL deleter means nothing to free).
 *   - for DLManagedTensorVersioned, a consumer that does not understand `version.major` may only call
 *     `deleter`; the layout is stable up to and including `flags`.
 */
#ifndef FUSER_DLPACK_H
#define FUSER_DLPACK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The DLPack major/minor version this header declares and the largest one fuser asks producers for. */
#define FUSER_DLPACK_MAJOR 1
#define FUSER_DLPACK_MINOR 0

/** Capsule names defined by the Python protocol. */
#define FUSER_DLPACK_CAPSULE "dltensor"
#define FUSER_DLPACK_CAPSULE_USED "used_dltensor"
#define FUSER_DLPACK_CAPSULE_VERSIONED "dltensor_versioned"
#define FUSER_DLPACK_CAPSULE_VERSIONED_USED "used_dltensor_versioned"

/** Flags of DLManagedTensorVersioned.flags. */
#define FUSER_DLPACK_FLAG_READ_ONLY (UINT64_C(1) << 0) /**< the consumer must not write the data */
#define FUSER_DLPACK_FLAG_IS_COPIED (UINT64_C(1) << 1) /**< the producer exported a copy */

/** Device types (DLDeviceType). Stored as int32 in DLDevice. */
enum {
    kDLCPU = 1,
    kDLCUDA = 2,
    kDLCUDAHost = 3, /**< pinned host memory: CPU-accessible */
    kDLOpenCL = 4,
    kDLVulkan = 7,
    kDLMetal = 8,
    kDLVPI = 9,
    kDLROCM = 10,
    kDLROCMHost = 11,
    kDLExtDev = 12,
    kDLCUDAManaged = 13,
    kDLOneAPI = 14,
    kDLWebGPU = 15,
    kDLHexagon = 16,
    kDLMAIA = 17,
};

/** Type codes (DLDataTypeCode). Stored as uint8 in DLDataType.code. */
enum {
    kDLInt = 0,
    kDLUInt = 1,
    kDLFloat = 2,
    kDLOpaqueHandle = 3,
    kDLBfloat = 4,
    kDLComplex = 5,
    kDLBool = 6,
    kDLFloat8_e3m4 = 7,
    kDLFloat8_e4m3 = 8,
    kDLFloat8_e4m3b11fnuz = 9,
    kDLFloat8_e4m3fn = 10,
    kDLFloat8_e4m3fnuz = 11,
    kDLFloat8_e5m2 = 12,
    kDLFloat8_e5m2fnuz = 13,
    kDLFloat8_e8m0fnu = 14,
    kDLFloat6_e2m3fn = 15,
    kDLFloat6_e3m2fn = 16,
    kDLFloat4_e2m1fn = 17,
};

/** DLPackVersion. */
typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

/** DLDevice: where the data lives. device_type is one of the kDL* device values. */
typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

/** DLDataType: element type; `lanes` > 1 means a vector type (fuser accepts 1 only). */
typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

/** DLTensor: a view of memory owned by someone else. */
typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides; /**< NULL: compact row-major */
    uint64_t byte_offset;
} DLTensor;

/** DLManagedTensor: the legacy (pre-1.0) managed tensor, in capsules named "dltensor". */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

/** DLManagedTensorVersioned: the 1.x managed tensor, in capsules named "dltensor_versioned". */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* ---- ABI pins (LP64 and LLP64 alike: pointers are 8 bytes on every platform fuser supports) ---- */
#if !defined(__cplusplus)
_Static_assert(sizeof(void *) == 8, "fuser supports 64-bit platforms only");
_Static_assert(sizeof(DLDevice) == 8, "DLDevice layout");
_Static_assert(sizeof(DLDataType) == 4, "DLDataType layout");
_Static_assert(offsetof(DLDataType, bits) == 1 && offsetof(DLDataType, lanes) == 2, "DLDataType fields");
_Static_assert(offsetof(DLTensor, data) == 0, "DLTensor.data");
_Static_assert(offsetof(DLTensor, device) == 8, "DLTensor.device");
_Static_assert(offsetof(DLTensor, ndim) == 16, "DLTensor.ndim");
_Static_assert(offsetof(DLTensor, dtype) == 20, "DLTensor.dtype");
_Static_assert(offsetof(DLTensor, shape) == 24, "DLTensor.shape");
_Static_assert(offsetof(DLTensor, strides) == 32, "DLTensor.strides");
_Static_assert(offsetof(DLTensor, byte_offset) == 40, "DLTensor.byte_offset");
_Static_assert(sizeof(DLTensor) == 48, "DLTensor size");
_Static_assert(offsetof(DLManagedTensor, manager_ctx) == 48, "DLManagedTensor.manager_ctx");
_Static_assert(offsetof(DLManagedTensor, deleter) == 56, "DLManagedTensor.deleter");
_Static_assert(sizeof(DLManagedTensor) == 64, "DLManagedTensor size");
_Static_assert(offsetof(DLManagedTensorVersioned, version) == 0, "DLManagedTensorVersioned.version");
_Static_assert(offsetof(DLManagedTensorVersioned, manager_ctx) == 8, "DLManagedTensorVersioned.manager_ctx");
_Static_assert(offsetof(DLManagedTensorVersioned, deleter) == 16, "DLManagedTensorVersioned.deleter");
_Static_assert(offsetof(DLManagedTensorVersioned, flags) == 24, "DLManagedTensorVersioned.flags");
_Static_assert(offsetof(DLManagedTensorVersioned, dl_tensor) == 32, "DLManagedTensorVersioned.dl_tensor");
_Static_assert(sizeof(DLManagedTensorVersioned) == 80, "DLManagedTensorVersioned size");
#endif

#ifdef __cplusplus
}
#endif
#endif /* FUSER_DLPACK_H */
