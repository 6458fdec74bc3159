#pragma once
// Opening a checkpoint dir so that no other user can redirect it. Each component is opened by fd from "/" (or from
// the site's trusted prefix), never by walking a path string again, and every component below that prefix must be
// owned by root or the job's user and must not be writable by anyone else unless it is sticky (like /tmp). The dir
// itself must belong to the job's user and be writable by nobody else. A co-user who pre-creates /scratch/alice, or
// who swaps a component for a symlink, is refused before anything is created or read below it.
#include <sys/types.h>

#include <string>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt::fs {

struct TrustRules {
  uid_t uid = 0;                              // the job's user; components may belong to root or to this uid
  std::vector<std::string> trusted_prefixes;  // absolute, normalized; the site's own dirs (plugstack allowed_dirs)
};

// Opens the absolute dir `path` under `rules` and returns its fd (O_RDONLY | O_DIRECTORY | O_CLOEXEC), which the
// caller closes. With `create`, missing components are made with mode 0700 (as the calling process). Symlinks are
// followed only when they belong to root or rules.uid and sit in a dir that passed the checks (at most 40).
// Components at or above the longest trusted prefix that contains `path` are the site's and are not checked.
// Returns one line naming the refused component with its owner and mode, or the failing system call.
Result<int> open_trusted_dir(const std::string& path, const TrustRules& rules, bool create);

// The trusted prefixes of the environment's CKPT_TRUSTED_DIRS (':'-separated, as the plugin exports them).
std::vector<std::string> trusted_prefixes_from_env();

}  // namespace ckpt::fs
