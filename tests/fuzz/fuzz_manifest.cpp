// libFuzzer target: parse_manifest must never crash, must reject unsafe names, and what it accepts must
// print and parse back to the same manifest. Accepted manifests also go through decide_commit.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ckpt/store.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace store = ckpt::store;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto manifest = store::parse_manifest(text);
  if (!manifest) {
    if (manifest.error().empty()) std::abort();  // every rejection says why
    return 0;
  }
  for (const store::ShardRecord& shard : manifest->shards) {
    if (!store::is_safe_name(shard.file)) std::abort();
  }
  std::string printed = store::to_json(*manifest);
  auto back = store::parse_manifest(printed);
  if (!back || store::to_json(*back) != printed) std::abort();
  // Bounded so that one input cannot spend seconds building keys.
  if (manifest->layout.world_size() <= 4096) {
    (void)store::decide_commit(manifest->kind, manifest->layout, manifest->world_size, manifest->shards);
  }
  return 0;
}
