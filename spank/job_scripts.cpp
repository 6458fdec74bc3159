// slurmd's job prolog and epilog (slurm_spank_job_prolog, slurm_spank_job_epilog) remove the job's node tier on the
// node (ckpt/memtier.hpp: staging files under the site's node_dir=, /dev/shm by default, that outlive the job's
// processes on purpose, for a relaunch inside the job):
//   epilog  when the job ends on the node: the tier's memory goes back;
//   prolog  before the job's first task on the node: whatever is there under the job's name was left by an earlier
//           job with the same id (ids are reused after a reset or a wrap) whose epilog failed, and is never this
//           job's.
// The removal runs in a child that has become the job's owner: root removes nothing the owner could not.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/memtier.hpp"
#include "ckpt/posix.hpp"
#include "ckpt/store.hpp"
#include "plugin_state.hpp"

namespace ckpt::spank {

namespace {

int remove_node_tier(spank_t sp, const std::vector<std::string>& args, const std::string& script) {
  // The site's node_dir=, which the ranks were given. A plugstack.conf broken since the job started is said and
  // cleans nothing (every new step refuses it already); the script must not fail for it.
  auto policy = parse_site_policy(args);
  if (!policy) {
    log_error(script + ": " + policy.error() + "; the job's node tier is not removed");
    return 0;
  }
  const std::string node_dir = policy->node_dir;
  if (node_dir.empty()) return 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::uint32_t job_id = 0;
  if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS) {
    return 0;
  }
  const std::string name = memtier::node_dir_name(uid, std::to_string(job_id));
  const std::string path = node_dir + "/" + name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;  // most jobs: none here
  // Another user's dir of that name (made to be removed with root's rights) is not the job's: left alone.
  if (st.st_uid != uid) {
    log_error("job " + std::to_string(job_id) + ": " + path + " belongs to uid " + std::to_string(st.st_uid) +
              ", not the job's user; not removed");
    return 0;
  }
  pid_t pid = fork();
  if (pid < 0) {
    log_error("job " + std::to_string(job_id) + ": cannot remove " + path + ": fork failed");
    return 0;
  }
  if (pid == 0) {
    if (!posix::drop_privileges(uid, gid, nullptr, 0)) _exit(2);
    Status removed = store::remove_tree(node_dir, name);
    _exit(removed ? 0 : 1);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    log_error("job " + std::to_string(job_id) + ": " + script + ": the node tier " + path +
              " was not removed (helper status " + std::to_string(status) + ")");
  } else if (script == "job prolog") {
    log_user("job " + std::to_string(job_id) + ": job prolog: removed " + path +
             ", left by an earlier job with the same id");
  }
  return 0;
}

}  // namespace

int job_prolog(spank_t sp, const std::vector<std::string>& args) { return remove_node_tier(sp, args, "job prolog"); }

int job_epilog(spank_t sp, const std::vector<std::string>& args) { return remove_node_tier(sp, args, "job epilog"); }

}  // namespace ckpt::spank
