// A checkpoint's model weights in safetensors and torch.save's layout: the tensors and the formats' headers.
#include "ckpt/weights.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace ckpt::weights {

namespace {

using nlohmann::json;

constexpr std::array<DType, 10> kDTypes{{
    {"float64", "F64", "DoubleStorage", 8},
    {"float32", "F32", "FloatStorage", 4},
    {"float16", "F16", "HalfStorage", 2},
    {"bfloat16", "BF16", "BFloat16Storage", 2},
    {"int64", "I64", "LongStorage", 8},
    {"int32", "I32", "IntStorage", 4},
    {"int16", "I16", "ShortStorage", 2},
    {"int8", "I8", "CharStorage", 1},
    {"uint8", "U8", "ByteStorage", 1},
    {"bool", "BOOL", "BoolStorage", 1},
}};

constexpr std::size_t kMaxDims = 64;

bool is_utf8(const std::string& text) {
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::exception&) {
    return false;
  }
}

// The tensor a model region holds, or why it holds none.
Result<Tensor> tensor_of(const store::StateRange& range, std::size_t shard, std::uint64_t shard_size) {
  const std::string what = "region '" + range.name + "'";
  Tensor t;
  t.name = range.name.substr(kModelPrefix.size());
  if (t.name.empty()) return Error{what + " has no tensor name after 'model/'"};
  if (!is_utf8(t.name)) return Error{what + ": the name is not UTF-8"};
  if (t.name == "__metadata__") return Error{what + ": the name is the safetensors header's own key"};
  const json& meta = range.meta;
  if (!meta.is_object() || !meta.contains("dtype") || !meta.contains("shape")) {
    return Error{what + " records no dtype and shape"};
  }
  if (!meta["dtype"].is_string() || (t.dtype = dtype_named(meta["dtype"].get<std::string>())) == nullptr) {
    return Error{what + ": dtype " + meta["dtype"].dump() + " is not one safetensors and torch both carry"};
  }
  const json& shape = meta["shape"];
  if (!shape.is_array() || shape.size() > kMaxDims) return Error{what + ": the shape is not a list of dimensions"};
  std::uint64_t bytes = t.dtype->size;
  for (const json& d : shape) {
    const bool count = d.is_number_unsigned() || (d.is_number_integer() && d.get<std::int64_t>() >= 0);
    if (!count) return Error{what + ": the shape " + shape.dump() + " has a dimension that is not a count"};
    const auto n = d.is_number_unsigned() ? d.get<std::uint64_t>() : static_cast<std::uint64_t>(d.get<std::int64_t>());
    if (n != 0 && bytes > std::numeric_limits<std::uint64_t>::max() / n) return Error{what + ": the shape overflows"};
    bytes *= n;
    t.shape.push_back(n);
  }
  if (bytes != range.length) {
    return Error{what + " holds " + std::to_string(range.length) + " bytes, not the " + std::to_string(bytes) +
                 " of a " + std::string(t.dtype->name) + " tensor of shape " + shape.dump()};
  }
  if (range.offset > shard_size || range.length > shard_size - range.offset) {
    return Error{what + " lies past the end of its shard"};
  }
  t.shard = shard;
  t.offset = range.offset;
  t.length = range.length;
  t.checksum = range.checksum;
  return t;
}

// Under tensor parallelism: each model tensor whole, from the blocks rank 0 of a job of one rank would read.
Result<std::vector<Tensor>> split_tensors(const store::Manifest& manifest) {
  if (manifest.layout.pp > 1) {
    return Error{"the model is split across " + std::to_string(manifest.layout.pp) + " pipeline stages and " +
                 std::to_string(manifest.layout.tp) + " tensor-parallel ranks, which the export does not join"};
  }
  store::Manifest model = manifest;  // the model's ranges only: the optimizer state is no concern of the export
  for (store::ShardRecord& shard : model.shards) {
    auto not_model = [](const store::StateRange& r) { return r.name.rfind(kModelPrefix, 0) != 0; };
    shard.states.erase(std::remove_if(shard.states.begin(), shard.states.end(), not_model), shard.states.end());
  }
  auto pieces = store::plan_relayout(model, {}, 0);
  if (!pieces) return Error{pieces.error()};
  std::vector<Tensor> tensors;
  std::vector<store::RelayoutPiece> planned = std::move(pieces).value();
  for (store::RelayoutPiece& piece : planned) {
    if (!piece.want) return Error{"region '" + piece.name + "' records no dtype and shape"};
    if (piece.reads.empty()) {
      return Error{"tensor '" + piece.name.substr(kModelPrefix.size()) + "' has no elements; split across " +
                   "tensor-parallel ranks, the export does not carry it"};
    }
    const store::BlockRead& first = piece.reads.front();
    auto t = tensor_of(first.range, first.shard, model.shards[first.shard].size);
    if (!t) return Error{model.shards[first.shard].file + ": " + t.error()};
    if (t->dtype->size != piece.element_size) return Error{"region '" + piece.name + "': another element size"};
    if (piece.reads.size() == 1 && first.saved.shape == piece.want->shape) {
      tensors.push_back(std::move(t).value());  // saved whole in one range
      continue;
    }
    t->shape = piece.want->global_shape;
    t->length = piece.bytes;
    t->checksum.reset();
    t->blocks = std::move(piece.reads);
    t->whole = std::move(piece.want);
    tensors.push_back(std::move(t).value());
  }
  if (tensors.empty()) return Error{"the checkpoint holds no model tensors (regions named 'model/<name>')"};
  return tensors;
}

