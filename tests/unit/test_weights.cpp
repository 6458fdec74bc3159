// ckpt export's pure parts: which tensors of which shard, the safetensors headers and split, torch's pickle and
// zip records. The files themselves are read back by independent readers in tests/hooks/export_test.py.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckpt/parse.hpp"
#include "ckpt/weights.hpp"

using namespace ckpt::weights;
namespace store = ckpt::store;
using nlohmann::json;

namespace {

store::StateRange tensor(std::string name, std::uint64_t offset, const char* dtype, std::vector<int> shape,
                         std::uint64_t element) {
  std::uint64_t length = element;
  for (int d : shape) length *= static_cast<std::uint64_t>(d);
  return {std::move(name), offset, length, {{"dtype", dtype}, {"shape", shape}, {"kind", "param"}}, std::nullopt};
}

// A DP=3 checkpoint: every rank holds the whole model (w 2x3 float32, b 3 bf16) and its optimizer state, the
// model regions listed out of file order.
store::Manifest dp3() {
  store::Manifest m;
  m.step = 40;
  m.world_size = 3;
  m.layout = {3, 1, 1, false};
  for (int r = 0; r < 3; ++r) {
    m.ranks.push_back({r, r, 0, 0});
    store::ShardRecord s;
    s.rank = r;
    s.file = store::shard_file_name(r);
    s.size = 4096;
    s.states = {tensor("model/b", 24, "bfloat16", {3}, 2), tensor("model/w", 0, "float32", {2, 3}, 4),
                tensor("optim/0/exp_avg", 64, "float32", {2, 3}, 4),
                {"extra", 200, 10, json::object(), std::nullopt}};
    s.covers = {"model/pp0/tp0", "optim/pp0/tp0"};
    m.shards.push_back(s);
  }
  return m;
}

std::uint64_t le64(const std::string& bytes, std::size_t at) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

}  // namespace

TEST_CASE("model tensors: one replica of a data-parallel checkpoint, in file order", "[export]") {
  store::Manifest m = dp3();
  std::swap(m.shards[0], m.shards[2]);  // the manifest's order is not the ranks'
  auto tensors = model_tensors(m);
  REQUIRE(tensors);
  REQUIRE(tensors->size() == 2);
  CHECK((*tensors)[0].name == "w");
  CHECK((*tensors)[0].offset == 0);
  CHECK((*tensors)[0].length == 24);
  CHECK((*tensors)[0].dtype->safetensors == "F32");
  CHECK((*tensors)[1].name == "b");
  CHECK((*tensors)[1].dtype->storage == "BFloat16Storage");
  CHECK((*tensors)[1].shape == std::vector<std::uint64_t>{3});
  CHECK(m.shards[(*tensors)[0].shard].rank == 0);  // rank 0's shard, wherever it sits in the manifest
  CHECK(shards_read(*tensors) == std::vector<std::size_t>{2});
}

