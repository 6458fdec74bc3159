// libFuzzer target: parse_shard_record must never crash, must reject unsafe names and ranges past the shard,
// and what it accepts must print and parse back to the same record.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ckpt/store.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace store = ckpt::store;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto record = store::parse_shard_record(text);
  if (!record) {
    if (record.error().empty()) std::abort();
    return 0;
  }
  if (!store::is_safe_name(record->file) || record->rank < 0) std::abort();
  for (const store::StateRange& s : record->states) {
    if (s.offset > record->size || s.length > record->size - s.offset) std::abort();
  }
  std::string printed = store::to_json(*record);
  auto back = store::parse_shard_record(printed);
  if (!back || store::to_json(*back) != printed) std::abort();
  return 0;
}