// The shard that holds stage `pp`'s model: the first in rank order covering model/pp<p>/tp0, or, for shards that
// record no covers, the first rank at that stage's tensor-parallel slice 0.
std::optional<std::size_t> stage_shard(const store::Manifest& manifest, const std::vector<std::size_t>& by_rank,
                                       int pp) {
  const std::string key = "model/pp" + std::to_string(pp) + "/tp0";
  for (std::size_t i : by_rank) {
    const auto& covers = manifest.shards[i].covers;
    if (std::find(covers.begin(), covers.end(), key) != covers.end()) return i;
  }
  for (std::size_t i : by_rank) {
    const store::ShardRecord& shard = manifest.shards[i];
    if (!shard.covers.empty()) continue;
    store::RankCoord coord = manifest.layout.coord_of(shard.rank);
    for (const store::RankCoord& c : manifest.ranks) {
      if (c.rank == shard.rank) coord = c;
    }
    if (coord.pp == pp && coord.tp == 0) return i;
  }
  return std::nullopt;
}

// ---- bytes ----

void put_le(std::string& out, std::uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// The pickle opcodes torch.load's weights-only unpickler accepts, protocol 2.
class Pickler {
 public:
  Pickler() { out_ = "\x80\x02"; }
  void global(std::string_view module, std::string_view name) {
    out_ += 'c';
    out_.append(module).push_back('\n');
    out_.append(name).push_back('\n');
  }
  void mark() { out_ += '('; }
  void tuple() { out_ += 't'; }
  void empty_tuple() { out_ += ')'; }
  void reduce() { out_ += 'R'; }
  void setitems() { out_ += 'u'; }
  void persistent_id() { out_ += 'Q'; }
  void boolean(bool value) { out_ += value ? '\x88' : '\x89'; }
  void string(std::string_view text) {
    out_ += 'X';
    put_le(out_, text.size(), 4);
    out_.append(text);
  }
  void integer(std::uint64_t value) {
    if (value < 0x100) {
      out_ += 'K';
      put_le(out_, value, 1);
    } else if (value < 0x10000) {
      out_ += 'M';
      put_le(out_, value, 2);
    } else if (value < 0x80000000u) {
      out_ += 'J';
      put_le(out_, value, 4);
    } else {  // LONG1: little-endian two's complement, one zero byte more when the top bit is set
      std::string digits;
      for (std::uint64_t v = value; v != 0; v >>= 8) digits.push_back(static_cast<char>(v & 0xff));
      if (static_cast<unsigned char>(digits.back()) & 0x80) digits.push_back('\0');
      out_ += '\x8a';
      out_.push_back(static_cast<char>(digits.size()));
      out_ += digits;
    }
  }
  void ints(const std::vector<std::uint64_t>& values) {
    mark();
    for (std::uint64_t v : values) integer(v);
    tuple();
  }
  std::string finish() { return out_ + '.'; }

 private:
  std::string out_;
};

void put_u16(std::string& out, std::uint64_t v) { put_le(out, v, 2); }
void put_u32(std::string& out, std::uint64_t v) { put_le(out, v, 4); }
void put_u64(std::string& out, std::uint64_t v) { put_le(out, v, 8); }

constexpr std::uint64_t kZip32Max = 0xffffffffu;
constexpr std::uint16_t kDosDate = 0x0021;  // 1980-01-01: the zip epoch
constexpr std::uint16_t kUtf8Names = 0x0800;
constexpr std::uint64_t kAlign = 64;

bool entry_needs_zip64(const ZipEntry& e) { return e.size >= kZip32Max || e.offset >= kZip32Max; }

// The fields a local header and a central directory entry share, from "version needed" to the extra field's length:
// a stored entry, UTF-8 names, the sizes as 0xffffffff when `big_size` puts them in the zip64 extra field.
void put_entry_fields(std::string& out, bool zip64, const ZipEntry& e, bool big_size, std::size_t extra_size) {
  put_u16(out, zip64 ? 45 : 20);  // version needed
  put_u16(out, kUtf8Names);
  put_u16(out, 0);  // stored
  put_u16(out, 0);  // time
  put_u16(out, kDosDate);
  put_u32(out, e.crc32);
  put_u32(out, big_size ? kZip32Max : e.size);  // compressed
  put_u32(out, big_size ? kZip32Max : e.size);
  put_u16(out, e.name.size());
  put_u16(out, extra_size);
}

// The end of central directory record, and zip64's record and locator before it where counts or offsets need them.
std::string zip_end(std::uint64_t count, std::uint64_t size, std::uint64_t directory_offset) {
  const bool zip64 = count >= 0xffff || size >= kZip32Max || directory_offset >= kZip32Max;
  std::string end;
  if (zip64) {
    const std::uint64_t record_at = directory_offset + size;
    put_u32(end, 0x06064b50);
    put_u64(end, 44);
    put_u16(end, 45);
    put_u16(end, 45);
    put_u32(end, 0);
    put_u32(end, 0);
    put_u64(end, count);
    put_u64(end, count);
    put_u64(end, size);
    put_u64(end, directory_offset);
    put_u32(end, 0x07064b50);  // the locator
    put_u32(end, 0);
    put_u64(end, record_at);
    put_u32(end, 1);
  }
  put_u32(end, 0x06054b50);
  put_u16(end, 0);
  put_u16(end, 0);
  put_u16(end, zip64 ? 0xffff : count);
  put_u16(end, zip64 ? 0xffff : count);
  put_u32(end, zip64 ? kZip32Max : size);
  put_u32(end, zip64 ? kZip32Max : directory_offset);
  put_u16(end, 0);
  return end;
}


}  // namespace

