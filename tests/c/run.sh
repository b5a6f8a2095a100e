#!/usr/bin/env bash
# Build and run the C core's unit tests with no Python: warnings are errors, and the address and
# undefined-behaviour sanitizers are on where the compiler has them. Usage: tests/c/run.sh [filter]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cc=${CC:-cc}
out=${FUSER_CTEST_BIN:-$here/fuser_ctest}
flags=(-std=c11 -O1 -g -Wall -Wextra -Werror -Wno-missing-field-initializers -I"$root/include" -I"$here")
san=(-fsanitize=address,undefined -fno-omit-frame-pointer)
if ! echo 'int main(void){return 0;}' | "$cc" "${san[@]}" -x c - -o /dev/null 2>/dev/null; then san=(); fi
"$cc" "${flags[@]}" "${san[@]}" "$root"/csrc/*.c "$here"/test_*.c "$here"/embedded_fixture.c "$here"/main.c -o "$out" -ldl -lpthread -lm
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$out" "$@"