TEST_CASE("model tensors: pipeline stages are joined, tensor-parallel splits and bad regions refused", "[export]") {
  SECTION("two stages, each from its own shard") {
    store::Manifest m = dp3();
    m.layout = {1, 1, 3, false};
    m.ranks = {{0, 0, 0, 0}, {1, 0, 0, 1}, {2, 0, 0, 2}};
    for (int r = 0; r < 3; ++r) {
      m.shards[r].covers = {"model/pp" + std::to_string(r) + "/tp0"};
      m.shards[r].states = {tensor("model/layer" + std::to_string(r) + ".w", 0, "float16", {4}, 2)};
    }
    auto tensors = model_tensors(m);
    REQUIRE(tensors);
    REQUIRE(tensors->size() == 3);
    CHECK((*tensors)[2].name == "layer2.w");
    CHECK(shards_read(*tensors) == std::vector<std::size_t>{0, 1, 2});
  }
  SECTION("two stages naming one tensor alike") {
    store::Manifest m = dp3();
    m.layout = {1, 1, 3, false};
    for (int r = 0; r < 3; ++r) m.shards[r].covers = {"model/pp" + std::to_string(r) + "/tp0"};
    auto tensors = model_tensors(m);
    REQUIRE_FALSE(tensors);
    CHECK_THAT(tensors.error(), Catch::Contains("tensor 'b' is named twice"));
  }
  SECTION("tensor-parallel splits are joined from their blocks; blocks that do not say where they lie are refused") {
    store::Manifest m = dp3();
    m.layout = {1, 3, 1, false};
    auto refused = model_tensors(m);
    REQUIRE_FALSE(refused);
    CHECK_THAT(refused.error(), Catch::Contains("saved by 3 tensor-parallel ranks without its place"));
    // w is 6 x 3, split by rows across the 3 ranks; b (3) is whole on each.
    for (int r = 0; r < 3; ++r) {
      json& w = m.shards[r].states[1].meta;
      w["global_shape"] = {6, 3};
      w["offset"] = {2 * r, 0};
      m.shards[r].states[0].meta["global_shape"] = {3};
    }
    auto tensors = model_tensors(m);
    REQUIRE(tensors);
    REQUIRE(tensors->size() == 2);
    const Tensor& w = (*tensors)[1];
    CHECK(w.name == "w");
    CHECK(w.shape == std::vector<std::uint64_t>{6, 3});
    CHECK(w.length == 72);
    CHECK(w.blocks.size() == 3);
    CHECK((*tensors)[0].blocks.empty());  // b: one replica's range, read as it lies
    CHECK(shards_read(*tensors) == std::vector<std::size_t>{0});
    m.layout.pp = 2;
    CHECK_THAT(model_tensors(m).error(), Catch::Contains("which the export does not join"));
  }
  SECTION("a region whose bytes do not match its shape") {
    store::Manifest m = dp3();
    m.shards[0].states[1].length = 20;
    auto tensors = model_tensors(m);
    REQUIRE_FALSE(tensors);
    CHECK_THAT(tensors.error(), Catch::Contains("region 'model/w' holds 20 bytes, not the 24"));
  }
  SECTION("a dtype neither format carries, a shape that is not one, a region past its shard") {
    store::Manifest m = dp3();
    m.shards[0].states[1].meta["dtype"] = "complex64";
    CHECK_THAT(model_tensors(m).error(), Catch::Contains("dtype \"complex64\""));
    m = dp3();
    m.shards[0].states[1].meta["shape"] = json::array({2, -3});
    CHECK_THAT(model_tensors(m).error(), Catch::Contains("not a count"));
    m = dp3();
    m.shards[0].states[1].meta = json::object();
    CHECK_THAT(model_tensors(m).error(), Catch::Contains("records no dtype and shape"));
    m = dp3();
    m.shards[0].size = 29;
    CHECK_THAT(model_tensors(m).error(), Catch::Contains("past the end of its shard"));
    m = dp3();
    m.shards[0].states[1].meta["shape"] = json::array({1ull << 40, 1ull << 40});
    CHECK_THAT(model_tensors(m).error(), Catch::Contains("overflows"));
  }
  SECTION("no model tensors at all") {
    store::Manifest m = dp3();
    for (auto& s : m.shards) s.states.resize(0);
    CHECK_THAT(model_tensors(m).error(), Catch::Contains("no model tensors"));
  }
}

TEST_CASE("safetensors: the header per the format, files split at the size asked", "[export]") {
  auto tensors = model_tensors(dp3());
  REQUIRE(tensors);
  SECTION("one file") {
    auto files = safetensors_files(*tensors, 1000, {{"step", "40"}});
    REQUIRE(files.size() == 1);
    const SafetensorsFile& f = files[0];
    CHECK(f.name == "model.safetensors");
    const std::uint64_t n = le64(f.header, 0);
    CHECK(n == f.header.size() - 8);
    CHECK(n % 8 == 0);
    json h = json::parse(f.header.substr(8));
    CHECK(h["w"]["dtype"] == "F32");
    CHECK(h["w"]["shape"] == json::array({2, 3}));
    CHECK(h["w"]["data_offsets"] == json::array({0, 24}));
    CHECK(h["b"]["data_offsets"] == json::array({24, 30}));
    CHECK(h["__metadata__"]["step"] == "40");
    CHECK(f.size == f.header.size() + 30);
  }
  SECTION("split: a new file when the next tensor would pass the size; a larger tensor alone") {
    auto files = safetensors_files(*tensors, 24, {});
    REQUIRE(files.size() == 2);
    CHECK(files[0].name == "model-00001-of-00002.safetensors");
    CHECK(files[1].name == "model-00002-of-00002.safetensors");
    CHECK(files[0].tensors == std::vector<std::size_t>{0});
    CHECK(json::parse(files[1].header.substr(8))["b"]["data_offsets"] == json::array({0, 6}));
    CHECK(safetensors_files(*tensors, 1, {}).size() == 2);
    json index = json::parse(safetensors_index(*tensors, files));
    CHECK(index["metadata"]["total_size"] == 30);
    CHECK(index["weight_map"]["b"] == "model-00002-of-00002.safetensors");
  }
}

