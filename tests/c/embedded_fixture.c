/* embedded_fixture.c: a stand-in for the embedded kernel templates in the C unit tests. The extension
 * links the table that setup.py generates from include/fuser/device; these tests (built with no Python)
 * only need a table with the same shape, deliberately listed out of name order. */
#include "fuser/embedded.h"

const fuser_embedded_file fuser_embedded_headers[] = {
    {"fuser/device/zeta.cuh", "#pragma once\n", 13},
    {"fuser/device/common.cuh", "#pragma once\nnamespace fuser {}\n", 32},
};
const int fuser_embedded_header_count = 2;
