/* tmap.h: TMA tensor maps (CUtensorMap) for the kernels' 2-D operands, encoded on the host through the
 * driver's cuTensorMapEncodeTiled. Every map fuser makes has the same form: a row-major [rows, cols]
 * matrix of 16-bit elements, loaded in boxes of 64 columns (128 bytes) by box_rows rows with 128-byte
 * swizzle (the layout wgmma's K-major descriptors read), zero-filled outside the matrix. */
#ifndef FUSER_TMAP_H
#define FUSER_TMAP_H

#include <stdint.h>

#include "fuser/cuda.h"
#include "fuser/status.h"
#include "fuser/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FUSER_TMAP_BOX_COLS 64
#define FUSER_TMAP_MAX_BOX_ROWS 256

/** The 128-byte opaque descriptor, as the kernel parameter struct holds it. */
typedef struct fuser_tmap {
    _Alignas(64) uint64_t opaque[16];
} fuser_tmap;

/** Encode the map of the row-major matrix at `base` ([rows, cols], rows `ld` elements apart). Checks
 * what the hardware requires and says which rule failed: a 16-bit dtype, 16-byte aligned base and row
 * pitch, extents within 2^32, box_rows in [1, 256]. FUSER_E_CUDA if the driver refuses. */
int fuser_tmap_2d(const fuser_driver *drv, fuser_tmap *out, fuser_dtype dt, const void *base, uint64_t rows,
                  uint64_t cols, uint64_t ld, unsigned box_rows, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_TMAP_H */
