#pragma once
// The environment contract: every variable a training process reads, the setting the hooks read it as, who sets
// it, and what a valid value looks like. The plugin's exports (options.hpp's settings_environment and the job's
// facts), ckpt-run's, slurm_ckpt.restart's (through _native.env_names()) and the hooks' config reader all name
// their variables through this one table; a unit test checks that what the plugin exports reads back as the same
// settings.
#include <string>
#include <string_view>
#include <vector>

namespace ckpt::env {

enum class SetBy {
  Plugin,    // spank_ckpt exports it to every rank (the job's settings and facts)
  Launcher,  // ckpt-run, per step it starts; or slurm_ckpt.torch.run, per generation
  Job,       // the user or the program (tuning knobs, the layout)
};

struct Var {
  const char* key;                      // the setting it fills, as hooks::Options names it ("dir")
  const char* name;                     // the variable ("CKPT_DIR")
  const char* expected;                 // what a valid value looks like, for the error line
  SetBy set_by;
  std::vector<const char*> fallbacks;   // read, in order, when `name` is unset ("SLURM_RESTART_COUNT")
};

// The whole table.
const std::vector<Var>& contract();

// The entry of setting `key`, or of variable `name`; nullptr when there is none.
const Var* by_key(std::string_view key);
const Var* by_name(std::string_view name);

// The variable of setting `key`. A key the table does not have is a programming error: it returns "" (the unit
// test of the contract checks every key its users name).
std::string name_of(std::string_view key);

}  // namespace ckpt::env
