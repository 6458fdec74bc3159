// ckpt: inspect and maintain slurm-ckpt checkpoint directories.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{kCkptAbout};
  app.require_subcommand(1);
  int exit_code = 0;
  add_store_commands(app, exit_code);
  add_interval_commands(app, exit_code);
  add_export_commands(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::fprintf(stderr, "ckpt: %s (see ckpt --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt: internal error: %s\n", e.what());
    return 2;
  }
  return exit_code;
}