TEST_CASE("torch: the pickle names only what the weights-only unpickler allows", "[export]") {
  auto tensors = model_tensors(dp3());
  REQUIRE(tensors);
  std::string p = torch_pickle(*tensors);
  CHECK(p.substr(0, 2) == "\x80\x02");
  CHECK(p.back() == '.');
  CHECK(p.find("ccollections\nOrderedDict\n") != std::string::npos);
  CHECK(p.find("ctorch._utils\n_rebuild_tensor_v2\n") != std::string::npos);
  CHECK(p.find("ctorch\nFloatStorage\n") != std::string::npos);
  CHECK(p.find("ctorch\nBFloat16Storage\n") != std::string::npos);
  // Nothing else is named: every GLOBAL is one of these.
  std::size_t globals = 0;
  for (std::size_t at = p.find("\nc"); at != std::string::npos; at = p.find("\nc", at + 1)) ++globals;
  CHECK(globals <= 3 * tensors->size() + 1);
}

TEST_CASE("zip records: data aligned to 64 bytes, zip64 only where sizes need it", "[export]") {
  ZipEntry small{"archive/data/0", 100, 24, 0x12345678};
  std::string h = zip_local_header(small);
  CHECK((small.offset + h.size()) % 64 == 0);
  CHECK(h.substr(0, 4) == "PK\x03\x04");
  CHECK(h.find(std::string("\x01\x00\x10\x00", 4)) == std::string::npos);
  ZipEntry big{"archive/data/1", 200, 5'000'000'000, 1};
  std::string hb = zip_local_header(big);
  CHECK((big.offset + hb.size()) % 64 == 0);
  CHECK(hb.find(std::string("\x01\x00\x10\x00", 4)) != std::string::npos);
  // The header's length does not depend on the CRC: the writer rewrites it in place.
  small.crc32 = 0;
  CHECK(zip_local_header(small).size() == h.size());
  std::string dir = zip_directory({small}, 1000);
  CHECK(dir.substr(0, 4) == "PK\x01\x02");
  CHECK(dir.substr(dir.size() - 22, 4) == "PK\x05\x06");
  std::string dir64 = zip_directory({small, big}, 5'000'001'000);
  CHECK(dir64.find("PK\x06\x06") != std::string::npos);
  CHECK(dir64.find("PK\x06\x07") != std::string::npos);
}

TEST_CASE("parse_bytes", "[parse]") {
  using ckpt::parse_bytes;
  CHECK(*parse_bytes("100") == 100);
  CHECK(*parse_bytes("100B") == 100);
  CHECK(*parse_bytes("5GB") == 5'000'000'000);
  CHECK(*parse_bytes("512MiB") == 512ull << 20);
  CHECK(*parse_bytes("4G") == 4ull << 30);
  CHECK(*parse_bytes("2T") == 2ull << 40);
  CHECK_FALSE(parse_bytes(""));
  CHECK_FALSE(parse_bytes("GB"));
  CHECK_FALSE(parse_bytes("-1"));
  CHECK_FALSE(parse_bytes("1.5GB"));
  CHECK_FALSE(parse_bytes("5 GB"));
  CHECK_FALSE(parse_bytes("5gb"));
  CHECK_FALSE(parse_bytes("99999999999TiB"));
}
