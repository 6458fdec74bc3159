// The restore, on the training thread before the first step. Rank 0 (or the only rank) picks the candidate: a memory
// snapshot its node tier holds that is newer than the dir's choice (node_tier.hpp; a rank that does not hold it
// whole walks every rank back, marking nothing), else the plugin's choice, else the newest checkpoint whose manifest
// lists a complete set of shards; nothing but manifests is read for that. Every rank reads the one shard it restores into host staging, checking its checksum as it reads,
// then copies it into the regions. A candidate any rank cannot load is marked FAILED once, by rank 0, and every
// rank walks back to the same older one (restore_agreement.hpp).
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string_view>
#include <unordered_map>

#include <xxhash.h>

#include "checkpointer_impl.hpp"
#include "ckpt/format.hpp"
#include "log.hpp"

namespace ckpt::hooks {

RestorePlan Checkpointer::Impl::choose(const std::vector<std::uint64_t>& failed, bool& plugin_tried) {
  RestorePlan plan;
  plan.root = config.dir;
  auto passed_over = [&](std::uint64_t step) { return std::find(failed.begin(), failed.end(), step) != failed.end(); };
  if (!plugin_tried) {
    plugin_tried = true;
    std::string root = config.dir;
    std::optional<std::uint64_t> step = config.resume_step;
    if (!config.resume_path.empty()) {
      auto slash = config.resume_path.find_last_of('/');
      auto parsed = store::parse_step_dir_name(config.resume_path.substr(slash + 1));
      if (!parsed) {
        log::warn(rank, "CKPT_RESUME_PATH=" + config.resume_path + " is not a step dir; ignored");
      } else {
        root = slash == 0 ? "/" : config.resume_path.substr(0, slash);
        step = parsed;
      }
    }
    if (step && !passed_over(*step)) {
      auto manifest = store::check_records(root, *step);
      if (manifest) return {step, root, manifest->kind, manifest->world_size, {}};
      log::warn(rank, "the checkpoint the job was given (step " + std::to_string(*step) + ") does not verify: " +
                          manifest.error() + "; looking for another");
    }
  }
  struct stat st {};
  if (::stat(config.dir.c_str(), &st) != 0 && errno == ENOENT) return plan;  // a first run: nothing to look at
  store::ResolveOptions options;
  options.fence = run_fence(config);
  options.checksums = false;  // each rank checks the bytes it loads
  options.skip = failed;
  store::ResumeChoice resolved = store::resolve_resume(config.dir, options);
  for (const std::string& line : resolved.log) log::info(rank, line);
  if (!resolved.step || !resolved.manifest) return plan;
  return {resolved.step, config.dir, resolved.manifest->kind, resolved.manifest->world_size, {}};
}

void Checkpointer::Impl::fetch_own_copy(std::optional<std::uint64_t> step, const std::string& launch) {
  if (!node || !tier || life.started) return;
  if (step ? node->find_snapshot(*step, launch) != nullptr : !node->found_snapshots().empty()) return;
  const auto t0 = Clock::now();
  auto fetched = tier->fetch_own(step, launch);
  if (!fetched) {
    log::warn(rank, "memory tier: " + fetched.error() + "; this rank restores without its partner's copy");
    return;
  }
  std::optional<MemoryTier::Fetched> got = std::move(fetched).value();
  if (!got) return;  // the partner kept none (a first launch, or its node was replaced too)
  partner_kept_copy = true;
  MemoryTier::Fetched& f = *got;
  NodeTier::Snapshot snapshot;
  snapshot.step = f.step;
  snapshot.launch = f.launch;
  snapshot.world_size = f.world_size;
  std::uint64_t bytes = 0;
  for (const store::StateRange& r : f.ranges) {
    snapshot.pieces.push_back({r.name, r.meta, f.buffer.data() + r.offset, static_cast<std::size_t>(r.length),
                               *r.checksum});
    bytes += r.length;
  }
  char took[32];
  std::snprintf(took, sizeof took, "%.3f s", seconds_since(t0));
  const std::string what = "step " + std::to_string(f.step) + " of launch " + printable(f.launch);
  for (const NodeTier::SnapshotPiece& p : snapshot.pieces) request.live.push_back({p.name, p.data, p.size, p.checksum});
  log::info(rank, "memory tier: " +
                      (step ? "this node lacks this rank's " + what + "; fetched it"
                            : "this node holds no snapshot of this rank; fetched " + what) +
                      " (" + std::to_string(bytes) + " bytes, every range checked) from the copy rank " +
                      std::to_string(tier->settings().partner) + "'s node kept, in " + took);
  node->adopt_fetched(std::move(snapshot), std::move(f.buffer));
}

bool Checkpointer::Impl::relaunch_with_copies() const {
  return node && tier && (partner_kept_copy || !node->found_snapshots().empty());
}

RestorePlan Checkpointer::Impl::prefer_node_tier(RestorePlan dir_plan,
                                                const std::vector<std::uint64_t>& node_failed) const {
  if (!node) return dir_plan;
  for (const NodeTier::Snapshot& s : node->found_snapshots()) {  // newest first
    if (dir_plan.step && s.step <= *dir_plan.step) break;
    if (s.world_size != config.world_size ||
        std::find(node_failed.begin(), node_failed.end(), s.step) != node_failed.end()) {
      continue;
    }
    log::info(rank, "node tier: step " + std::to_string(s.step) + " of launch " + s.launch +
                        " is in this node's memory, newer than " +
                        (dir_plan.step ? "step " + std::to_string(*dir_plan.step) : std::string("anything")) +
                        " in " + config.dir + ": every rank tries it first");
    RestorePlan plan;
    plan.step = s.step;
    plan.root = config.dir;
    plan.world_size = s.world_size;
    plan.node_launch = s.launch;
    return plan;
  }
  return dir_plan;
}

Result<const NodeTier::Snapshot*> Checkpointer::Impl::find_node_snapshot(const RestorePlan& plan) const {
  const std::string at = "step " + std::to_string(*plan.step) + " of launch " + plan.node_launch + ": ";
  const NodeTier::Snapshot* found = node ? node->find_snapshot(*plan.step, plan.node_launch) : nullptr;
  if (found == nullptr) return Error{at + "not in this rank's node tier"};
  if (found->world_size != config.world_size) {
    return Error{at + "written by " + std::to_string(found->world_size) + " ranks, not " +
                 std::to_string(config.world_size)};
  }
  for (const RegionSpec& r : regions) {
    auto it = std::find_if(found->pieces.begin(), found->pieces.end(),
                           [&](const NodeTier::SnapshotPiece& p) { return p.name == r.name; });
    if (it == found->pieces.end() || it->size != r.size) {
      return Error{at + "the node tier's snapshot lacks region '" + r.name + "' of " + std::to_string(r.size) +
                   " bytes"};
    }
  }
  return found;
}

Status Checkpointer::Impl::load_from_node_tier(const RestorePlan& plan) {
  auto found = find_node_snapshot(plan);
  if (!found) return Status::failure(found.error());
  if (plan.probe) return Status::success();  // held here; checked in the round after, once every rank holds it
  const std::string at = "step " + std::to_string(*plan.step) + " of launch " + plan.node_launch + ": ";
  restored.regions.clear();
  std::uint64_t bytes = 0;
  for (const NodeTier::SnapshotPiece& p : (*found)->pieces) {
    if (XXH3_64bits(p.data, p.size) != p.checksum) {
      restored.regions.clear();
      return Status::failure(at + "'" + p.name + "' in the node tier no longer matches its checksum");
    }
    bytes += p.size;
    restored.regions.push_back({p.name, p.meta.dump(), p.data, p.size});
  }
  set_restore_bytes(0, bytes);
  log::info(rank, at + std::to_string((*found)->pieces.size()) + " ranges (" + std::to_string(bytes) +
                      " bytes) from this node's memory, checked against their checksums");
  return Status::success();
}

Status Checkpointer::Impl::load_reshard_ranges(const std::string& root, const store::Manifest& m, int source,
                                               bool& definite) {
  std::optional<std::size_t> loaded;
  for (std::size_t i = 0; i < m.shards.size(); ++i) {
    if (m.shards[i].rank == source) loaded = i;
  }
  auto ranges = store::locate_ranges(m, request.reshard_prefixes, loaded);
  if (!ranges) {
    definite = true;
    return Status::failure("step " + std::to_string(m.step) + ": " + ranges.error());
  }
  std::uint64_t bytes = 0;
  for (const auto& [shard, range] : *ranges) {
    const auto size = static_cast<std::size_t>(range.length);
    std::byte* into = restored.hold(size);
    store::ShardRead read = store::read_range(root, m.step, m.shards[shard], range, into);
    if (!read.status) {
      definite = read.definite;
      return Status::failure(read.status.error());
    }
    bytes += read.bytes;
    restored.regions.push_back({range.name, range.meta.dump(), into, size});
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.restore_read_bytes += bytes;
  }
  log::info(rank, "step " + std::to_string(m.step) + ": ZeRO-1 state of " + std::to_string(m.world_size) +
                      " ranks resharded onto " + std::to_string(config.world_size) + ": read " +
                      std::to_string(ranges->size()) + " ranges (" + std::to_string(bytes) +
                      " bytes) of the other shards");
  return Status::success();
}

Status Checkpointer::Impl::read_range_to_host(const RestorePlan& plan, const store::ShardRecord& record,
                                              const store::StateRange& range, std::uint64_t& bytes, bool& definite) {
  if (range.offset > record.size || range.length > record.size - range.offset) {
    definite = true;
    return Status::failure("step " + std::to_string(*plan.step) + ": region '" + range.name +
                           "' lies outside its shard");
  }
  store::ShardRead read = store::read_range(plan.root, *plan.step, record, range, staging.host.data() + range.offset);
  if (!read.status) {
    definite = read.definite;
    return read.status;
  }
  bytes += read.bytes;
  return Status::success();
}

std::optional<Status> Checkpointer::Impl::load_replica_ranges(const RestorePlan& plan,
                                                              const store::ShardRecord& record, bool& definite) {
  const std::uint64_t step = *plan.step;
  std::vector<std::size_t> wanted = store::replica_ranges(record, request.reshard_prefixes);
  for (std::size_t i : wanted) {
    if (!record.states[i].checksum) return std::nullopt;  // an older checkpoint: only the whole shard vouches
  }
  restored.regions.clear();
  std::uint64_t bytes = 0;
  for (std::size_t i : wanted) {
    const store::StateRange& range = record.states[i];
    if (Status s = read_range_to_host(plan, record, range, bytes, definite); !s) return s;
    restored.regions.push_back({range.name, range.meta.dump(), staging.host.data() + range.offset,
                        static_cast<std::size_t>(range.length)});
  }
  set_restore_bytes(bytes, 0);
  log::info(rank, "step " + std::to_string(step) + ": read " + std::to_string(wanted.size()) + " of the " +
                      std::to_string(record.states.size()) + " ranges (" + std::to_string(bytes) + " bytes) of " +
                      record.file + ": its writer's partition of the optimizer state is another rank's now");
  return Status::success();
}

Status Checkpointer::Impl::load_relayout(const std::string& root, const store::Manifest& m, bool& definite) {
  const std::string at = "step " + std::to_string(m.step) + ": ";
  std::map<std::string, nlohmann::json> declared;
  for (std::size_t i = 0; i < regions.size() && i < region_meta.size(); ++i) {
    declared.emplace(regions[i].name, region_meta[i]);
  }
  // The manifest lists a complete set of shards: a tensor it cannot serve is this run's layout, not its fault.
  auto pieces = store::plan_relayout(m, declared, rank);
  if (!pieces) return Status::failure(at + pieces.error());
  restored.regions.clear();
  std::vector<std::byte> scratch;  // one saved range, read whole to check it, when only a box of it is wanted
  std::uint64_t bytes = 0, joined = 0;
  for (const store::RelayoutPiece& piece : *pieces) {
    const auto size = static_cast<std::size_t>(piece.bytes);
    std::byte* into = restored.hold(size);
    store::ShardRead read = store::read_block(root, m, piece.reads, piece.want, piece.element_size, into, scratch);
    bytes += read.bytes;
    if (!read.status) {
      definite = read.definite;
      return Status::failure(read.status.error());
    }
    joined += piece.want && piece.reads.size() > 1 ? 1 : 0;
    restored.regions.push_back({piece.name, piece.meta.dump(), into, size});
  }
  set_restore_bytes(bytes, 0);
  log::info(rank, at + "written by " + std::to_string(m.world_size) + " ranks (tp " + std::to_string(m.layout.tp) +
                      "), restored onto tp " + std::to_string(config.layout.tp) + " of " +
                      std::to_string(config.world_size) + ": " + std::to_string(pieces->size()) + " ranges, " +
                      std::to_string(joined) + " of them joined from several saved blocks; read " +
                      std::to_string(bytes) + " bytes");
  return Status::success();
}

Status Checkpointer::Impl::load_other_split(const RestorePlan& plan, const Status& why, bool& definite) {
  log::info(rank, why.error() + ": this rank's blocks are assembled from the saved ones");
  auto m = store::read_manifest(plan.root, *plan.step);
  if (!m) return Status::failure(m.error());
  return load_relayout(plan.root, *m, definite);
}

Status Checkpointer::Impl::list_restored(std::uint64_t step, const store::ShardRecord& record,
                                         const std::vector<std::optional<std::size_t>>& from_live) {
  restored.regions.clear();
  for (std::size_t i = 0; i < record.states.size(); ++i) {
    const store::StateRange& s = record.states[i];
    if (s.offset > record.size || s.length > record.size - s.offset) {
      return Status::failure("step " + std::to_string(step) + ": region '" + s.name + "' lies outside its shard");
    }
    const std::byte* data = staging.host.data() + s.offset;
    if (i < from_live.size() && from_live[i]) data = static_cast<const std::byte*>(request.live[*from_live[i]].data);
    restored.regions.push_back({s.name, s.meta.dump(), data, static_cast<std::size_t>(s.length)});
  }
  return Status::success();
}

Status Checkpointer::Impl::check_chunks(std::uint64_t step, const store::ShardRecord& record) const {
  std::unordered_map<std::string_view, std::size_t> registered;
  for (std::size_t i = 0; i < regions.size() && i < region_meta.size(); ++i) registered.emplace(regions[i].name, i);
  for (const store::StateRange& s : record.states) {
    auto it = registered.find(s.name);
    if (it == registered.end()) continue;
    const nlohmann::json& mine = region_meta[it->second];
    const bool both_declare = mine.is_object() && s.meta.is_object() && mine.contains("global_shape") &&
                              s.meta.contains("global_shape");
    if (!both_declare) continue;
    auto want = store::tensor_chunk(mine);
    auto have = store::tensor_chunk(s.meta);
    if (!want || !have || !*want || !*have) continue;  // a bad record is the checksums' and parsers' to refuse
    if ((*want)->global_shape != (*have)->global_shape || (*want)->offset != (*have)->offset) {
      auto block = [](const store::TensorChunk& c) {
        return "the block at " + nlohmann::json(c.offset).dump() + " of shape " + nlohmann::json(c.shape).dump() +
               " of a tensor of shape " + nlohmann::json(c.global_shape).dump();
      };
      return Status::failure("step " + std::to_string(step) + ": tensor '" + s.name + "' was saved as " +
                             block(**have) + "; this rank holds " + block(**want));
    }
  }
  return Status::success();
}

void Checkpointer::Impl::set_restore_bytes(std::uint64_t read, std::uint64_t live_bytes) {
  std::lock_guard<std::mutex> lock(mu);
  stats.restore_read_bytes = read;
  stats.restore_live_bytes = live_bytes;
}

std::optional<Status> Checkpointer::Impl::load_with_live(const RestorePlan& plan, const store::ShardRecord& record,
                                                         bool& definite) {
  const std::uint64_t step = *plan.step;
  std::vector<std::optional<std::size_t>> from_live = store::match_live_ranges(record, request.live);
  std::uint64_t live_bytes = 0, read_bytes = 0;
  std::size_t matched = 0;
  for (std::size_t i = 0; i < record.states.size(); ++i) {
    if (from_live[i]) {
      ++matched;
      live_bytes += record.states[i].length;
    } else if (!record.states[i].checksum) {
      return std::nullopt;  // an older checkpoint: only the whole shard's checksum vouches for its ranges
    }
  }
  if (matched == 0) return std::nullopt;  // nothing held here (a spare, another step): one sequential read
  // Staging only where a range must be read: a restore from memory leaves it to the worker's growth after the
  // program registers its regions, off the restore's path.
  if (matched < record.states.size()) {
    if (Status s = grow_staging_for(record); !s) return s;
  }
  for (std::size_t i = 0; i < record.states.size(); ++i) {
    const store::StateRange& range = record.states[i];
    if (from_live[i] || range.length == 0) continue;
    if (Status s = read_range_to_host(plan, record, range, read_bytes, definite); !s) return s;
  }
  if (Status s = list_restored(step, record, from_live); !s) {
    definite = true;
    return s;
  }
  if (Status s = check_chunks(step, record); !s) return load_other_split(plan, s, definite);
  set_restore_bytes(read_bytes, live_bytes);
  log::info(rank, "step " + std::to_string(step) + ": " + std::to_string(matched) + " of " +
                      std::to_string(record.states.size()) + " ranges (" + std::to_string(live_bytes) +
                      " bytes) were in this rank's memory, checked against their checksums; read " +
                      std::to_string(read_bytes) + " bytes of " + record.file);
  return Status::success();
}

Status Checkpointer::Impl::choose_shard(const RestorePlan& plan, ShardChoice& choice, bool& definite) {
  const std::uint64_t step = *plan.step;
  if (plan.kind == store::Kind::Periodic && plan.world_size == config.world_size) {
    // Its own shard: the record names it, so the manifest's record of every other rank is not read.
    auto own = store::read_record(plan.root, step, rank, &definite);
    if (!own) return Status::failure(own.error());
    choice.record = std::move(own).value();
    return Status::success();
  }
  auto m = store::read_manifest(plan.root, step);
  if (!m) return Status::failure(m.error());
  store::RestoreSource source = store::restore_source(*m, config.world_size, rank, config.layout, config.coord);
  if (source.rank < 0 && !source.relayout) {
    definite = source.definite;
    return Status::failure("step " + std::to_string(step) + ": " + source.error);
  }
  if (source.replica && rank == 0) {
    log::warn(rank, "step " + std::to_string(step) + " was written by " + std::to_string(m->world_size) +
                        " data-parallel ranks; this run has " + std::to_string(config.world_size) +
                        ": rank r loads the replica of rank r % " + std::to_string(m->world_size));
  }
  if (m->kind == store::Kind::Terminal && source.rank >= 0 && source.rank != rank && !source.replica) {
    log::info(rank, "terminal checkpoint of step " + std::to_string(step) + ": loading the shard of rank " +
                        std::to_string(source.rank) + " (it covers " +
                        store::state_keys_of_rank(config.layout, config.coord).front() + ")");
  }
  for (const store::ShardRecord& r : m->shards) {
    if (r.rank == source.rank) choice.record = r;
  }
  choice.relayout = source.relayout;
  choice.reshard = source.reshard;
  if (choice.relayout || choice.reshard) choice.manifest = std::move(m).value();
  return Status::success();
}

Status Checkpointer::Impl::grow_staging_for(const store::ShardRecord& record) {
  // At least what the regions ask too: the growth after the restore must not release the buffer its views are in.
  std::size_t asked = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    asked = staging.asked.first;
  }
  if (Status s = grow_host(std::max(static_cast<std::size_t>(record.size), asked)); !s) return s;
  (void)ask_staging(staging.host.size(), 0);
  return Status::success();
}

