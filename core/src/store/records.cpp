// The store's on-disk records: names, and the JSON of shard records and manifests. Pure; parsers never throw.
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>

#include "ckpt/store.hpp"

namespace ckpt::store {

namespace {

// A list of counts ("shape", "global_shape", "offset"), or an error naming the field.
Result<std::vector<std::uint64_t>> counts(const nlohmann::json& meta, const char* key) {
  const nlohmann::json& v = meta.at(key);
  if (!v.is_array() || v.size() > 64) return Error{std::string("'") + key + "' is not a list of at most 64 counts"};
  std::vector<std::uint64_t> out;
  for (const nlohmann::json& d : v) {
    if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<std::int64_t>() >= 0)) {
      return Error{std::string("'") + key + "' " + v.dump() + " holds something other than a count"};
    }
    out.push_back(d.get<std::uint64_t>());
  }
  return out;
}

std::string dims(const std::vector<std::uint64_t>& v) { return nlohmann::json(v).dump(); }

}  // namespace

Result<std::optional<TensorChunk>> tensor_chunk(const nlohmann::json& meta) {
  if (!meta.is_object() || !meta.contains("shape")) return std::optional<TensorChunk>{};
  TensorChunk c;
  auto shape = counts(meta, "shape");
  if (!shape) return Error{shape.error()};
  c.shape = *shape;
  c.global_shape = c.shape;
  c.offset.assign(c.shape.size(), 0);
  if (meta.contains("global_shape")) {
    auto global = counts(meta, "global_shape");
    if (!global) return Error{global.error()};
    if (global->size() != c.shape.size()) {
      return Error{"'global_shape' " + dims(*global) + " has another number of dimensions than 'shape' " +
                   dims(c.shape)};
    }
    c.global_shape = *global;
  }
  if (meta.contains("offset")) {
    auto offset = counts(meta, "offset");
    if (!offset) return Error{offset.error()};
    if (offset->size() != c.shape.size()) {
      return Error{"'offset' " + dims(*offset) + " has another number of dimensions than 'shape' " + dims(c.shape)};
    }
    c.offset = *offset;
  }
  for (std::size_t d = 0; d < c.shape.size(); ++d) {
    if (c.offset[d] > c.global_shape[d] || c.shape[d] > c.global_shape[d] - c.offset[d]) {
      return Error{"the block of shape " + dims(c.shape) + " at 'offset' " + dims(c.offset) +
                   " lies outside 'global_shape' " + dims(c.global_shape)};
    }
  }
  if (meta.contains("replica_group")) {
    const nlohmann::json& g = meta.at("replica_group");
    if (!g.is_string() || (g != "dp" && g != "rank")) {
      return Error{"'replica_group' " + g.dump() + " is neither \"dp\" nor \"rank\""};
    }
    c.replica_group = g.get<std::string>();
  }
  return std::optional<TensorChunk>{std::move(c)};
}

namespace {

using nlohmann::json;

constexpr int kFormat = 1;
// Bounds that keep a hostile manifest from costing more than a real one: 2^18 ranks is beyond any job we know.
constexpr std::uint64_t kMaxWorld = 1u << 18;
constexpr std::size_t kMaxManifestBytes = 256u << 20;
constexpr std::size_t kMaxRecordBytes = 64u << 20;
// Printing a value recurses once per level, so deeper input is refused before it is parsed.
constexpr int kMaxDepth = 64;

// Thrown inside this file only; every public parser catches it.
struct ParseFail {
  std::string message;
};

[[noreturn]] void fail(std::string message) { throw ParseFail{std::move(message)}; }

// The deepest nesting of arrays and objects, ignoring brackets inside strings; stops counting past the limit.
bool nesting_within_limit(std::string_view text) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxDepth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

json parse_text(std::string_view text, std::size_t max_bytes) {
  if (text.size() > max_bytes) fail("larger than " + std::to_string(max_bytes) + " bytes");
  if (!nesting_within_limit(text)) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) fail("not valid JSON");
  if (!doc.is_object()) fail("not a JSON object");
  return doc;
}

const json& member(const json& obj, const char* key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(where + key + ": missing");
  return *it;
}

std::uint64_t get_u64(const json& obj, const char* key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_number_unsigned()) fail(where + key + ": expected a non-negative integer");
  return v.get<std::uint64_t>();
}

int get_int(const json& obj, const char* key, const std::string& where, std::uint64_t max) {
  std::uint64_t v = get_u64(obj, key, where);
  if (v > max) fail(where + key + ": " + std::to_string(v) + " is out of range");
  return static_cast<int>(v);
}

std::string get_string(const json& obj, const char* key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_string()) fail(where + key + ": expected a string");
  return v.get<std::string>();
}

const json& get_array(const json& obj, const char* key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_array()) fail(where + key + ": expected an array");
  return v;
}

