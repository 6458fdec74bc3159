#include "ckpt/srun_cmdline.hpp"

#include <iterator>

#include "ckpt/options.hpp"

namespace ckpt {

namespace {

using enum SrunArg;

// srun's options as the OPTIONS section of srun(1) of Slurm 22.05 lists them: "=<value>" is Required, "[=value]"
// Optional, nothing None. Flags are listed too, so that a cluster like -lN4 is read letter by letter.
// ntasks-per-tres is accepted by srun 22.05 although its man page does not list it.
constexpr SrunOptionSpec kSrunOptions[] = {
    {"accel-bind", 0, Required}, {"account", 'A', Required}, {"acctg-freq", 0, Required},
    {"bb", 0, Required}, {"bbf", 0, Required}, {"bcast", 0, Optional}, {"bcast-exclude", 0, Required},
    {"begin", 'b', Required}, {"chdir", 'D', Required}, {"cluster-constraint", 0, Required},
    {"clusters", 'M', Required}, {"comment", 0, Required}, {"compress", 0, Optional},
    {"constraint", 'C', Required}, {"container", 0, Required}, {"contiguous", 0, None},
    {"core-spec", 'S', Required}, {"cores-per-socket", 0, Required}, {"cpu-bind", 0, Required},
    {"cpu-freq", 0, Required}, {"cpus-per-gpu", 0, Required}, {"cpus-per-task", 'c', Required},
    {"deadline", 0, Required}, {"delay-boot", 0, Required}, {"dependency", 'd', Required},
    {"disable-status", 'X', None}, {"distribution", 'm', Required}, {"epilog", 0, Required},
    {"error", 'e', Required}, {"exact", 0, None}, {"exclude", 'x', Required}, {"exclusive", 0, Optional},
    {"export", 0, Required}, {"extra-node-info", 'B', Required}, {"gid", 0, Required},
    {"gpu-bind", 0, Required}, {"gpu-freq", 0, Required}, {"gpus", 'G', Required},
    {"gpus-per-node", 0, Required}, {"gpus-per-socket", 0, Required}, {"gpus-per-task", 0, Required},
    {"gres", 0, Required}, {"gres-flags", 0, Required}, {"help", 'h', None}, {"het-group", 0, Required},
    {"hint", 0, Required}, {"hold", 'H', None}, {"immediate", 'I', Optional}, {"input", 'i', Required},
    {"job-name", 'J', Required}, {"jobid", 0, Required}, {"kill-on-bad-exit", 'K', Optional},
    {"label", 'l', None}, {"licenses", 'L', Required}, {"mail-type", 0, Required},
    {"mail-user", 0, Required}, {"mcs-label", 0, Required}, {"mem", 0, Required},
    {"mem-bind", 0, Required}, {"mem-per-cpu", 0, Required}, {"mem-per-gpu", 0, Required},
    {"mincpus", 0, Required}, {"mpi", 0, Required}, {"msg-timeout", 0, Required}, {"multi-prog", 0, None},
    {"network", 0, Required}, {"nice", 0, Optional}, {"no-allocate", 'Z', None}, {"no-kill", 'k', Optional},
    {"nodefile", 'F', Required}, {"nodelist", 'w', Required}, {"nodes", 'N', Required},
    {"ntasks", 'n', Required}, {"ntasks-per-core", 0, Required}, {"ntasks-per-gpu", 0, Required},
    {"ntasks-per-node", 0, Required}, {"ntasks-per-socket", 0, Required}, {"ntasks-per-tres", 0, Required},
    {"open-mode", 0, Required}, {"output", 'o', Required}, {"overcommit", 'O', None}, {"overlap", 0, None},
    {"oversubscribe", 's', None}, {"partition", 'p', Required}, {"power", 0, Required},
    {"prefer", 0, Required}, {"preserve-env", 'E', None}, {"priority", 0, Required},
    {"profile", 0, Required}, {"prolog", 0, Required}, {"propagate", 0, Optional}, {"pty", 0, None},
    {"qos", 'q', Required}, {"quiet", 'Q', None}, {"quit-on-interrupt", 0, None}, {"reboot", 0, None},
    {"relative", 'r', Required}, {"reservation", 0, Required}, {"resv-ports", 0, Optional},
    {"send-libs", 0, Optional}, {"signal", 0, Required}, {"slurmd-debug", 0, Required},
    {"sockets-per-node", 0, Required}, {"spread-job", 0, None}, {"switches", 0, Required},
    {"task-epilog", 0, Required}, {"task-prolog", 0, Required}, {"test-only", 0, None},
    {"thread-spec", 0, Required}, {"threads", 'T', Required}, {"threads-per-core", 0, Required},
    {"time", 't', Required}, {"time-min", 0, Required}, {"tmp", 0, Required}, {"uid", 0, Required},
    {"unbuffered", 'u', None}, {"usage", 0, None}, {"use-min-nodes", 0, None}, {"verbose", 'v', None},
    {"version", 'V', None}, {"wait", 'W', Required}, {"wckey", 0, Required}, {"x11", 0, Optional},
};

// How srun reads the plugin's options: SPANK's has_arg 0, 1, 2 is getopt's none, required, optional.
constexpr SrunArg kCkptOptionArg = kOptionHasArg == 0 ? None : kOptionHasArg == 1 ? Required : Optional;

Status missing_value(const std::string& spelling) {
  return Status::failure("srun option " + spelling + " needs a value");
}

// "--name", "--name=value" or "--name value" at args[i]; moves i past a value taken from the next word.
Status read_long(const std::vector<std::string>& args, std::size_t& i, SrunCommandLine& line) {
  const std::string& word = args[i];
  const auto eq = word.find('=');
  SrunOption option;
  option.is_long = true;
  option.name = word.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
  option.spec = find_srun_option(option.name);
  if (eq != std::string::npos) {
    option.value = word.substr(eq + 1);
  } else if (option.spec != nullptr && option.spec->arg == Required) {
    if (i + 1 >= args.size()) return missing_value(word);
    option.value = args[++i];
  }
  line.options.push_back(std::move(option));
  return Status::success();
}

// "-l", "-N4", "-N 4" or a cluster "-lvN4" at args[i], read letter by letter as getopt does.
Status read_short(const std::vector<std::string>& args, std::size_t& i, SrunCommandLine& line) {
  const std::string& word = args[i];
  for (std::size_t k = 1; k < word.size(); ++k) {
    SrunOption option;
    option.name = std::string(1, word[k]);
    option.spec = find_srun_short_option(word[k]);
    const SrunArg arg = option.spec != nullptr ? option.spec->arg : None;
    const bool rest = k + 1 < word.size();
    if (arg == Optional && rest) option.value = word.substr(k + 1);
    if (arg == Required) {
      if (rest) {
        option.value = word.substr(k + 1);
      } else if (i + 1 < args.size()) {
        option.value = args[++i];
      } else {
        return missing_value("-" + option.name);
      }
    }
    line.options.push_back(std::move(option));
    if (arg != None) break;  // the rest of the word was the value
  }
  return Status::success();
}

}  // namespace

const std::vector<SrunOptionSpec>& srun_option_table() {
  static const std::vector<SrunOptionSpec> table = [] {
    std::vector<SrunOptionSpec> all(std::begin(kSrunOptions), std::end(kSrunOptions));
    for (const auto& spec : option_specs()) all.push_back({spec.name, 0, kCkptOptionArg});
    return all;
  }();
  return table;
}

const SrunOptionSpec* find_srun_option(std::string_view long_name) {
  for (const auto& spec : srun_option_table()) {
    if (long_name == spec.name) return &spec;
  }
  return nullptr;
}

const SrunOptionSpec* find_srun_short_option(char short_name) {
  if (short_name == 0) return nullptr;
  for (const auto& spec : srun_option_table()) {
    if (spec.short_name == short_name) return &spec;
  }
  return nullptr;
}

std::string SrunOption::long_name() const { return spec != nullptr ? spec->name : name; }

std::vector<std::string> SrunOption::words() const {
  if (is_long) return {"--" + name + (value ? "=" + *value : "")};
  if (!value) return {"-" + name};
  // An optional value must stay attached, or srun would take it for the program.
  if (spec != nullptr && spec->arg == SrunArg::Optional) return {"-" + name + *value};
  return {"-" + name, *value};
}

Result<SrunCommandLine> parse_srun_command_line(const std::vector<std::string>& args) {
  if (args.empty()) return Error{"no srun command line"};
  SrunCommandLine line;
  line.srun = args[0];
  std::size_t i = 1;
  for (; i < args.size(); ++i) {
    const std::string& word = args[i];
    if (word == "--") {
      ++i;
      break;
    }
    if (word.size() < 2 || word[0] != '-') break;  // the program
    Status status = word[1] == '-' ? read_long(args, i, line) : read_short(args, i, line);
    if (!status) return Error{status.error()};
  }
  line.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (line.command.empty()) return Error{"no command after the srun options"};
  return line;
}

}  // namespace ckpt