Result<std::uint64_t> Checkpointer::Impl::load_whole_shard(const RestorePlan& plan, const store::ShardRecord& record,
                                                           bool& definite) {
  const std::uint64_t step = *plan.step;
  store::ShardRead read = store::read_shard(plan.root, step, record, staging.host.data());
  if (!read.status) {
    definite = read.definite;
    return Error{read.status.error()};
  }
  if (read.retries > 0) {
    log::info(rank, "step " + std::to_string(step) + ": " + record.file + " read after " +
                        std::to_string(read.retries) + " transient errors");
  }
  if (Status s = list_restored(step, record, {}); !s) {
    definite = true;
    return Error{s.error()};
  }
  return read.bytes;
}

Status Checkpointer::Impl::load(const RestorePlan& plan, bool& definite) {
  definite = false;
  restored.resharded = false;
  restored.ranges.clear();
  if (!plan.node_launch.empty()) {
    definite = true;  // not this rank's access to anything: the snapshot is not here, so every rank walks back
    return load_from_node_tier(plan);
  }
  ShardChoice choice;
  if (Status s = choose_shard(plan, choice, definite); !s) return s;
  if (choice.relayout) return load_relayout(plan.root, *choice.manifest, definite);
  const store::ShardRecord& record = choice.record;
  if (!choice.reshard && !request.live.empty()) {
    if (std::optional<Status> s = load_with_live(plan, record, definite)) return *s;
  }
  if (Status s = grow_staging_for(record); !s) return s;
  if (choice.reshard) {
    if (std::optional<Status> s = load_replica_ranges(plan, record, definite)) {
      if (!*s) return *s;
      restored.resharded = true;
      return load_reshard_ranges(plan.root, *choice.manifest, record.rank, definite);
    }
  }
  auto bytes = load_whole_shard(plan, record, definite);
  if (!bytes) return Status::failure(bytes.error());
  if (Status s = check_chunks(*plan.step, record); !s) return load_other_split(plan, s, definite);
  set_restore_bytes(*bytes, 0);
  if (choice.reshard) {
    restored.resharded = true;
    // The loaded shard holds the model and its writer's old partition; the ranges of this rank's new partition
    // that other shards hold follow.
    return load_reshard_ranges(plan.root, *choice.manifest, record.rank, definite);
  }
  return Status::success();
}

