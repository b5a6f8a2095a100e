/* dlpack.h: fuser's own ABI-identical declaration of DLPack 1.x (https://dmlc.github.io/dlpack), with
 * the C exchange API of DLPack 1.3 that Python tensor types may carry.
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

/* ---- the C exchange API (DLPack 1.x, Python only) ----
 *
 * A Python tensor type may carry `__dlpack_c_exchange_api__`: a capsule named "dlpack_exchange_api"
 * holding a pointer to a static DLPackExchangeAPI table that lives as long as the process. Its
 * functions take an object of exactly the type the table was read from and export it without the
 * Python protocol's call and capsule. A consumer checks `header.version.major` before reading anything
 * past the header, and may follow `header.prev_api` to an older table of a major version it knows.
 * Every function returns 0, or -1 with a Python exception set (the allocator: with `set_error` called);
 * none synchronises streams: the consumer works on the producer's current stream, which
 * `current_work_stream` names (NULL for CPU). */

/** The capsule name of `type.__dlpack_c_exchange_api__`. */
#define FUSER_DLPACK_EXCHANGE_CAPSULE "dlpack_exchange_api"

/** The part of the table that stays put across major versions. */
typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;                    /**< the version of the table that follows */
    struct DLPackExchangeAPIHeader *prev_api; /**< a table of an older major version, or NULL */
} DLPackExchangeAPIHeader;

/** Allocate a new owning tensor of the producer like `prototype` (its dtype, ndim, shape and device). */
typedef int (*DLPackManagedTensorAllocator)(DLTensor *prototype, DLManagedTensorVersioned **out, void *error_ctx,
                                            void (*set_error)(void *error_ctx, const char *kind,
                                                              const char *message));
/** Export `py_object` as an owning managed tensor (the consumer calls its deleter once). */
typedef int (*DLPackManagedTensorFromPyObjectNoSync)(void *py_object, DLManagedTensorVersioned **out);
/** Make a Python object of the producer from a managed tensor, taking its ownership. */
typedef int (*DLPackManagedTensorToPyObjectNoSync)(DLManagedTensorVersioned *tensor, void **out_py_object);
/** Describe `py_object` in a caller-provided DLTensor, owning nothing: shape, strides and data stay the
 * producer's and are valid only until control returns to Python (while the object is alive). */
typedef int (*DLPackDLTensorFromPyObjectNoSync)(void *py_object, DLTensor *out);
/** The producer's current work stream on a device (a cudaStream_t for kDLCUDA; NULL for CPU). The
 * device type is DLDeviceType, an enum: passed as an int. */
typedef int (*DLPackCurrentWorkStream)(int32_t device_type, int32_t device_id, void **out_current_stream);

/** The table. Every function is non-NULL except `dltensor_from_py_object_no_sync`, which a producer
 * that cannot describe its tensors without allocating leaves NULL. */
typedef struct DLPackExchangeAPI {
    DLPackExchangeAPIHeader header;
    DLPackManagedTensorAllocator managed_tensor_allocator;
    DLPackManagedTensorFromPyObjectNoSync managed_tensor_from_py_object_no_sync;
    DLPackManagedTensorToPyObjectNoSync managed_tensor_to_py_object_no_sync;
    DLPackDLTensorFromPyObjectNoSync dltensor_from_py_object_no_sync;
    DLPackCurrentWorkStream current_work_stream;
} DLPackExchangeAPI;

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
_Static_assert(sizeof(DLPackExchangeAPIHeader) == 16, "DLPackExchangeAPIHeader size");
_Static_assert(offsetof(DLPackExchangeAPIHeader, prev_api) == 8, "DLPackExchangeAPIHeader.prev_api");
_Static_assert(offsetof(DLPackExchangeAPI, managed_tensor_allocator) == 16, "DLPackExchangeAPI allocator");
_Static_assert(offsetof(DLPackExchangeAPI, managed_tensor_from_py_object_no_sync) == 24, "DLPackExchangeAPI export");
_Static_assert(offsetof(DLPackExchangeAPI, managed_tensor_to_py_object_no_sync) == 32, "DLPackExchangeAPI import");
_Static_assert(offsetof(DLPackExchangeAPI, dltensor_from_py_object_no_sync) == 40, "DLPackExchangeAPI describe");
_Static_assert(offsetof(DLPackExchangeAPI, current_work_stream) == 48, "DLPackExchangeAPI stream");
_Static_assert(sizeof(DLPackExchangeAPI) == 56, "DLPackExchangeAPI size");
#endif

#ifdef __cplusplus
}
#endif
#endif /* FUSER_DLPACK_H */
