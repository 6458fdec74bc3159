// ckpt ls / verify / latest / gc: the checkpoint store from the command line. Read-only except gc.
#include <algorithm>
#include <cstdio>
#include <iterator>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/clock.hpp"
#include "ckpt/format.hpp"
#include "ckpt/parse.hpp"
#include "ckpt/store.hpp"
#include "commands.hpp"

namespace {

namespace store = ckpt::store;
using nlohmann::json;

// Exit codes: see commands.hpp.
constexpr int kExitNo = 1;
constexpr int kExitError = 2;

void error_line(const std::string& message) { std::fprintf(stderr, "ckpt: %s\n", message.c_str()); }

void note_line(const std::string& message) { std::fprintf(stderr, "ckpt: note: %s\n", message.c_str()); }

// "45s", "12m5s", "3h20m", "2d4h": precise when young, coarse when old.
std::string format_age(double seconds) {
  if (!(seconds > 0)) return "0s";
  auto s = static_cast<std::uint64_t>(seconds);
  if (s >= 86400) s -= s % 3600;
  else if (s >= 3600) s -= s % 60;
  return ckpt::format_duration(s);
}

// The time a checkpoint was taken: its manifest's wall time, else the newest mtime in its dir.
double taken_at(const store::Entry& e) { return e.manifest ? e.manifest->wall_time : e.mtime; }

std::string step_path(const std::string& root, std::uint64_t step) {
  return (root.empty() || root.back() == '/' ? root : root + "/") + store::step_dir_name(step);
}

// A strict step or count from the command line; prints the error and returns nullopt when bad.
std::optional<std::uint64_t> parse_number(const std::string& option, const std::string& text) {
  auto value = ckpt::parse_uint(text);
  if (!value) {
    error_line(option + " '" + text + "': " + value.error());
    return std::nullopt;
  }
  return *value;
}

// Scans DIR; prints the error and returns nullopt when the dir cannot be read at all.
std::optional<std::vector<store::Entry>> scan_or_report(const std::string& dir) {
  auto entries = store::scan(dir);
  if (!entries) {
    error_line(entries.error());
    return std::nullopt;
  }
  return std::move(entries).value();
}

struct LsArgs {
  std::string dir;
  bool json = false;
  bool checksums = false;
};

int run_ls(const LsArgs& args) {
  auto entries = scan_or_report(args.dir);
  if (!entries) return kExitError;
  if (args.checksums) {
    for (store::Entry& e : *entries) {
      if (e.state != store::State::Complete) continue;
      if (ckpt::Status s = store::verify(args.dir, e.step, true); !s) {
        e.state = store::State::Corrupt;
        e.detail = s.error();
      }
    }
  }
  const double now = ckpt::unix_seconds();
  if (args.json) {
    json out = json::array();
    for (const store::Entry& e : *entries) {
      json item = {{"step", e.step},
                   {"path", step_path(args.dir, e.step)},
                   {"state", store::to_string(e.state)},
                   {"bytes", e.bytes},
                   {"age_s", std::max(0.0, now - taken_at(e))},
                   {"detail", e.detail}};
      item["kind"] = e.manifest ? json(store::to_string(e.manifest->kind)) : json(nullptr);
      item["ranks"] = e.manifest ? json(e.manifest->world_size) : json(nullptr);
      item["shards"] = e.manifest ? json(e.manifest->shards.size()) : json(nullptr);
      item["wall_time"] = e.manifest ? json(e.manifest->wall_time) : json(nullptr);
      out.push_back(std::move(item));
    }
    std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return 0;
  }
  if (entries->empty()) {
    std::printf("no checkpoints in %s\n", args.dir.c_str());
    return 0;
  }
  std::printf("%-12s  %-8s  %-10s  %5s  %10s  %8s  %s\n", "STEP", "KIND", "STATE", "RANKS", "BYTES", "AGE",
              "DETAIL");
  for (const store::Entry& e : *entries) {
    std::string kind = e.manifest ? store::to_string(e.manifest->kind) : "-";
    std::string ranks = e.manifest ? std::to_string(e.manifest->world_size) : "-";
    std::printf("%-12llu  %-8s  %-10s  %5s  %10s  %8s  %s\n", static_cast<unsigned long long>(e.step), kind.c_str(),
                store::to_string(e.state), ranks.c_str(), ckpt::format_bytes(e.bytes).c_str(),
                format_age(now - taken_at(e)).c_str(), e.detail.c_str());
  }
  return 0;
}

struct VerifyArgs {
  std::string dir;
  std::string step;
  bool sizes_only = false;
};

int report_verified(const std::string& dir, std::uint64_t step, bool checksums) {
  auto manifest = store::read_manifest(dir, step);
  std::uint64_t bytes = 0;
  std::size_t shards = 0;
  if (manifest) {
    shards = manifest->shards.size();
    for (const store::ShardRecord& r : manifest->shards) bytes += r.size;
  }
  std::printf("step %llu: ok (%zu shards, %s, %s)\n", static_cast<unsigned long long>(step), shards,
              ckpt::format_bytes(bytes).c_str(), checksums ? "checksums match" : "sizes match");
  return 0;
}

int run_verify(const VerifyArgs& args) {
  auto entries = scan_or_report(args.dir);
  if (!entries) return kExitError;
  const bool checksums = !args.sizes_only;
  if (!args.step.empty()) {
    auto step = parse_number("--step", args.step);
    if (!step) return kExitError;
    if (ckpt::Status s = store::verify(args.dir, *step, checksums); !s) {
      error_line(s.error());
      return kExitNo;
    }
    return report_verified(args.dir, *step, checksums);
  }
  if (entries->empty()) {
    error_line("no checkpoints in " + args.dir);
    return kExitNo;
  }
  // The one a restart would use; when there is none, the newest, so that its fault is named.
  store::ResumeChoice choice = store::resolve_resume(args.dir, /*mark=*/false);
  if (!choice.step) {
    std::uint64_t newest = entries->back().step;
    ckpt::Status s = store::verify(args.dir, newest, checksums);
    error_line(s ? "step " + std::to_string(newest) + " verifies, but no checkpoint is usable" : s.error());
    return kExitNo;
  }
  for (std::size_t i = 0; i + 1 < choice.log.size(); ++i) note_line(choice.log[i]);
  return report_verified(args.dir, *choice.step, true);
}

struct LatestArgs {
  std::string dir;
  bool json = false;
};

int run_latest(const LatestArgs& args) {
  if (!scan_or_report(args.dir)) return kExitError;
  store::ResumeChoice choice = store::resolve_resume(args.dir, /*mark=*/false);
  if (args.json) {
    json out = {{"step", nullptr}, {"path", nullptr}, {"log", choice.log}};
    if (choice.step) {
      out["step"] = *choice.step;
      out["path"] = choice.path;
      if (auto m = store::read_manifest(args.dir, *choice.step)) {
        out["kind"] = store::to_string(m->kind);
        out["wall_time"] = m->wall_time;
        out["ranks"] = m->world_size;
      }
    }
    std::printf("%s\n", out.dump(2, ' ', false, json::error_handler_t::replace).c_str());
    return choice.step ? 0 : kExitNo;
  }
  if (!choice.step) {
    error_line("no usable checkpoint in " + args.dir);
    return kExitNo;
  }
  for (std::size_t i = 0; i + 1 < choice.log.size(); ++i) note_line(choice.log[i]);
  std::printf("%s\n", choice.path.c_str());
  return 0;
}

struct GcArgs {
  std::string dir;
  std::string keep;
  bool dry_run = false;
};

int run_gc(const GcArgs& args) {
  auto keep = parse_number("--keep", args.keep);
  if (!keep) return kExitError;
  if (*keep < 1) {
    error_line("--keep must be at least 1");
    return kExitError;
  }
  if (!scan_or_report(args.dir)) return kExitError;
  auto doomed = store::gc(args.dir, *keep, args.dry_run);
  if (!doomed) {
    error_line("gc: " + doomed.error());
    return kExitNo;
  }
  if (doomed->empty()) std::printf("nothing to delete\n");
  for (std::uint64_t step : *doomed) {
    std::printf("%s %s\n", args.dry_run ? "would delete" : "deleted", step_path(args.dir, step).c_str());
  }
  return 0;
}

}  // namespace

