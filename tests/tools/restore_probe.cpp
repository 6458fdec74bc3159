// restore_probe: one rank restores, with its settings from the environment as the plugin and the launcher give
// them (CKPT_DIR, CKPT_RESUME_STEP, RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS, ...), and prints
//   <rank> <step> <bytes read> <bytes loaded>
// bytes read: /proc/self/io rchar over the restore; bytes loaded: the regions it restored. With --plugin ROOT it
// prints instead what the plugin's choice of a checkpoint reads: "<checksums> <step> <bytes read>", for the
// records-only check it makes and for the full verification of every shard.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "ckpt/hooks.hpp"
#include "ckpt/store.hpp"

namespace {

unsigned long long rchar() {
  std::ifstream in("/proc/self/io");
  std::string key;
  unsigned long long value = 0;
  while (in >> key >> value) {
    if (key == "rchar:") return value;
  }
  return 0;
}

int plugin(const std::string& root) {
  for (bool checksums : {false, true}) {
    ckpt::store::ResolveOptions options;
    options.mark = false;
    options.checksums = checksums;
    unsigned long long before = rchar();
    auto choice = ckpt::store::resolve_resume(root, options);
    unsigned long long read = rchar() - before;
    std::printf("%s %s %llu\n", checksums ? "checksums" : "records",
                choice.step ? std::to_string(*choice.step).c_str() : "none", read);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--plugin") == 0) return plugin(argv[2]);
  if (argc != 1) {
    std::fprintf(stderr, "usage: restore_probe | restore_probe --plugin ROOT\n");
    return 2;
  }
  ckpt::hooks::Options options;
  (void)options.set("signals", "off");
  auto cp = ckpt::hooks::Checkpointer::create(options);
  if (!cp) {
    std::fprintf(stderr, "restore_probe: %s\n", cp.error().c_str());
    return 1;
  }
  unsigned long long before = rchar();
  auto step = (*cp)->restore(false);
  unsigned long long read = rchar() - before;
  if (!step) {
    std::fprintf(stderr, "restore_probe: %s\n", step.error().c_str());
    return 1;
  }
  unsigned long long loaded = 0;
  for (const auto& region : (*cp)->restored()) loaded += region.size;
  std::printf("%d %llu %llu %llu\n", (*cp)->config().rank, static_cast<unsigned long long>(*step), read, loaded);
  (void)(*cp)->close();
  return 0;
}
