/* abi_cuda.c: compiled (not run) by tests/test_build.py when the CUDA toolkit's cuda.h is present:
 * pins fuser's own driver declarations (include/fuser/cuda.h) to the real ones. */
#include <cuda.h>
#include <stddef.h>

#include "fuser/cuda.h"

#define SAME(a, b) _Static_assert((int)(a) == (int)(b), #a " != " #b)
SAME(FUSER_CUDA_SUCCESS, CUDA_SUCCESS);
SAME(FUSER_CU_ATTR_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_CLOCK_RATE);
SAME(FUSER_CU_ATTR_MULTIPROCESSOR_COUNT, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
SAME(FUSER_CU_ATTR_MEMORY_CLOCK_RATE, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE);
SAME(FUSER_CU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
SAME(FUSER_CU_ATTR_L2_CACHE_SIZE, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
SAME(FUSER_CU_ATTR_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME(FUSER_CU_ATTR_COMPUTE_CAPABILITY_MINOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
SAME(FUSER_CU_ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR);
SAME(FUSER_CU_ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR);
SAME(FUSER_CU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
SAME(FUSER_CU_ATTR_CLUSTER_LAUNCH, CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH);
SAME(FUSER_CU_FUNC_ATTR_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
SAME(FUSER_CU_FUNC_ATTR_NUM_REGS, CU_FUNC_ATTRIBUTE_NUM_REGS);
SAME(FUSER_CU_FUNC_ATTR_LOCAL_SIZE_BYTES, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES);
SAME(FUSER_CU_FUNC_ATTR_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES);
SAME(FUSER_CU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
SAME(FUSER_CU_FUNC_ATTR_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED);
SAME(FUSER_CU_LAUNCH_ATTR_CLUSTER_DIMENSION, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
SAME(FUSER_CU_LAUNCH_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);

_Static_assert(sizeof(fuser_cu_launch_attr) == sizeof(CUlaunchAttribute), "CUlaunchAttribute size");
_Static_assert(offsetof(fuser_cu_launch_attr, value) == offsetof(CUlaunchAttribute, value), "attr value");
_Static_assert(offsetof(fuser_cu_launch_attr, value.cluster_dim) == offsetof(CUlaunchAttribute, value.clusterDim),
               "clusterDim");
_Static_assert(offsetof(fuser_cu_launch_attr, value.programmatic_serialization) ==
                   offsetof(CUlaunchAttribute, value.programmaticStreamSerializationAllowed),
               "programmaticStreamSerializationAllowed");
_Static_assert(sizeof(fuser_cu_launch_config) == sizeof(CUlaunchConfig), "CUlaunchConfig size");
_Static_assert(offsetof(fuser_cu_launch_config, shared_bytes) == offsetof(CUlaunchConfig, sharedMemBytes), "smem");
_Static_assert(offsetof(fuser_cu_launch_config, stream) == offsetof(CUlaunchConfig, hStream), "stream");
_Static_assert(offsetof(fuser_cu_launch_config, attrs) == offsetof(CUlaunchConfig, attrs), "attrs");
_Static_assert(offsetof(fuser_cu_launch_config, num_attrs) == offsetof(CUlaunchConfig, numAttrs), "numAttrs");
