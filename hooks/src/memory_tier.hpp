#pragma once
// The memory tier (CKPT_MEMORY): every memory checkpoint stays in this rank's staging, and a copy of it goes to a
// partner rank on another node (ckpt/memtier.hpp pairs them). When a node dies, the survivors' last words can then
// write the checkpoint of the last memory step whole: each survivor from its staging or live state, and each dead
// rank's shard from the copy its partner holds (a stand-in, ckpt/last_words.hpp). With ZeRO-1, whose optimizer
// shards exist nowhere else, that is what turns "everything since the last periodic checkpoint" into one step.
//
// A copy travels over a partner link (heartbeat::Mesh::dial_partner: authenticated with the job's secret like the
// network's links) as a header, which the holder answers (go on, a refusal with its reason, or that the copy does
// not fit its budget, with the bytes it would need: partner_needs()), then each piece in chunks of at most 4 MiB,
// each chunk with its XXH3-64,
// then every range's XXH3-64 (the same checksum the shard record keeps). The holder checks each chunk as it
// arrives and every range at the end, and keeps the copy only when all match; it checks every range again before
// it reports the copy to the last words and before it writes it. A copy that is bigger than the budget allows, or
// from a rank that is not a ward, is refused. A holder keeps two buffers per ward (ckpt::memtier::tier_bytes): the
// newest copy, and the one before it, whole until the next copy begins into its buffer. The last words may use
// either: when a node with several ranks dies, one rank's copy of step N may have arrived and another's not, and
// the copies of N - 1 then cover them all.
//
// With the node tier (node_tier.hpp) the held copies live in its files, so they outlive the holder's process. When
// a relaunch puts a ward on a node that holds nothing of it (the node that died was replaced), the ward's restore
// asks its partner for them (fetch_own): the relaunched holder sends the newest copy its earlier process kept, over
// the same kind of link and with the same checks, the other way (kFetch, then kHave and the copy).
//
// Threads: the persist thread sends (send; one link to the partner, made on first use and again after a failure);
// the training thread fetches (fetch_own, in restore(), before the first send) and, before each snapshot, waits for
// the wards' copies of the one before (wait_for_wards); one receiver thread per accepted ward link, which also
// serves a ward's fetch; the last-words thread freezes the holder (no copy replaced after), lists the copies that
// verify and writes one (with_copy). Every public function is thread-safe.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/hooks.hpp"
#include "staging.hpp"

namespace ckpt::hooks {

namespace heartbeat {
class Mesh;
}
class NodeTier;

class MemoryTier {
 public:
  struct Settings {
    int rank = 0;
    int world_size = 1;
    int partner = -1;              // where this rank's copies go; -1: nowhere (one node)
    std::vector<int> wards;        // whose copies this rank keeps
    std::uint64_t max_bytes = 0;   // CKPT_MEMORY: staging and held copies together
    std::chrono::milliseconds io_timeout{30000};  // a link silent this long in a transfer is dropped
    // Where the held copies live, so that they outlive this process, and what an earlier process of this rank kept
    // there (served to a relaunched ward). Null: anonymous memory. Must outlive this object's stop().
    NodeTier* node = nullptr;
  };

  // A copy this rank holds, whole: the ward's pieces back to back, as the ward's shard file holds them.
  struct Copy {
    int ward = -1;
    std::uint64_t step = 0;
    std::vector<store::StateRange> ranges;  // offsets into `data`, each with its checksum
    const std::byte* data = nullptr;
    std::uint64_t size = 0;
  };

  // Accepts ward links on `mesh` (which must outlive this object's stop()).
  static std::unique_ptr<MemoryTier> start(const Settings& settings, heartbeat::Mesh& mesh);
  ~MemoryTier();
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  // Closes every link and joins the receivers; idempotent. Call before the mesh goes.
  void stop();

  const Settings& settings() const;
  // The bytes of staging this rank holds: counted against the budget with the copies it keeps.
  void set_staging_bytes(std::uint64_t bytes);

  // Persist thread: `pieces` of `step` to the partner; returns once the partner kept the copy (or refused it).
  // sums: each piece's XXH3-64 where the caller has them already; empty: computed here.
  Status send(std::uint64_t step, const std::vector<Piece>& pieces, const std::vector<std::uint64_t>& sums = {});
  // Where the partner refused a copy because it does not fit its budget: the bytes it would need there.
  std::optional<std::uint64_t> partner_needs() const;

  // A copy of this rank's snapshot, fetched back from the partner: it owns its bytes.
  struct Fetched {
    std::uint64_t step = 0;
    std::string launch;  // the launch that took the snapshot
    int world_size = 0;
    std::vector<store::StateRange> ranges;  // offsets into `buffer`, each with its checksum, every one checked
    HostBuffer buffer;
  };
  // Training thread, before the first send: a copy of this rank's snapshots that an earlier process of the
  // partner kept in its node tier (`step` of `launch`, or the newest), checked chunk by chunk and range by range as
  // it arrives. Nothing: the partner holds none (or there is no partner). A partner still starting its tier holds
  // the link until the tier is up (heartbeat::Settings::hold_partner_links).
  Result<std::optional<Fetched>> fetch_own(std::optional<std::uint64_t> step = {}, const std::string& launch = {});

  // Training thread, before a snapshot overwrites the staging of the one before `step`'s: waits until every ward
  // that sends copies here has its copy of `step` or a later one kept here, or refused, or left the network in
  // order; at most `limit` and until `give_up` (polled) or the last words' freeze. Without it, a ward that died with
  // that copy in flight would leave here only its copy of the step before, which no survivor's staging holds any
  // longer: the last words would find no step to write. Returns the wards whose copy is still owed; a ward that
  // outlasted `limit` is not waited for again until a copy of it is kept.
  std::vector<int> wait_for_wards(std::uint64_t step, std::chrono::milliseconds limit,
                                  const std::function<bool()>& give_up = {});

  // Last words: no copy held is replaced or written over from here on (a copy begun before is refused at its end,
  // one begun after at its start).
  void freeze();
  bool frozen() const;
  // Last words: the copies held whole now, (ward, step), a ward's newer copy first, each checked again against its
  // ranges' checksums; a copy that fails is dropped with a line.
  std::vector<std::pair<int, std::uint64_t>> verified_copies();
  // Last words: `use` on the copy of `ward` at `step` while no receiver can touch it; fails when there is none.
  Status with_copy(int ward, std::uint64_t step, const std::function<Status(const Copy&)>& use);

  // A copy taken out of the tier: it owns its bytes.
  struct Kept {
    int ward = -1;
    std::uint64_t step = 0;
    std::vector<store::StateRange> ranges;  // offsets into `buffer`, each with its checksum
    HostBuffer buffer;
    std::uint64_t size = 0;
  };
  // After the last words froze the tier: every copy held whole, checked once more, moved out so that it outlives
  // the tier (a restart in place sends it to the ward's replacement). Nothing before the freeze, or a second time.
  std::vector<Kept> release();

  // Test seam: flips one byte of the newest copy held of `ward` (a fault the checks must catch).
  bool corrupt_for_testing(int ward);

 private:
  struct Impl;
  explicit MemoryTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::hooks