std::string hex64(std::uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::uint64_t parse_hex64(const std::string& text, const std::string& what) {
  if (text.size() != 16) fail(what + ": expected 16 hex digits");
  std::uint64_t value = 0;
  for (char c : text) {
    int digit = 0;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      fail(what + ": expected 16 lowercase hex digits");
    }
    value = (value << 4) | static_cast<std::uint64_t>(digit);
  }
  return value;
}

json record_to_json(const ShardRecord& r) {
  json states = json::array();
  for (const StateRange& s : r.states) {
    json range = {{"name", s.name}, {"offset", s.offset}, {"length", s.length}, {"meta", s.meta}};
    if (s.checksum) range["checksum"] = hex64(*s.checksum);
    states.push_back(std::move(range));
  }
  return {{"rank", r.rank},   {"file", r.file},     {"size", r.size}, {"checksum", hex64(r.checksum)},
          {"states", states}, {"covers", r.covers}};
}

ShardRecord record_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) fail(where + "expected an object");
  ShardRecord r;
  r.rank = get_int(j, "rank", where, static_cast<std::uint64_t>(std::numeric_limits<int>::max()));
  r.file = get_string(j, "file", where);
  if (!is_safe_name(r.file)) fail(where + "file: unsafe name '" + r.file + "'");
  r.size = get_u64(j, "size", where);
  r.checksum = parse_hex64(get_string(j, "checksum", where), where + "checksum");
  std::set<std::string> names;
  const json& states = get_array(j, "states", where);
  r.states.reserve(states.size());
  for (std::size_t i = 0; i < states.size(); ++i) {
    std::string at = where + "states[" + std::to_string(i) + "].";
    const json& s = states[i];
    if (!s.is_object()) fail(at + ": expected an object");
    StateRange range;
    range.name = get_string(s, "name", at);
    if (range.name.empty()) fail(at + "name: empty");
    if (!names.insert(range.name).second) fail(at + "name: duplicate '" + range.name + "'");
    range.offset = get_u64(s, "offset", at);
    range.length = get_u64(s, "length", at);
    if (range.offset > r.size || range.length > r.size - range.offset) {
      fail(at + " '" + range.name + "': range ends past the shard size " + std::to_string(r.size));
    }
    if (auto meta = s.find("meta"); meta != s.end()) range.meta = *meta;
    if (s.contains("checksum")) range.checksum = parse_hex64(get_string(s, "checksum", at), at + "checksum");
    r.states.push_back(std::move(range));
  }
  std::set<std::string> keys;
  const json& covers = get_array(j, "covers", where);
  for (std::size_t i = 0; i < covers.size(); ++i) {
    if (!covers[i].is_string()) fail(where + "covers[" + std::to_string(i) + "]: expected a string");
    std::string key = covers[i].get<std::string>();
    if (!keys.insert(key).second) fail(where + "covers: duplicate '" + key + "'");
    r.covers.push_back(std::move(key));
  }
  return r;
}

Kind kind_from_json(const json& manifest) {
  std::string kind = get_string(manifest, "kind", "");
  if (kind == "periodic") return Kind::Periodic;
  if (kind == "terminal") return Kind::Terminal;
  fail("kind: expected \"periodic\" or \"terminal\"");
}

// The parallel layout; bounded so that the rank coordinates checked against it stay small.
Layout layout_from_json(const json& layout) {
  if (!layout.is_object()) fail("layout: expected an object");
  Layout out;
  out.dp = get_int(layout, "dp", "layout.", kMaxWorld);
  out.tp = get_int(layout, "tp", "layout.", kMaxWorld);
  out.pp = get_int(layout, "pp", "layout.", kMaxWorld);
  if (out.dp < 1 || out.tp < 1 || out.pp < 1) fail("layout: sizes must be at least 1");
  if (static_cast<std::uint64_t>(out.dp) * static_cast<std::uint64_t>(out.tp) *
          static_cast<std::uint64_t>(out.pp) > kMaxWorld) {
    fail("layout: dp*tp*pp is out of range");
  }
  const json& zero1 = member(layout, "zero1", "layout.");
  if (!zero1.is_boolean()) fail("layout.zero1: expected true or false");
  out.zero1 = zero1.get<bool>();
  return out;
}

// Each rank's coordinates, within the world and the layout; a rank listed twice is refused.
std::vector<RankCoord> ranks_from_json(const json& ranks, int world_size, const Layout& layout) {
  std::vector<RankCoord> out;
  std::set<int> seen_ranks;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    std::string at = "ranks[" + std::to_string(i) + "].";
    if (!ranks[i].is_object()) fail(at + ": expected an object");
    RankCoord c;
    c.rank = get_int(ranks[i], "rank", at, static_cast<std::uint64_t>(world_size - 1));
    c.dp = get_int(ranks[i], "dp", at, static_cast<std::uint64_t>(layout.dp - 1));
    c.tp = get_int(ranks[i], "tp", at, static_cast<std::uint64_t>(layout.tp - 1));
    c.pp = get_int(ranks[i], "pp", at, static_cast<std::uint64_t>(layout.pp - 1));
    if (!seen_ranks.insert(c.rank).second) fail(at + "rank: duplicate " + std::to_string(c.rank));
    out.push_back(c);
  }
  return out;
}

