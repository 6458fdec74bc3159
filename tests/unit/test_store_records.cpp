#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/store.hpp"

using namespace ckpt::store;

namespace {

ShardRecord sample_record(int rank) {
  ShardRecord r;
  r.rank = rank;
  r.file = shard_file_name(rank);
  r.size = 300;
  r.checksum = 0xfedcba9876543210ULL;
  r.states = {{"model", 0, 100, {{"dtype", "bf16"}, {"shape", {10, 5}}}, 0x0123456789abcdefULL},
              {"optim", 100, 200, nlohmann::json::object(), std::nullopt}};
  r.covers = {"model/pp0/tp0", "optim/pp0/tp0"};
  return r;
}

Manifest sample_manifest() {
  Manifest m;
  m.step = 1200;
  m.kind = Kind::Terminal;
  m.wall_time = 1700000000.25;
  m.world_size = 2;
  m.layout = {2, 1, 1, false};
  m.ranks = {{0, 0, 0, 0}, {1, 1, 0, 0}};
  m.shards = {sample_record(0), sample_record(1)};
  return m;
}

// A manifest's JSON with one edit applied, for the bad-input cases.
std::string manifest_with(const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(to_json(sample_manifest()));
  edit(j);
  return j.dump();
}

}  // namespace

TEST_CASE("store names", "[store][records]") {
  SECTION("good inputs") {
    CHECK(step_dir_name(200) == "000000000200");
    CHECK(step_dir_name(kMaxStep) == "999999999999");
    CHECK(parse_step_dir_name("000000000200") == 200u);
    CHECK(parse_step_dir_name("999999999999") == kMaxStep);
    CHECK(shard_file_name(3) == "rank-00003.shard");
    CHECK(record_file_name(123456) == "rank-123456.rec");
    for (const char* good : {"rank-00001.shard", "a", "...", "x..y", ".hidden"}) {
      INFO(good);
      CHECK(is_safe_name(good));
    }
  }
  SECTION("bad inputs") {
    for (const char* bad : {"", "00000000020", "0000000002000", "00000000020x", "-00000000020", " 00000000020",
                            "latest", "+00000000020"}) {
      INFO(bad);
      CHECK_FALSE(parse_step_dir_name(bad).has_value());
    }
    for (const char* bad : {"", ".", "..", "../x", "/etc/passwd", "a/b", "a/", "/"}) {
      INFO(bad);
      CHECK_FALSE(is_safe_name(bad));
    }
    CHECK_FALSE(is_safe_name(std::string("a\0b", 3)));
    CHECK_FALSE(is_safe_name(std::string(256, 'x')));
  }
}

TEST_CASE("shard records round-trip and reject bad input", "[store][records]") {
  SECTION("good inputs") {
    ShardRecord r = sample_record(7);
    auto back = parse_shard_record(to_json(r));
    REQUIRE(back.ok());
    CHECK(back->rank == 7);
    CHECK(back->file == "rank-00007.shard");
    CHECK(back->size == 300);
    CHECK(back->checksum == 0xfedcba9876543210ULL);
    REQUIRE(back->states.size() == 2);
    CHECK(back->states[0].name == "model");
    CHECK(back->states[0].meta["shape"] == nlohmann::json({10, 5}));
    CHECK(back->states[0].checksum == 0x0123456789abcdefULL);  // a range's own checksum
    CHECK_FALSE(back->states[1].checksum);                       // none: an older record
    CHECK(back->states[1].offset == 100);
    CHECK(back->covers == r.covers);
  }
  SECTION("bad inputs") {
    nlohmann::json good = nlohmann::json::parse(to_json(sample_record(1)));
    std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> edits = {
        {"file", [](auto& j) { j["file"] = "../rank-00001.shard"; }},
        {"file", [](auto& j) { j["file"] = "/etc/passwd"; }},
        {"file", [](auto& j) { j["file"] = ".."; }},
        {"file", [](auto& j) { j["file"] = 5; }},
        {"rank", [](auto& j) { j["rank"] = -1; }},
        {"rank", [](auto& j) { j["rank"] = 4294967296ULL; }},
        {"rank", [](auto& j) { j["rank"] = 1.5; }},
        {"size", [](auto& j) { j.erase("size"); }},
        {"checksum", [](auto& j) { j["checksum"] = "xyz"; }},
        {"checksum", [](auto& j) { j["checksum"] = "FEDCBA9876543210"; }},
        {"checksum", [](auto& j) { j["checksum"] = 12; }},
        {"states[0].checksum", [](auto& j) { j["states"][0]["checksum"] = "0123"; }},
        {"past the shard size", [](auto& j) { j["states"][1]["length"] = 201; }},
        {"past the shard size", [](auto& j) { j["states"][1]["offset"] = 18446744073709551615ULL; }},
        {"duplicate", [](auto& j) { j["states"][1]["name"] = "model"; }},
        {"empty", [](auto& j) { j["states"][0]["name"] = ""; }},
        {"states", [](auto& j) { j["states"] = "none"; }},
        {"covers", [](auto& j) { j["covers"] = {1}; }},
        {"duplicate", [](auto& j) { j["covers"] = {"a", "a"}; }},
    };
    for (auto& [needle, edit] : edits) {
      nlohmann::json j = good;
      edit(j);
      auto parsed = parse_shard_record(j.dump());
      INFO(j.dump());
      REQUIRE_FALSE(parsed.ok());
      CHECK_THAT(parsed.error(), Catch::Contains(needle));
    }
    for (const char* text : {"", "{", "[]", "null", "42", "\"x\"", "{\"rank\":0}", "\xff\xfe"}) {
      INFO(text);
      CHECK_FALSE(parse_shard_record(text).ok());
    }
  }
}

