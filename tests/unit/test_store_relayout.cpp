#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/store.hpp"

using namespace ckpt::store;
using Dims = std::vector<std::uint64_t>;

namespace {

// A float32 tensor whose element i holds i: any misplaced element shows.
std::vector<float> iota(std::uint64_t n) {
  std::vector<float> v(n);
  for (std::uint64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

std::uint64_t count(const Dims& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// The block at `offset` of `shape` of a row-major tensor of `global` shape, cut out element by element.
std::vector<float> cut(const std::vector<float>& whole, const Dims& global, const Dims& offset, const Dims& shape) {
  std::vector<float> out;
  Dims index(shape.size(), 0);
  for (std::uint64_t n = 0; n < count(shape); ++n) {
    std::uint64_t at = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) at = at * global[d] + offset[d] + index[d];
    out.push_back(whole[at]);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

nlohmann::json block_meta(const Dims& global, const Dims& offset, const Dims& shape) {
  return {{"dtype", "float32"}, {"shape", shape}, {"global_shape", global}, {"offset", offset}};
}

// A checkpoint in memory: its manifest and every range's bytes.
struct Saved {
  Manifest manifest;
  std::map<std::pair<std::size_t, std::string>, std::vector<std::byte>> bytes;

  void add(int rank, const std::string& name, const nlohmann::json& meta, const void* data, std::uint64_t size) {
    auto it = std::find_if(manifest.shards.begin(), manifest.shards.end(),
                           [&](const ShardRecord& r) { return r.rank == rank; });
    if (it == manifest.shards.end()) {
      manifest.shards.push_back({rank, shard_file_name(rank), 0, 0, {}, {}});
      it = manifest.shards.end() - 1;
    }
    it->states.push_back({name, it->size, size, meta, 0});
    it->size += size;
    const auto* p = static_cast<const std::byte*>(data);
    bytes[{static_cast<std::size_t>(it - manifest.shards.begin()), name}].assign(p, p + size);
  }
  // tp blocks of a [rows, cols] tensor split along `dim`, each on every data-parallel replica (rank = dp * tp + t).
  void split(const std::string& name, const std::vector<float>& whole, const Dims& global, std::size_t dim, int tp,
             int dp) {
    for (int t = 0; t < tp; ++t) {
      Dims offset(global.size(), 0), shape = global;
      shape[dim] = global[dim] / tp;
      offset[dim] = shape[dim] * t;
      std::vector<float> block = cut(whole, global, offset, shape);
      for (int d = 0; d < dp; ++d) {
        add(d * tp + t, name, block_meta(global, offset, shape), block.data(), block.size() * sizeof(float));
      }
    }
    manifest.world_size = tp * dp;
  }
  // What a rank of this run restores of `name`, assembled as the hooks do.
  std::vector<float> assemble(const RelayoutPiece& piece) const {
    std::vector<float> out(piece.bytes / sizeof(float));
    for (const BlockRead& r : piece.reads) {
      const std::vector<std::byte>& from = bytes.at({r.shard, r.range.name});
      copy_box(r, from.data(), *piece.want, reinterpret_cast<std::byte*>(out.data()), piece.element_size);
    }
    return out;
  }
};

const RelayoutPiece& piece_of(const std::vector<RelayoutPiece>& plan, const std::string& name) {
  auto it = std::find_if(plan.begin(), plan.end(), [&](const RelayoutPiece& p) { return p.name == name; });
  REQUIRE(it != plan.end());
  return *it;
}

}  // namespace

TEST_CASE("plan_relayout: a tensor split one way restores split another way, bit for bit", "[store][relayout]") {
  const Dims global{6, 12};
  const std::vector<float> w = iota(count(global));
  for (std::size_t saved_dim : {0u, 1u}) {
    for (int saved_tp : {1, 2, 3}) {
      Saved s;
      s.split("model/w", w, global, saved_dim, saved_tp, 2);
      for (std::size_t dim : {0u, 1u}) {
        for (int tp : {1, 2, 3, 6}) {
          CAPTURE(saved_dim, saved_tp, dim, tp);
          std::uint64_t reads = 0;
          for (int t = 0; t < tp; ++t) {
            Dims offset{0, 0}, shape = global;
            shape[dim] = global[dim] / tp;
            offset[dim] = shape[dim] * t;
            auto plan = plan_relayout(s.manifest, {{"model/w", block_meta(global, offset, shape)}}, t);
            REQUIRE(plan.ok());
            const RelayoutPiece& p = piece_of(*plan, "model/w");
            CHECK(p.meta["shape"] == nlohmann::json(shape));
            CHECK(p.meta["offset"] == nlohmann::json(offset));
            CHECK(s.assemble(p) == cut(w, global, offset, shape));
            reads += p.reads.size();
          }
          // Joining saved blocks reads each once; a split along the saved one reads none twice.
          if (tp == 1) CHECK(reads == static_cast<std::uint64_t>(saved_tp));
          if (dim == saved_dim && tp == saved_tp) CHECK(reads == static_cast<std::uint64_t>(tp));
        }
      }
    }
  }
}

TEST_CASE("plan_relayout: three dimensions, and replicas shared out by rank", "[store][relayout]") {
  const Dims global{4, 3, 8};
  const std::vector<float> w = iota(count(global));
  Saved s;
  s.split("optim/0/exp_avg", w, global, 2, 4, 2);  // 8 shards: dp 2 x tp 4, split along the last dimension
  const Dims offset{2, 0, 0}, shape{2, 3, 8};       // a tp=2 split along the first
  std::set<std::size_t> shards;
  for (int rank : {0, 1}) {
    auto plan = plan_relayout(s.manifest, {{"optim/0/exp_avg", block_meta(global, offset, shape)}}, rank);
    REQUIRE(plan.ok());
    const RelayoutPiece& p = piece_of(*plan, "optim/0/exp_avg");
    CHECK(s.assemble(p) == cut(w, global, offset, shape));
    REQUIRE(p.reads.size() == 4);
    for (const BlockRead& r : p.reads) shards.insert(r.shard);
  }
  CHECK(shards.size() == 8);  // the two ranks read other replicas: every shard once
}

TEST_CASE("plan_relayout: what a rank does not declare", "[store][relayout]") {
  const Dims global{4, 6};
  const std::vector<float> w = iota(count(global));
  Saved s;
  s.split("model/w", w, global, 1, 2, 1);
  // Optimizer state shaped like its parameter names it; another tensor nobody declares comes whole.
  for (int t = 0; t < 2; ++t) {
    Dims offset{0, 3 * static_cast<std::uint64_t>(t)}, shape{4, 3};
    nlohmann::json meta = block_meta(global, offset, shape);
    meta["split_like"] = "model/w";
    std::vector<float> block = cut(w, global, offset, shape);
    s.add(t, "optim/0/momentum", meta, block.data(), block.size() * sizeof(float));
    s.add(t, "model/v", block_meta(global, offset, shape), block.data(), block.size() * sizeof(float));
    const std::string blob = "extras of rank " + std::to_string(t);
    s.add(t, "extras", nlohmann::json::object(), blob.data(), blob.size());
  }
  const Dims offset{0, 2}, shape{4, 2};  // tp=3: the middle block
  auto plan = plan_relayout(s.manifest, {{"model/w", block_meta(global, offset, shape)}}, 4);
  REQUIRE(plan.ok());
  CHECK(plan->size() == 4);
  CHECK(s.assemble(piece_of(*plan, "optim/0/momentum")) == cut(w, global, offset, shape));
  CHECK(s.assemble(piece_of(*plan, "model/v")) == w);
  const RelayoutPiece& extras = piece_of(*plan, "extras");
  CHECK_FALSE(extras.want);
  REQUIRE(extras.reads.size() == 1);
  CHECK(s.manifest.shards[extras.reads.front().shard].rank == 0);  // rank 4 % 2 writers: rank 0's
  auto odd = plan_relayout(s.manifest, {}, 3);
  REQUIRE(odd.ok());
  CHECK(s.manifest.shards[piece_of(*odd, "extras").reads.front().shard].rank == 1);
}

TEST_CASE("plan_relayout: a block it cannot serve is refused, naming the tensor", "[store][relayout]") {
  const Dims global{4, 6};
  const std::vector<float> w = iota(count(global));
  Saved s;
  s.split("model/w", w, global, 1, 2, 1);
  SECTION("another global shape") {
    auto plan = plan_relayout(s.manifest, {{"model/w", block_meta({4, 8}, {0, 0}, {4, 8})}}, 0);
    CHECK(plan.error() == "tensor 'model/w': saved as a tensor of shape [4,6]; this run's is [4,8]");
  }
  SECTION("a part no saved block holds (its shard is gone)") {
    s.manifest.shards.pop_back();
    auto plan = plan_relayout(s.manifest, {}, 0);
    CHECK(plan.error() == "tensor 'model/w': the saved blocks hold 12 of the 24 elements of the block at [0,0] of "
                          "shape [4,6] that this rank holds");
  }
  SECTION("saved blocks that overlap") {
    s.manifest.shards[1].states[0].meta["offset"] = Dims{0, 2};
    s.manifest.shards[1].states[0].meta["global_shape"] = global;
    auto plan = plan_relayout(s.manifest, {}, 0);
    CHECK(plan.error() == "tensor 'model/w': saved blocks at [0,0] and [0,2] overlap");
  }
  SECTION("another element size") {
    s.manifest.shards[1].states[0].length = 24;
    CHECK_THAT(plan_relayout(s.manifest, {}, 0).error(), Catch::Contains("another element size"));
  }
  SECTION("a block outside its tensor in this run's metadata") {
    auto plan = plan_relayout(s.manifest, {{"model/w", block_meta(global, {0, 4}, {4, 3})}}, 0);
    CHECK_THAT(plan.error(), Catch::StartsWith("tensor 'model/w': this run's metadata: the block of shape [4,3]"));
  }
  SECTION("under tensor parallelism, a tensor or a region that does not say where it lies") {
    s.manifest.layout = Layout{1, 2, 1, false};
    REQUIRE(plan_relayout(s.manifest, {}, 0).ok());
    s.add(0, "blob", nlohmann::json::object(), "x", 1);
    s.add(1, "blob", nlohmann::json::object(), "y", 1);
    REQUIRE(plan_relayout(s.manifest, {}, 0).ok());  // a blob comes from one rank's shard
    CHECK_THAT(plan_relayout(s.manifest, {{"blob", nlohmann::json::object()}}, 0).error(),
               Catch::StartsWith("'blob' was saved by 2 tensor-parallel ranks without its place"));
    s.manifest.shards[0].states[0].meta.erase("global_shape");
    CHECK_THAT(plan_relayout(s.manifest, {}, 0).error(),
               Catch::StartsWith("'model/w' was saved by 2 tensor-parallel ranks without its place"));
  }
  SECTION("a huge shape in a manifest") {
    s.manifest.shards[0].states[0].meta = block_meta({1ull << 40, 1ull << 40}, {0, 0}, {1ull << 40, 1ull << 40});
    s.manifest.shards[1].states[0].meta = s.manifest.shards[0].states[0].meta;
    CHECK_THAT(plan_relayout(s.manifest, {}, 0).error(), Catch::Contains("too large"));
  }
}

TEST_CASE("copy_box: a scalar, and an empty tensor", "[store][relayout]") {
  Saved s;
  const float step = 7;
  s.add(0, "optim/0/step", {{"dtype", "float32"}, {"shape", Dims{}}}, &step, sizeof step);
  s.add(0, "model/empty", block_meta({0, 4}, {0, 0}, {0, 4}), nullptr, 0);
  s.manifest.world_size = 1;
  auto plan = plan_relayout(s.manifest, {}, 1);
  REQUIRE(plan.ok());
  CHECK(s.assemble(piece_of(*plan, "optim/0/step")) == std::vector<float>{7});
  CHECK(piece_of(*plan, "model/empty").bytes == 0);
}
