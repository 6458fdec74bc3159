// The store: a checkpoint restored onto another split of its tensors. Which saved blocks each wanted block is
// made of (intersections of boxes in the global tensor), and the strided copy of one box. Pure.
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "ckpt/store.hpp"

namespace ckpt::store {

namespace {

using Dims = std::vector<std::uint64_t>;

std::string dims(const Dims& v) { return nlohmann::json(v).dump(); }

// The number of elements of a block; nullopt when it overflows.
std::optional<std::uint64_t> volume(const Dims& shape) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// The box two blocks share, as (lo, extent); nullopt when they share nothing.
std::optional<std::pair<Dims, Dims>> overlap(const TensorChunk& a, const TensorChunk& b) {
  Dims lo(a.offset.size()), extent(a.offset.size());
  for (std::size_t d = 0; d < a.offset.size(); ++d) {
    const std::uint64_t begin = std::max(a.offset[d], b.offset[d]);
    const std::uint64_t end = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (end <= begin) return std::nullopt;
    lo[d] = begin;
    extent[d] = end - begin;
  }
  return std::make_pair(lo, extent);
}

// One saved range of a name, where it lies.
struct Saved {
  std::size_t shard;
  const StateRange* range;
  std::optional<TensorChunk> chunk;
};

// The block this rank wants of a tensor saved as `chunk` (any of its saved blocks): see plan_relayout.
Result<TensorChunk> wanted_block(const std::string& name, const std::vector<Saved>& saved,
                                 const std::map<std::string, nlohmann::json>& declared) {
  const TensorChunk& any = *saved.front().chunk;
  auto declared_block = [&](const std::string& of) -> Result<std::optional<TensorChunk>> {
    auto it = declared.find(of);
    if (it == declared.end()) return std::optional<TensorChunk>{};
    auto chunk = tensor_chunk(it->second);
    if (!chunk) return Error{"tensor '" + of + "': this run's metadata: " + chunk.error()};
    return *chunk;
  };
  auto own = declared_block(name);
  if (!own) return Error{own.error()};
  if (*own) return **own;
  const nlohmann::json& meta = saved.front().range->meta;
  if (auto like = meta.find("split_like"); like != meta.end() && like->is_string()) {
    auto theirs = declared_block(like->get<std::string>());
    if (!theirs) return Error{theirs.error()};
    if (*theirs && (*theirs)->global_shape == any.global_shape) return **theirs;
  }
  TensorChunk whole = any;
  whole.shape = whole.global_shape;
  whole.offset.assign(whole.shape.size(), 0);
  return whole;
}

// Distinct saved blocks (by offset and shape), each with the shards that hold a copy, in manifest order.
using Blocks = std::map<std::pair<Dims, Dims>, std::vector<const Saved*>>;

// The saved blocks of a tensor, checked against the whole tensor this run has; their element size.
Result<Blocks> saved_blocks(const std::vector<Saved>& saved, const Dims& global_shape,
                            std::uint64_t& element_size) {
  Blocks blocks;
  for (const Saved& s : saved) {
    const TensorChunk& c = *s.chunk;
    if (c.global_shape != global_shape) {
      return Error{"saved as a tensor of shape " + dims(c.global_shape) + "; this run's is " + dims(global_shape)};
    }
    auto n = volume(c.shape);
    if (!n) return Error{"a saved block of shape " + dims(c.shape) + " is too large"};
    if (*n != 0) {
      if (s.range->length % *n != 0 || (element_size != 0 && s.range->length / *n != element_size)) {
        return Error{"saved blocks of " + std::to_string(s.range->length) + " bytes for " + std::to_string(*n) +
                     " elements: another element size"};
      }
      element_size = s.range->length / *n;
    } else if (s.range->length != 0) {
      return Error{"an empty saved block of " + std::to_string(s.range->length) + " bytes"};
    }
    blocks[{c.offset, c.shape}].push_back(&s);
  }
  return blocks;
}

// The reads of the wanted block: each saved block it overlaps, from the (rank % copies)-th shard holding it; the
// number of wanted elements they cover. An error when two saved blocks overlap.
Result<std::uint64_t> block_reads(const Blocks& blocks, const TensorChunk& want, int rank,
                                  std::vector<BlockRead>& reads) {
  std::uint64_t covered = 0;
  std::vector<const TensorChunk*> used;
  for (const auto& [key, copies] : blocks) {
    const TensorChunk& c = *copies.front()->chunk;
    auto box = overlap(c, want);
    if (!box) continue;
    for (const TensorChunk* other : used) {
      if (overlap(*other, c)) {
        return Error{"saved blocks at " + dims(other->offset) + " and " + dims(c.offset) + " overlap"};
      }
    }
    used.push_back(&c);
    const Saved& from = *copies[static_cast<std::size_t>(rank) % copies.size()];
    covered += *volume(box->second);  // a part of the wanted block: no overflow
    reads.push_back({from.shard, *from.range, c, std::move(box->first), std::move(box->second)});
  }
  return covered;
}

// A tensor's piece: the block this rank wants and the saved blocks it is made of.
Result<RelayoutPiece> plan_tensor(const std::string& name, const std::vector<Saved>& saved,
                                  const std::map<std::string, nlohmann::json>& declared, int rank) {
  auto refuse = [&](const std::string& why) { return Error{"tensor '" + name + "': " + why}; };
  RelayoutPiece piece;
  piece.name = name;
  auto want = wanted_block(name, saved, declared);
  if (!want) return Error{want.error()};
  auto blocks = saved_blocks(saved, want->global_shape, piece.element_size);
  if (!blocks) return refuse(blocks.error());
  auto wanted_elements = volume(want->shape);
  if (!wanted_elements) return refuse("the block this rank holds, of shape " + dims(want->shape) + ", is too large");
  auto covered = block_reads(*blocks, *want, rank, piece.reads);
  if (!covered) return refuse(covered.error());
  if (*covered != *wanted_elements) {
    return refuse("the saved blocks hold " + std::to_string(*covered) + " of the " +
                  std::to_string(*wanted_elements) + " elements of the block at " + dims(want->offset) +
                  " of shape " + dims(want->shape) + " that this rank holds");
  }
  if (*wanted_elements != 0 && piece.element_size == 0) return refuse("no saved block holds an element");
  piece.bytes = *wanted_elements * piece.element_size;
  if (piece.element_size != 0 && piece.bytes / piece.element_size != *wanted_elements) {
    return refuse("the block this rank holds is too large");
  }
  piece.meta = saved.front().range->meta;
  piece.meta["shape"] = want->shape;
  piece.meta["offset"] = want->offset;
  piece.want = std::move(want).value();
  return piece;
}

}  // namespace

Result<std::vector<RelayoutPiece>> plan_relayout(const Manifest& m,
                                                 const std::map<std::string, nlohmann::json>& declared, int rank) {
  if (m.world_size < 1 || rank < 0) return Error{"a checkpoint of " + std::to_string(m.world_size) + " ranks"};
  // Every name, in the order of the shard this rank would take blobs from, then of the others.
  const int home = rank % m.world_size;
  std::vector<std::size_t> order(m.shards.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_partition(order.begin(), order.end(), [&](std::size_t i) { return m.shards[i].rank == home; });
  std::vector<std::string> names;
  std::map<std::string, std::vector<Saved>> by_name;
  for (std::size_t i : order) {
    for (const StateRange& range : m.shards[i].states) {
      auto chunk = tensor_chunk(range.meta);
      if (!chunk) return Error{"'" + range.name + "' in " + m.shards[i].file + ": " + chunk.error()};
      std::vector<Saved>& all = by_name[range.name];
      if (all.empty()) names.push_back(range.name);
      if (!all.empty() && all.front().chunk.has_value() != chunk->has_value()) {
        return Error{"'" + range.name + "' is a tensor in one shard and not in another"};
      }
      all.push_back({i, &range, std::move(chunk).value()});
    }
  }
  std::vector<RelayoutPiece> out;
  for (const std::string& name : names) {
    const std::vector<Saved>& saved = by_name[name];
    // Under tensor parallelism a range that does not say where it lies may be any rank's part of a tensor.
    const bool placed = m.layout.tp == 1 || (saved.front().chunk && saved.front().range->meta.contains("global_shape"));
    if (!placed && (saved.front().chunk || declared.count(name) != 0)) {
      return Error{"'" + name + "' was saved by " + std::to_string(m.layout.tp) +
                   " tensor-parallel ranks without its place in the whole tensor (global_shape, offset): it "
                   "restores onto its own layout only"};
    }
    if (saved.front().chunk) {
      auto piece = plan_tensor(name, saved, declared, rank);
      if (!piece) return Error{piece.error()};
      out.push_back(std::move(piece).value());
      continue;
    }
    // No tensor (a blob): the home shard's copy, else the first one.
    const Saved& from = saved.front();
    RelayoutPiece piece;
    piece.name = name;
    piece.meta = from.range->meta;
    piece.bytes = from.range->length;
    piece.reads.push_back({from.shard, *from.range, {}, {}, {}});
    out.push_back(std::move(piece));
  }
  return out;
}

void copy_box(const BlockRead& read, const std::byte* saved, const TensorChunk& want, std::byte* wanted,
              std::uint64_t element_size) {
  const std::size_t rank = read.lo.size();
  if (rank == 0) {
    std::memcpy(wanted, saved, static_cast<std::size_t>(element_size));  // a scalar
    return;
  }
  // Row-major strides (in bytes) of both blocks; the box's last dimension is one contiguous run in each.
  Dims from_stride(rank), to_stride(rank);
  from_stride[rank - 1] = to_stride[rank - 1] = element_size;
  for (std::size_t d = rank - 1; d > 0; --d) {
    from_stride[d - 1] = from_stride[d] * read.saved.shape[d];
    to_stride[d - 1] = to_stride[d] * want.shape[d];
  }
  const std::size_t run = static_cast<std::size_t>(read.extent[rank - 1] * element_size);
  Dims index(rank, 0);  // within the box, over every dimension but the last
  for (;;) {
    std::uint64_t from = 0, to = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      const std::uint64_t at = read.lo[d] + index[d];
      from += (at - read.saved.offset[d]) * from_stride[d];
      to += (at - want.offset[d]) * to_stride[d];
    }
    std::memcpy(wanted + to, saved + from, run);
    std::size_t d = rank - 1;
    while (d > 0 && ++index[d - 1] == read.extent[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

}  // namespace ckpt::store
