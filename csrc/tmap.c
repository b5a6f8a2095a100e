/* tmap.c: TMA tensor maps through the driver (see include/fuser/tmap.h). */
#include "fuser/tmap.h"

#include <string.h>

/* CUtensorMap enum values (cuda.h): data types, no interleave, 128-byte swizzle, 256-byte L2
 * promotion, zero fill out of bounds. */
enum { TMAP_F16 = 6, TMAP_BF16 = 9, TMAP_SWIZZLE_128B = 3, TMAP_L2_256B = 3 };

int fuser_tmap_2d(const fuser_driver *drv, fuser_tmap *out, fuser_dtype dt, const void *base, uint64_t rows,
                  uint64_t cols, uint64_t ld, unsigned box_rows, fuser_err *err)
{
    memset(out, 0, sizeof *out);
    if (dt != FUSER_BF16 && dt != FUSER_F16)
        return fuser_fail(err, FUSER_E_VALUE, "tensor map: 16-bit elements only, got %s", fuser_dtype_name(dt));
    if (!base || (uintptr_t)base % 16)
        return fuser_fail(err, FUSER_E_VALUE, "tensor map: the base address %p is not 16-byte aligned", base);
    if (!rows || !cols || rows > ((uint64_t)1 << 32) || cols > ((uint64_t)1 << 32))
        return fuser_fail(err, FUSER_E_VALUE, "tensor map: extents [%llu, %llu] must be in [1, 2^32]",
                          (unsigned long long)rows, (unsigned long long)cols);
    if (ld < cols || (ld * 2) % 16 || ld * 2 >= ((uint64_t)1 << 40))
        return fuser_fail(err, FUSER_E_VALUE, "tensor map: a row pitch of %llu elements must be >= the %llu "
                          "columns, a multiple of 8 and under 2^39", (unsigned long long)ld, (unsigned long long)cols);
    if (box_rows < 1 || box_rows > FUSER_TMAP_MAX_BOX_ROWS)
        return fuser_fail(err, FUSER_E_VALUE, "tensor map: box of %u rows (1 to %d)", box_rows,
                          FUSER_TMAP_MAX_BOX_ROWS);
    const uint64_t dims[2] = {cols, rows};
    const uint64_t strides[1] = {ld * 2};
    const unsigned box[2] = {FUSER_TMAP_BOX_COLS, box_rows};
    const unsigned elem_strides[2] = {1, 1};
    fuser_cu_result r = drv->cuTensorMapEncodeTiled(out, dt == FUSER_BF16 ? TMAP_BF16 : TMAP_F16, 2, (void *)base,
                                                    dims, strides, box, elem_strides, 0, TMAP_SWIZZLE_128B,
                                                    TMAP_L2_256B, 0);
    if (r != FUSER_CUDA_SUCCESS) {
        char desc[256];
        fuser_cu_describe(drv, r, desc, sizeof desc);
        return fuser_fail(err, FUSER_E_CUDA, "cuTensorMapEncodeTiled([%llu, %llu], pitch %llu, box 64 x %u) failed: %s",
                          (unsigned long long)rows, (unsigned long long)cols, (unsigned long long)ld, box_rows, desc);
    }
    return FUSER_OK;
}
