/* env.h: the environment variables the C core reads itself: boolean switches, parsed by the one parser
 * that the Python package also uses (through _C.parse_flag), and the choice of the kernel cache
 * directory. Reading them has no side effect: nothing here creates or checks a directory (cache.h
 * does that before the cache is used).
 *
 * Boolean variables (FUSER_CACHE_DISABLE here, FUSER_DISABLE in the Python package) take
 *   on:  1, true, yes, on          off: 0, false, no, off, the empty string, or unset
 * in any case. Any other value is an error naming the variable, the value and these spellings: a
 * typo must not silently mean "on" (or "off").
 */
#ifndef FUSER_ENV_H
#define FUSER_ENV_H

#include <stddef.h>

#include "fuser/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The accepted spellings, as messages and documentation quote them. */
#define FUSER_FLAG_SPELLINGS "1/0, true/false, yes/no or on/off (any case; empty is the same as unset: off)"

/** Parse `value` of the boolean environment variable `name` (NULL: unset) into *on (0 or 1). FUSER_OK,
 * or FUSER_E_VALUE naming the variable, the value and the spellings (*on is then 0). */
int fuser_parse_flag(const char *name, const char *value, int *on, fuser_err *err);

/** fuser_parse_flag of the variable `name` as the process environment holds it now. */
int fuser_env_flag(const char *name, int *on, fuser_err *err);

/** Bytes of a kernel cache directory path, its NUL included. */
#define FUSER_CACHE_DIR_MAX 1024

/** The kernel cache directory, chosen in this order:
 *   $FUSER_CACHE_DIR (as given), else $XDG_CACHE_HOME/fuser (an absolute $XDG_CACHE_HOME only, as the
 *   XDG specification asks), else $HOME/.cache/fuser, else <$TMPDIR or /tmp>/fuser-<effective uid>
 *   (a directory of this user's own: the cache checks its owner and mode before using it).
 * FUSER_OK with the path in buf. A path that does not fit is never cut: FUSER_E_CACHE naming the
 * variable and the length, and buf = "" (the caller runs without a disk cache). *from (may be NULL)
 * is set either way to what chose the path, e.g. "$FUSER_CACHE_DIR". */
int fuser_cache_dir(char buf[FUSER_CACHE_DIR_MAX], const char **from, fuser_err *err);

#ifdef __cplusplus
}
#endif
#endif /* FUSER_ENV_H */
