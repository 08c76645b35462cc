#pragma once
// absl has no public RETURN_IF_ERROR / ASSIGN_OR_RETURN; these are the project's.
#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define BITSPLIT_CONCAT_INNER(a, b) a##b
#define BITSPLIT_CONCAT(a, b) BITSPLIT_CONCAT_INNER(a, b)

#define BITSPLIT_RETURN_IF_ERROR(expr)                   \
  do {                                                   \
    ::absl::Status bitsplit_status_ = (expr);            \
    if (!bitsplit_status_.ok()) return bitsplit_status_; \
  } while (0)

#define BITSPLIT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                   \
  if (!tmp.ok()) return tmp.status();                  \
  lhs = std::move(tmp).value()

#define BITSPLIT_ASSIGN_OR_RETURN(lhs, expr) \
  BITSPLIT_ASSIGN_OR_RETURN_IMPL(BITSPLIT_CONCAT(bitsplit_statusor_, __LINE__), lhs, expr)

// Always-on invariant check (also in release builds): a violated invariant is a bug, and
// continuing would corrupt results silently.
#define BITSPLIT_CHECK(cond)                                                              \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                       \
    }                                                                                     \
  } while (0)
