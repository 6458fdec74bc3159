#include "plugin_state.hpp"

#include <pwd.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <vector>

#include "ckpt/parse.hpp"

namespace ckpt::spank {

namespace {

// Slurm keeps pointers to the option table, so it must outlive registration.
std::vector<spank_option>& option_table() {
  static std::vector<spank_option> table;
  return table;
}

// The variable through which sbatch hands an option to the sruns of its script.
std::string inherited_env_name(const char* option_name) {
  std::string name = std::string("SLURM_SPANK__SLURM_SPANK_OPTION_ckpt_") + option_name;
  for (char& c : name) c = c == '-' ? '_' : c;
  return name;
}

int on_option(int val, const char* optarg, int remote) {
  try {
    const auto& specs = ckpt::option_specs();
    if (val < 0 || static_cast<std::size_t>(val) >= specs.size()) return -1;
    auto index = static_cast<std::size_t>(val);
    auto& state = plugin_state();
    std::string value = optarg ? optarg : "";
    if (!remote) {
      // Slurm replays sbatch's options before srun's own: an explicit srun value overrides, not conflicts.
      const char* env = std::getenv(inherited_env_name(specs[index].name).c_str());
      if (state.inherited[index]) {
        ckpt::clear_job_option(state.user, specs[index].id);
        state.inherited[index] = false;
      } else if (env != nullptr && value == env) {
        state.inherited[index] = true;
      }
    }
    auto status = ckpt::set_job_option(state.user, specs[index].id, value);
    if (!status) {
      // In slurmstepd Slurm only logs a failed option and runs the step without it: fail the tasks instead.
      if (remote) return fail_tasks(status.error());
      log_error(status.error());
      if (plugin_state().first_error.empty()) plugin_state().first_error = status.error();
      return -1;
    }
    return 0;
  } catch (...) {
    return -1;
  }
}

}  // namespace

PluginState& plugin_state() {
  static PluginState state;
  return state;
}

int register_options(spank_t sp) {
  auto& table = option_table();
  if (table.empty()) {
    int index = 0;
    for (const auto& spec : ckpt::option_specs()) {
      table.push_back(spank_option{const_cast<char*>(spec.name), const_cast<char*>(spec.arginfo),
                                   const_cast<char*>(spec.usage), ckpt::kOptionHasArg, index++,
                                   on_option});
    }
  }
  for (auto& option : table) {
    if (spank_option_register(sp, &option) != ESPANK_SUCCESS) {
      log_error(std::string("cannot register --") + option.name);
      return -1;
    }
  }
  return 0;
}

std::uint32_t restart_count(spank_t sp) {
  std::uint32_t restarts = 0;
  spank_get_item(sp, S_SLURM_RESTART_COUNT, &restarts);
  auto env = ckpt::parse_uint(job_getenv(sp, "SLURM_RESTART_COUNT"));
  if (env && *env > restarts && *env <= 0xffffffffULL) restarts = static_cast<std::uint32_t>(*env);
  return restarts;
}

std::string job_getenv(spank_t sp, const char* name) {
  if (spank_remote(sp)) {
    // Node lists of large jobs outgrow any fixed buffer: grow it until the value fits (up to 16 MiB).
    for (std::size_t size = 4096; size <= (16u << 20); size *= 4) {
      std::vector<char> buf(size, '\0');
      spank_err_t rc = spank_getenv(sp, name, buf.data(), static_cast<int>(buf.size()));
      if (rc == ESPANK_SUCCESS) return buf.data();
      if (rc != ESPANK_NOSPACE) return {};
    }
    return {};
  }
  const char* value = std::getenv(name);
  return value ? value : "";
}

std::string user_name(uid_t uid) {
  std::array<char, 16384> buf{};
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return {};
  return found->pw_name;
}

void log_user(const std::string& line) { slurm_spank_log("ckpt: %s", line.c_str()); }

void log_error(const std::string& line) { slurm_error("ckpt: %s", line.c_str()); }

}  // namespace ckpt::spank