const DType* dtype_named(std::string_view name) {
  for (const DType& d : kDTypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

Result<std::vector<Tensor>> model_tensors(const store::Manifest& manifest) {
  const store::Layout& layout = manifest.layout;
  std::vector<std::size_t> by_rank(manifest.shards.size());
  for (std::size_t i = 0; i < by_rank.size(); ++i) by_rank[i] = i;
  std::stable_sort(by_rank.begin(), by_rank.end(),
                   [&](std::size_t a, std::size_t b) { return manifest.shards[a].rank < manifest.shards[b].rank; });
  if (layout.tp > 1) return split_tensors(manifest);
  std::vector<Tensor> tensors;
  std::set<std::string> names;
  for (int pp = 0; pp < std::max(1, layout.pp); ++pp) {
    auto shard = stage_shard(manifest, by_rank, pp);
    if (!shard) return Error{"no shard holds the model of pipeline stage " + std::to_string(pp)};
    const store::ShardRecord& record = manifest.shards[*shard];
    std::vector<Tensor> stage;
    for (const store::StateRange& range : record.states) {
      if (range.name.rfind(kModelPrefix, 0) != 0) continue;
      auto t = tensor_of(range, *shard, record.size);
      if (!t) return Error{record.file + ": " + t.error()};
      if (!names.insert(t->name).second) {
        return Error{"tensor '" + t->name + "' is named twice (" + record.file + ", pipeline stage " +
                     std::to_string(pp) + ")"};
      }
      stage.push_back(std::move(t).value());
    }
    std::stable_sort(stage.begin(), stage.end(), [](const Tensor& a, const Tensor& b) { return a.offset < b.offset; });
    for (Tensor& t : stage) tensors.push_back(std::move(t));
  }
  if (tensors.empty()) return Error{"the checkpoint holds no model tensors (regions named 'model/<name>')"};
  return tensors;
}

std::vector<std::size_t> shards_read(const std::vector<Tensor>& tensors) {
  std::set<std::size_t> shards;
  for (const Tensor& t : tensors) {
    if (t.blocks.empty()) shards.insert(t.shard);
  }
  return {shards.begin(), shards.end()};
}

std::vector<SafetensorsFile> safetensors_files(const std::vector<Tensor>& tensors, std::uint64_t max_file_bytes,
                                               const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::vector<std::vector<std::size_t>> groups;
  std::uint64_t filled = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (groups.empty() || (filled > 0 && tensors[i].length > max_file_bytes - std::min(filled, max_file_bytes))) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(i);
    filled += tensors[i].length;
  }
  std::vector<SafetensorsFile> files;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    SafetensorsFile file;
    if (groups.size() == 1) {
      file.name = "model.safetensors";
    } else {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", g + 1, groups.size());
      file.name = name;
    }
    file.tensors = groups[g];
    // Offsets are relative to the byte after the header; keys are sorted in the JSON, the data is in file order.
    json header = json::object();
    std::uint64_t at = 0;
    for (std::size_t i : file.tensors) {
      const Tensor& t = tensors[i];
      header[t.name] = {{"dtype", t.dtype->safetensors}, {"shape", t.shape}, {"data_offsets", {at, at + t.length}}};
      at += t.length;
    }
    json meta = json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    if (!meta.empty()) header["__metadata__"] = meta;
    std::string text = header.dump(-1, ' ', false, json::error_handler_t::replace);
    text.append((8 - text.size() % 8) % 8, ' ');
    put_u64(file.header, text.size());
    file.header += text;
    file.size = file.header.size() + at;
    files.push_back(std::move(file));
  }
  return files;
}