TEST_CASE("manifests round-trip and reject bad input", "[store][records]") {
  SECTION("good inputs") {
    Manifest m = sample_manifest();
    auto back = parse_manifest(to_json(m));
    REQUIRE(back.ok());
    CHECK(back->step == 1200);
    CHECK(back->kind == Kind::Terminal);
    CHECK(back->wall_time == 1700000000.25);
    CHECK(back->world_size == 2);
    CHECK(back->layout.dp == 2);
    CHECK_FALSE(back->layout.zero1);
    REQUIRE(back->ranks.size() == 2);
    CHECK(back->ranks[1].dp == 1);
    REQUIRE(back->shards.size() == 2);
    CHECK(to_json(*back) == to_json(m));
    // Unknown keys are ignored, so that a newer writer's extra fields do not make a checkpoint unusable.
    CHECK(parse_manifest(manifest_with([](auto& j) { j["comment"] = "x"; })).ok());
  }
  SECTION("bad inputs") {
    std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>> edits = {
        {"format", [](auto& j) { j["format"] = 2; }},
        {"kind", [](auto& j) { j["kind"] = "weekly"; }},
        {"step", [](auto& j) { j["step"] = -5; }},
        {"step", [](auto& j) { j["step"] = "200"; }},
        {"wall_time", [](auto& j) { j["wall_time"] = "now"; }},
        {"wall_time", [](auto& j) { j["wall_time"] = -1.0; }},
        {"world_size", [](auto& j) { j["world_size"] = 0; }},
        {"world_size", [](auto& j) { j["world_size"] = 1u << 30; }},
        {"layout", [](auto& j) { j["layout"]["tp"] = 0; }},
        {"layout", [](auto& j) { j["layout"]["zero1"] = 1; }},
        {"layout", [](auto& j) { j["layout"] = {{"dp", 4096}, {"tp", 4096}, {"pp", 1}, {"zero1", false}}; }},
        {"ranks[1].rank", [](auto& j) { j["ranks"][1]["rank"] = 2; }},
        {"ranks[1].dp", [](auto& j) { j["ranks"][1]["dp"] = 2; }},
        {"ranks[1].rank: duplicate", [](auto& j) { j["ranks"][1]["rank"] = 0; }},
        {"shards[1].rank: duplicate", [](auto& j) { j["shards"][1]["rank"] = 0; }},
        {"shards[1].file: duplicate", [](auto& j) { j["shards"][1]["file"] = "rank-00000.shard"; }},
        {"unsafe name '../../etc/passwd'", [](auto& j) { j["shards"][0]["file"] = "../../etc/passwd"; }},
        {"unsafe name '/tmp/x'", [](auto& j) { j["shards"][0]["file"] = "/tmp/x"; }},
        {"shards", [](auto& j) { j["shards"] = nlohmann::json::object(); }},
        {"missing", [](auto& j) { j.erase("layout"); }},
    };
    for (auto& [needle, edit] : edits) {
      std::string text = manifest_with(edit);
      auto parsed = parse_manifest(text);
      INFO(text);
      REQUIRE_FALSE(parsed.ok());
      CHECK_THAT(parsed.error(), Catch::Contains(needle));
      CHECK(parsed.error().rfind("manifest: ", 0) == 0);
    }
    for (const char* text : {"", " ", "garbage", "{\"format\":1", "[1,2]", "1e999", "{\"format\":1e999}",
                             "{\"format\":1,\"step\":1e400}"}) {
      INFO(text);
      CHECK_FALSE(parse_manifest(text).ok());
    }
    std::string deep(100000, '[');
    CHECK_THAT(parse_manifest(deep).error(), Catch::Contains("nested deeper"));
    std::string deep_meta = manifest_with([](auto&) {});
    deep_meta.insert(1, "\"x\":" + std::string(70, '[') + std::string(70, ']') + ",");
    CHECK_THAT(parse_manifest(deep_meta).error(), Catch::Contains("nested deeper"));
    // Brackets inside strings are not nesting.
    CHECK(parse_manifest(manifest_with([](auto& j) { j["note"] = std::string(500, '['); })).ok());
  }
}