Result<std::optional<std::uint64_t>> Checkpointer::Impl::agree_and_load(RestoreAgreement* agreement, RestorePlan& plan) {
  const bool leader = agreement == nullptr || rank == 0;
  std::vector<std::uint64_t> failed, node_failed;
  bool plugin_tried = false;
  std::optional<RestorePlan> held_everywhere;  // leader: a memory snapshot every rank's probe found
  for (int round = 0;; ++round) {
    if (leader) {
      if (held_everywhere) {
        plan = std::move(*held_everywhere);  // the probe of the round before: now each rank checks and loads it
        held_everywhere.reset();
      } else {
        const bool plugin_was_tried = plugin_tried;
        plan = prefer_node_tier(choose(failed, plugin_tried), node_failed);
        if (!plan.node_launch.empty()) {
          plugin_tried = plugin_was_tried;  // the dir's choice comes next, unchanged
          plan.probe = agreement != nullptr;  // alone, the load itself finds out
        }
      }
      // Before any rank learns the step: the others write nothing until then (each round, as the step may walk back).
      if (rank == 0) discard_incomplete_above(plan.step.value_or(0));
      if (agreement) {
        if (Status s = agreement->propose(round, plan); !s) return Error{s.error()};
      }
    } else {
      auto proposed = agreement->proposal(round);
      if (!proposed) return Error{proposed.error()};
      plan = std::move(proposed).value();
    }
    if (!plan.step) return std::optional<std::uint64_t>{};
    if (plan.probe) {
      fetch_own_copy(plan.step, plan.node_launch);  // the partner's node may hold what this one lacks
    } else if (plan.node_launch.empty() && relaunch_with_copies()) {
      // The dir's step (a terminal checkpoint the last words wrote from partner copies, say) may be older than the
      // copy fetched before: the partner may keep this one too. One dial to one peer, only in a relaunch.
      fetch_own_copy(plan.step);
    }
    bool definite = false;
    Status status = load(plan, definite);
    RoundOutcome outcome = solo_outcome(status, definite, rank);
    if (agreement) {
      auto agreed = agreement->agree(round, status, definite);
      if (!agreed) return Error{agreed.error()};
      outcome = std::move(agreed).value();
    }
    if (outcome.verdict == RestoreVerdict::Ok && plan.probe) {
      if (leader) {
        log::info(rank, "node tier: every rank holds step " + std::to_string(*plan.step) + " of launch " +
                            plan.node_launch + "; each checks its own now");
        held_everywhere = plan;
        held_everywhere->probe = false;
      }
      continue;
    }
    if (outcome.verdict == RestoreVerdict::Ok) return plan.step;
    restored.regions.clear();
    if (outcome.verdict == RestoreVerdict::Stop) {
      if (!status) return Error{status.error()};
      return Error{"ckpt: step " + std::to_string(*plan.step) + ": restore stopped: " + outcome.reason};
    }
    if (!status) log::warn(rank, status.error() + "; every rank walks back");
    if (!plan.node_launch.empty()) {
      // Nothing in the dir was at fault: nothing is marked.
      if (leader) log::info(rank, outcome.reason + "; every rank walks back to the checkpoint dir");
      node_failed.push_back(*plan.step);
      continue;
    }
    if (leader) {
      Status marked = store::mark_failed(plan.root, *plan.step, outcome.reason, run_fence(config));
      log::warn(rank, outcome.reason + (marked ? "; marked FAILED" : "; not marked FAILED: " + marked.error()) +
                          ", every rank walks back");
    }
    failed.push_back(*plan.step);
  }
}

