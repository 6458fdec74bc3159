#pragma once
// An srun command line split the way srun's getopt_long reads it: the options with their values, then the
// program and its arguments. ckpt-run needs this to rewrite -N and -x for a relaunch without mistaking an option's
// value for the program. Pure logic.
//
// Forms: --opt=value, --opt value (options that require a value), -N 4, -N4, clustered flags (-lv, -lN4) and
// `--`, after which everything is the program. An option srun only takes with an attached value (--exclusive[=user],
// -I[secs]) never takes the next word. Abbreviated long names are not expanded. Options this table does not know
// are kept as flags and left for srun to judge.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/result.hpp"

namespace ckpt {

enum class SrunArg { None, Required, Optional };

struct SrunOptionSpec {
  const char* name;   // long name without dashes: "nodes"
  char short_name;    // 'N'; 0 when there is none
  SrunArg arg;
};

// srun's own options (Slurm 22.05) followed by the --ckpt-* options of the plugin (ckpt/options.hpp).
const std::vector<SrunOptionSpec>& srun_option_table();

// The table's entry for a long name or a short letter; nullptr when it has none.
const SrunOptionSpec* find_srun_option(std::string_view long_name);
const SrunOptionSpec* find_srun_short_option(char short_name);

struct SrunOption {
  std::string name;                   // as given, without dashes: "N", "nodes", or an unknown name
  bool is_long = false;
  std::optional<std::string> value;
  const SrunOptionSpec* spec = nullptr;  // nullptr when the table does not know the option

  // The long name when the table knows the option ("nodes" for -N), else `name`.
  std::string long_name() const;
  // The words that give this option to srun again: "--nodes=4", or "-N" "4", or "-I5".
  std::vector<std::string> words() const;
};

struct SrunCommandLine {
  std::string srun;                  // the first word, usually "srun"
  std::vector<SrunOption> options;   // in the order given; a cluster (-lv) gives one entry per letter
  std::vector<std::string> command;  // the program and its arguments
};

// Splits `args` (the srun program first). Errors: an empty line, an option missing its value
// ("srun option -N needs a value"), no program after the options.
Result<SrunCommandLine> parse_srun_command_line(const std::vector<std::string>& args);

}  // namespace ckpt
