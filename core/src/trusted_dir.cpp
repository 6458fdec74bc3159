#include "ckpt/trusted_dir.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>

#include "ckpt/parse.hpp"
#include "ckpt/posix.hpp"

namespace ckpt::fs {

namespace {

constexpr int kMaxSymlinks = 40;  // the kernel's own limit for one lookup

std::string mode_text(mode_t mode) {
  std::array<char, 8> buf{};
  std::snprintf(buf.data(), buf.size(), "%04o", static_cast<unsigned>(mode & 07777));
  return buf.data();
}

std::string describe(const std::string& path, const struct stat& st) {
  return "'" + path + "' (owner uid " + std::to_string(st.st_uid) + ", mode " + mode_text(st.st_mode) + ")";
}

bool path_within(const std::string& path, const std::string& prefix) {
  if (prefix == "/") return true;
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '/';
}

std::string child_path(const std::string& parent, const std::string& name) {
  return parent == "/" ? "/" + name : parent + "/" + name;
}

// The walk below moves through a chain of owned fds.
using posix::Fd;

// A component below the trusted prefix: root's or the user's, and nobody else may rename entries in it.
std::string check_component(const std::string& path, const struct stat& st, uid_t uid) {
  if (st.st_uid != 0 && st.st_uid != uid) {
    return "checkpoint dir component " + describe(path, st) + " belongs to neither root nor the job's user (uid " +
           std::to_string(uid) + ")";
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return "checkpoint dir component " + describe(path, st) + " is writable by other users and not sticky";
  }
  return {};
}

class Walk {
 public:
  Walk(const TrustRules& rules, bool create) : rules_(rules), create_(create) {}

  Result<int> run(const std::string& path) {
    if (path.empty() || path.front() != '/') return Error{"checkpoint dir '" + path + "' is not an absolute path"};
    if (auto started = start(path); !started.empty()) return Error{started};
    while (!pending_.empty()) {
      std::string name = pending_.front();
      pending_.pop_front();
      if (name.empty() || name == ".") continue;
      if (name == "..") return Error{"checkpoint dir path '" + path + "' climbs with '..' below " + at_};
      if (auto err = step(name); !err.empty()) return Error{err};
    }
    struct stat st {};
    if (::fstat(dir_.get(), &st) != 0) return Error{"cannot stat '" + at_ + "': " + std::strerror(errno)};
    if (st.st_uid != rules_.uid) {
      return Error{"checkpoint dir " + describe(at_, st) + " does not belong to the job's user (uid " +
                   std::to_string(rules_.uid) + ")"};
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
      return Error{"checkpoint dir " + describe(at_, st) + " is writable by other users"};
    }
    return dir_.release();
  }

 private:
  // Opens the longest trusted prefix of `path` (the site's, followed as the site laid it out) or "/", and queues
  // the components below it.
  std::string start(const std::string& path) {
    std::string base = "/";
    for (const auto& prefix : rules_.trusted_prefixes) {
      if (!prefix.empty() && prefix.front() == '/' && path_within(path, prefix) && prefix.size() > base.size()) {
        base = prefix;
      }
    }
    int fd = ::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return "cannot open '" + base + "': " + std::strerror(errno);
    dir_.reset(fd);
    at_ = base;
    pending_.clear();
    std::string below = base == "/" ? path : path.substr(base.size());
    for (auto& part : ckpt::split(below, '/')) pending_.push_back(part);
    return {};
  }

  std::string step(const std::string& name) {
    const std::string here = child_path(at_, name);
    for (int attempt = 0; attempt < 2; ++attempt) {
      int fd = ::openat(dir_.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd >= 0) {
        Fd next(fd);
        struct stat st {};
        if (::fstat(next.get(), &st) != 0) return "cannot stat '" + here + "': " + std::strerror(errno);
        if (auto err = check_component(here, st, rules_.uid); !err.empty()) return err;
        dir_.reset(next.release());
        at_ = here;
        return {};
      }
      int err = errno;
      if (err == ENOENT && create_ && attempt == 0) {
        if (::mkdirat(dir_.get(), name.c_str(), 0700) != 0 && errno != EEXIST) {
          return "cannot create '" + here + "': " + std::strerror(errno);
        }
        continue;  // open what is there now, made by us or by a racer; the checks decide
      }
      if (err == ELOOP || err == ENOTDIR) return follow(name, here);
      // The dir itself is named as the store always named it; a component above it by its own path.
      return (pending_.empty() ? "cannot open checkpoint dir '" : "cannot open '") + here + "': " + std::strerror(err);
    }
    return "cannot open '" + here + "'";
  }

  // `name` is not a plain dir: follow it when it is a symlink its owner may set, else refuse.
  std::string follow(const std::string& name, const std::string& here) {
    struct stat st {};
    if (::fstatat(dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return "cannot stat '" + here + "': " + std::strerror(errno);
    }
    if (!S_ISLNK(st.st_mode)) return "checkpoint dir component '" + here + "' is not a directory";
    if (st.st_uid != 0 && st.st_uid != rules_.uid) {
      return "checkpoint dir component " + describe(here, st) + " is a symlink of another user";
    }
    if (++symlinks_ > kMaxSymlinks) return "too many symlinks below '" + here + "'";
    std::array<char, 4096> buf{};
    ssize_t n = ::readlinkat(dir_.get(), name.c_str(), buf.data(), buf.size() - 1);
    if (n < 0) return "cannot read the symlink '" + here + "': " + std::strerror(errno);
    std::string target(buf.data(), static_cast<std::size_t>(n));
    if (target.empty()) return "the symlink '" + here + "' is empty";
    std::deque<std::string> rest;
    rest.swap(pending_);
    if (target.front() == '/') {
      std::string full = target;
      for (const auto& part : rest) full += "/" + part;
      return start(full);  // an absolute target starts again from "/" or the site's prefix
    }
    for (auto& part : ckpt::split(target, '/')) pending_.push_back(part);
    for (auto& part : rest) pending_.push_back(part);
    return {};
  }

  const TrustRules& rules_;
  bool create_;
  Fd dir_;
  std::string at_;                    // the path of dir_, for messages
  std::deque<std::string> pending_;   // components still to open below dir_
  int symlinks_ = 0;
};

}  // namespace

Result<int> open_trusted_dir(const std::string& path, const TrustRules& rules, bool create) {
  try {
    return Walk(rules, create).run(path);
  } catch (const std::exception& e) {
    return Error{std::string("cannot open the checkpoint dir: ") + e.what()};
  }
}

std::vector<std::string> trusted_prefixes_from_env() {
  std::vector<std::string> out;
  const char* env = std::getenv("CKPT_TRUSTED_DIRS");
  if (env == nullptr) return out;
  for (auto& part : ckpt::split(env, ':')) {
    if (!part.empty() && part.front() == '/') out.push_back(part);
  }
  return out;
}

}  // namespace ckpt::fs
