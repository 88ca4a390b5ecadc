/* Pagewise: user-space memory management for stock Linux — the C API.
 *
 * Link with -lpagewise (target/release/libpagewise.so or .a). Functions return 0 on success
 * and a negative errno on failure unless stated otherwise. Each system has its own header,
 * included here.
 */
#ifndef PAGEWISE_H
#define PAGEWISE_H

#define PAGEWISE_VERSION_MAJOR 0
#define PAGEWISE_VERSION_MINOR 1

#include "pagewise/hps.h"
#include "pagewise/hp_alloc.h"
#include "pagewise/reclaim.h"
#include "pagewise/dlm.h"

#endif /* PAGEWISE_H */