void add_store_commands(CLI::App& app, int& exit_code) {
  auto ls = std::make_shared<LsArgs>();
  CLI::App* ls_cmd = app.add_subcommand("ls", "List every checkpoint: step, kind, state, ranks, bytes, age");
  ls_cmd->add_option("dir", ls->dir, "Checkpoint dir (CKPT_DIR)")->required();
  ls_cmd->add_flag("--json", ls->json, "Print JSON");
  ls_cmd->add_flag("--checksums", ls->checksums, "Also read every complete checkpoint and check its checksums");
  ls_cmd->callback([ls, &exit_code] { exit_code = run_ls(*ls); });

  auto verify = std::make_shared<VerifyArgs>();
  CLI::App* verify_cmd =
      app.add_subcommand("verify", "Exit 0 only if the checkpoint is complete and every checksum matches");
  verify_cmd->add_option("dir", verify->dir, "Checkpoint dir (CKPT_DIR)")->required();
  verify_cmd->add_option("--step", verify->step, "Step to verify (default: the one a restart would use)")->type_name("N");
  verify_cmd->add_flag("--sizes-only", verify->sizes_only, "Check sizes, not checksums");
  verify_cmd->callback([verify, &exit_code] { exit_code = run_verify(*verify); });

  auto latest = std::make_shared<LatestArgs>();
  CLI::App* latest_cmd = app.add_subcommand("latest", "Print the checkpoint a restart would use; exit 1 if none");
  latest_cmd->add_option("dir", latest->dir, "Checkpoint dir (CKPT_DIR)")->required();
  latest_cmd->add_flag("--json", latest->json, "Print JSON");
  latest_cmd->callback([latest, &exit_code] { exit_code = run_latest(*latest); });

  auto gc = std::make_shared<GcArgs>();
  CLI::App* gc_cmd = app.add_subcommand("gc", "Delete old and leftover checkpoints, keeping the newest N complete");
  gc_cmd->add_option("dir", gc->dir, "Checkpoint dir (CKPT_DIR)")->required();
  gc_cmd->add_option("--keep", gc->keep, "Complete checkpoints to keep (at least 1)")->required()->type_name("N");
  gc_cmd->add_flag("--dry-run", gc->dry_run, "Print what would be deleted; delete nothing");
  gc_cmd->callback([gc, &exit_code] { exit_code = run_gc(*gc); });
}