Status Checkpointer::Impl::copy_into_registered(std::uint64_t step) {
  const std::string at = "ckpt: step " + std::to_string(step);
  if (restored.resharded) {
    return Status::failure(at + " holds ZeRO-1 state of another number of ranks; the registered regions hold "
                           "this run's partition, so they are not filled from it (restore with the new "
                           "partition's prefixes and copy_into_regions off)");
  }
  for (const RegionSpec& r : regions) {
    auto it = std::find_if(restored.regions.begin(), restored.regions.end(),
                           [&](const RestoredRegion& x) { return x.name == r.name; });
    if (it == restored.regions.end()) return Status::failure(at + " has no region '" + r.name + "'");
    if (it->size != r.size) {
      return Status::failure("ckpt: region '" + r.name + "' is " + std::to_string(r.size) + " bytes; step " +
                             std::to_string(step) + " has " + std::to_string(it->size));
    }
    if (r.size == 0) continue;
    if (r.memory == Memory::Host) {
      if (r.data != it->data) std::memcpy(r.data, it->data, r.size);  // live memory may be the region itself
    } else if (Status s = device->upload(r.data, it->data, r.size); !s) {
      return s;
    }
  }
  return Status::success();
}

Result<std::uint64_t> Checkpointer::Impl::restore(bool copy_into_regions) {
  if (life.started) return Error{"ckpt: restore() must come before the first after_step()"};
  queue.wait_idle();
  const auto t0 = Clock::now();
  fetch_own_copy();  // where this node holds nothing of this rank: its partner's node may
  std::unique_ptr<RestoreAgreement> agreement;
  if (config.world_size > 1) {
    auto tally = coord->restore_tally();
    if (!tally) return Error{tally.error()};
    agreement = std::make_unique<RestoreAgreement>(config.dir, config.run_id, rank, config.world_size,
                                                   std::chrono::seconds(config.commit_timeout_s), std::move(*tally));
  }
  RestorePlan plan;
  auto loaded = agree_and_load(agreement.get(), plan);
  if (!loaded) return Error{loaded.error()};
  const std::uint64_t step = loaded->value_or(0);
  if (copy_into_regions && *loaded) {
    if (Status s = copy_into_registered(step); !s) return Error{s.error()};
  }
  const double took = seconds_since(t0);
  {
    std::lock_guard<std::mutex> lock(mu);
    stats.restore_s = took;
  }
  if (*loaded) {
    Stats s = stats_copy();
    char in[32];
    std::snprintf(in, sizeof in, " in %.3f s (", took);
    log::info(rank, "restored step " + std::to_string(step) + " from " +
                        (plan.node_launch.empty() ? plan.root : "the node tier") + in +
                        std::to_string(s.restore_read_bytes) + " bytes read, " +
                        std::to_string(s.restore_live_bytes) + " found in memory)");
  }
  start(step);
  if (copy_into_regions) release_growth();  // else once the program has loaded what restored() points at
  return step;
}

}  // namespace ckpt::hooks
