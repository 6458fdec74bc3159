#pragma once
// The ckpt subcommands. Each add_*_commands registers its subcommands on the app; a subcommand's callback sets
// `exit_code` (0 success, 1 a negative answer such as "verify failed", 2 the question could not be asked).
#include <CLI/CLI.hpp>

// The tool's one-line description (its --help and the man page's NAME).
inline constexpr const char* kCkptAbout = "ckpt: inspect and maintain slurm-ckpt checkpoint directories";

// ls, verify, latest and gc over a checkpoint dir.
void add_store_commands(CLI::App& app, int& exit_code);
void add_interval_commands(CLI::App& app, int& exit_code);  // interval and simulate: the interval model.
// export: a checkpoint's model weights as safetensors or a torch.save file.
void add_export_commands(CLI::App& app, int& exit_code);