TEST_CASE("tensor chunks: a region's block in the whole tensor, and who else holds it", "[store][records]") {
  using nlohmann::json;
  SECTION("a region that says only its shape is the whole tensor; one that says nothing is no tensor") {
    auto whole = tensor_chunk(json::parse(R"({"dtype":"float32","shape":[3,4]})"));
    REQUIRE(whole);
    REQUIRE(*whole);
    CHECK((*whole)->whole());
    CHECK((*whole)->offset == std::vector<std::uint64_t>{0, 0});
    CHECK((*whole)->replica_group.empty());
    auto none = tensor_chunk(json::object());
    REQUIRE(none);
    CHECK_FALSE(*none);
  }
  SECTION("a block of a split tensor") {
    auto c = tensor_chunk(json::parse(R"({"shape":[3,4],"global_shape":[3,8],"offset":[0,4],"replica_group":"rank"})"));
    REQUIRE(c);
    CHECK_FALSE((*c)->whole());
    CHECK((*c)->global_shape == std::vector<std::uint64_t>{3, 8});
    CHECK((*c)->replica_group == "rank");
  }
  SECTION("bad declarations name the field") {
    CHECK_THAT(tensor_chunk(json::parse(R"({"shape":[3,4],"global_shape":[12]})")).error(),
               Catch::Contains("'global_shape' [12] has another number of dimensions"));
    CHECK_THAT(tensor_chunk(json::parse(R"({"shape":[3,4],"global_shape":[3,8],"offset":[0,5]})")).error(),
               Catch::Contains("lies outside 'global_shape' [3,8]"));
    CHECK_THAT(tensor_chunk(json::parse(R"({"shape":[3,4],"offset":[0]})")).error(),
               Catch::Contains("'offset' [0] has another number of dimensions"));
    CHECK_THAT(tensor_chunk(json::parse(R"({"shape":[3,-4]})")).error(), Catch::Contains("other than a count"));
    CHECK_THAT(tensor_chunk(json::parse(R"({"shape":[3],"replica_group":"tp"})")).error(),
               Catch::Contains("'replica_group' \"tp\""));
    CHECK_THAT(tensor_chunk(json::parse(R"({"shape":"3x4"})")).error(), Catch::Contains("'shape'"));
  }
}

TEST_CASE("store enum names", "[store][records]") {
  CHECK(std::string(to_string(State::Complete)) == "complete");
  CHECK(std::string(to_string(State::Incomplete)) == "incomplete");
  CHECK(std::string(to_string(State::Corrupt)) == "corrupt");
  CHECK(std::string(to_string(State::Failed)) == "failed");
  CHECK(std::string(to_string(Kind::Periodic)) == "periodic");
  CHECK(std::string(to_string(Kind::Terminal)) == "terminal");
  CHECK(std::string(to_string(SavePhase::ManifestRenamed)) == "ManifestRenamed");
}
