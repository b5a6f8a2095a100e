/* embedded.h: the kernel templates (the .cuh files under include/fuser/device), embedded into the extension at build
 * time by setup.py so NVRTC can receive them as in-memory headers with no toolkit on disk. The table
 * is generated (build/fuser_gen/embedded_headers.c); its order is sorted by name. */
#ifndef FUSER_EMBEDDED_H
#define FUSER_EMBEDDED_H

#include <stddef.h>

typedef struct {
    const char *name;          /* include name, e.g. "fuser/device/common.cuh" */
    const char *data;          /* contents, NUL-terminated */
    size_t size;               /* bytes, without the NUL */
} fuser_embedded_file;

extern const fuser_embedded_file fuser_embedded_headers[];
extern const int fuser_embedded_header_count;

#endif /* FUSER_EMBEDDED_H */