// The shard records; two records for one rank, or two naming one file, are refused.
std::vector<ShardRecord> shards_from_json(const json& shards) {
  std::vector<ShardRecord> out;
  std::set<int> shard_ranks;
  std::set<std::string> shard_files;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    std::string at = "shards[" + std::to_string(i) + "].";
    ShardRecord r = record_from_json(shards[i], at);
    if (!shard_ranks.insert(r.rank).second) fail(at + "rank: duplicate " + std::to_string(r.rank));
    if (!shard_files.insert(r.file).second) fail(at + "file: duplicate '" + r.file + "'");
    out.push_back(std::move(r));
  }
  return out;
}

std::string dump(const json& j) {
  // Invalid UTF-8 in a name is replaced rather than thrown on; writers reject such names before they get here.
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace

bool is_safe_name(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name) {
    if (c == '/' || c == '\0') return false;
  }
  return true;
}

std::string step_dir_name(std::uint64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%012llu", static_cast<unsigned long long>(step));
  return buf;
}

std::optional<std::uint64_t> parse_step_dir_name(std::string_view name) {
  if (name.size() != 12) return std::nullopt;
  std::uint64_t step = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + static_cast<std::uint64_t>(c - '0');
  }
  return step;
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.shard", rank);
  return buf;
}

std::string record_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.rec", rank);
  return buf;
}

const char* to_string(State state) {
  switch (state) {
    case State::Complete: return "complete";
    case State::Incomplete: return "incomplete";
    case State::Corrupt: return "corrupt";
    case State::Failed: return "failed";
  }
  return "unknown";
}

const char* to_string(Kind kind) { return kind == Kind::Terminal ? "terminal" : "periodic"; }

const char* to_string(SavePhase phase) {
  switch (phase) {
    case SavePhase::ShardOpened: return "ShardOpened";
    case SavePhase::ShardHalfWritten: return "ShardHalfWritten";
    case SavePhase::ShardsDurable: return "ShardsDurable";
    case SavePhase::ManifestHalfWritten: return "ManifestHalfWritten";
    case SavePhase::ManifestTempWritten: return "ManifestTempWritten";
    case SavePhase::ManifestRenamed: return "ManifestRenamed";
    case SavePhase::Committed: return "Committed";
  }
  return "unknown";
}

std::string to_json(const ShardRecord& record) { return dump(record_to_json(record)); }

std::string to_json(const Manifest& m) {
  json ranks = json::array();
  for (const RankCoord& c : m.ranks) ranks.push_back({{"rank", c.rank}, {"dp", c.dp}, {"tp", c.tp}, {"pp", c.pp}});
  json shards = json::array();
  for (const ShardRecord& r : m.shards) shards.push_back(record_to_json(r));
  json j = {{"format", kFormat},
            {"step", m.step},
            {"kind", to_string(m.kind)},
            {"wall_time", m.wall_time},
            {"world_size", m.world_size},
            {"layout", {{"dp", m.layout.dp}, {"tp", m.layout.tp}, {"pp", m.layout.pp}, {"zero1", m.layout.zero1}}},
            {"ranks", ranks},
            {"shards", shards}};
  return dump(j);
}

Result<ShardRecord> parse_shard_record(std::string_view text) {
  try {
    return record_from_json(parse_text(text, kMaxRecordBytes), "");
  } catch (const ParseFail& e) {
    return Error{"shard record: " + e.message};
  } catch (const std::exception& e) {
    return Error{std::string("shard record: ") + e.what()};
  }
}

Result<Manifest> parse_manifest(std::string_view text) {
  try {
    json j = parse_text(text, kMaxManifestBytes);
    Manifest m;
    if (get_u64(j, "format", "") != kFormat) fail("format: unsupported version");
    m.step = get_u64(j, "step", "");
    m.kind = kind_from_json(j);
    const json& wall = member(j, "wall_time", "");
    if (!wall.is_number() || !std::isfinite(wall.get<double>()) || wall.get<double>() < 0) {
      fail("wall_time: expected a non-negative number");
    }
    m.wall_time = wall.get<double>();
    m.world_size = get_int(j, "world_size", "", kMaxWorld);
    if (m.world_size < 1) fail("world_size: must be at least 1");
    m.layout = layout_from_json(member(j, "layout", ""));
    m.ranks = ranks_from_json(get_array(j, "ranks", ""), m.world_size, m.layout);
    m.shards = shards_from_json(get_array(j, "shards", ""));
    return m;
  } catch (const ParseFail& e) {
    return Error{"manifest: " + e.message};
  } catch (const std::exception& e) {
    return Error{std::string("manifest: ") + e.what()};
  }
}

}  // namespace ckpt::store
