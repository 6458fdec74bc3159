// ckpt: inspect and maintain checkpoint directories.
#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"ckpt: inspect and maintain slurm-ckpt checkpoint directories"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