std::string safetensors_index(const std::vector<Tensor>& tensors, const std::vector<SafetensorsFile>& files) {
  json map = json::object();
  std::uint64_t total = 0;
  for (const SafetensorsFile& file : files) {
    for (std::size_t i : file.tensors) {
      map[tensors[i].name] = file.name;
      total += tensors[i].length;
    }
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
  return index.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

std::string torch_pickle(const std::vector<Tensor>& tensors) {
  Pickler p;
  p.global("collections", "OrderedDict");
  p.empty_tuple();
  p.reduce();
  p.mark();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    p.string(t.name);
    p.global("torch._utils", "_rebuild_tensor_v2");
    p.mark();
    // The storage: ('storage', torch.<Type>Storage, key, location, elements), loaded from <archive>/data/<key>.
    p.mark();
    p.string("storage");
    p.global("torch", t.dtype->storage);
    p.string(std::to_string(i));
    p.string("cpu");
    p.integer(t.length / t.dtype->size);
    p.tuple();
    p.persistent_id();
    p.integer(0);  // storage offset
    p.ints(t.shape);
    std::vector<std::uint64_t> stride(t.shape.size());
    std::uint64_t step = 1;
    for (std::size_t d = t.shape.size(); d-- > 0;) {
      stride[d] = step;
      step *= std::max<std::uint64_t>(t.shape[d], 1);
    }
    p.ints(stride);
    p.boolean(false);  // requires_grad
    p.global("collections", "OrderedDict");  // backward hooks: none
    p.empty_tuple();
    p.reduce();
    p.tuple();
    p.reduce();
  }
  p.setitems();
  return p.finish();
}

std::string zip_local_header(const ZipEntry& entry) {
  const bool zip64 = entry_needs_zip64(entry);
  std::string extra;
  if (zip64) {
    put_u16(extra, 0x0001);
    put_u16(extra, 16);
    put_u64(extra, entry.size);
    put_u64(extra, entry.size);
  }
  const std::uint64_t fixed = 30 + entry.name.size() + extra.size() + 4;
  const std::uint64_t pad = (kAlign - (entry.offset + fixed) % kAlign) % kAlign;
  put_u16(extra, 0x4246);  // "FB": padding, as torch.save writes it
  put_u16(extra, pad);
  extra.append(pad, 'Z');
  std::string h;
  put_u32(h, 0x04034b50);
  put_entry_fields(h, zip64, entry, zip64, extra.size());
  return h + entry.name + extra;
}

std::string zip_directory(const std::vector<ZipEntry>& entries, std::uint64_t directory_offset) {
  std::string dir;
  for (const ZipEntry& e : entries) {
    const bool big_size = e.size >= kZip32Max, big_offset = e.offset >= kZip32Max;
    std::string extra;
    if (big_size || big_offset) {
      put_u16(extra, 0x0001);
      put_u16(extra, (big_size ? 16 : 0) + (big_offset ? 8 : 0));
      if (big_size) {
        put_u64(extra, e.size);
        put_u64(extra, e.size);
      }
      if (big_offset) put_u64(extra, e.offset);
    }
    const bool zip64 = !extra.empty();
    put_u32(dir, 0x02014b50);
    put_u16(dir, zip64 ? 45 : 20);  // made by
    put_entry_fields(dir, zip64, e, big_size, extra.size());
    put_u16(dir, 0);  // comment
    put_u16(dir, 0);  // disk
    put_u16(dir, 0);  // internal attributes
    put_u32(dir, 0);  // external attributes
    put_u32(dir, big_offset ? kZip32Max : e.offset);
    dir += e.name;
    dir += extra;
  }
  return dir + zip_end(entries.size(), dir.size(), directory_offset);
}

}  // namespace ckpt::weights
