#pragma once
// The periodic coordination's frames (coordinator_tree.cpp) in typed form, so that neither their senders nor
// their readers handle heartbeat::Frame's generic fields. The wire format is Frame's; each struct says which
// field carries what, once. from_frame() is given a frame of its type (the caller switches on the type).
#include <cstdint>

#include "ckpt/store.hpp"
#include "heartbeat.hpp"
#include "restore_agreement.hpp"

namespace ckpt::hooks::heartbeat {

// A checkpoint of `step` asked for, flooded: flags = 1 for a terminal one.
inline constexpr std::uint32_t kRequestTerminal = 1;
inline constexpr std::uint32_t kRequestMemory = 2;  // a memory-tier checkpoint (CKPT_MEMORY_INTERVAL=auto)

struct RequestFrame {
  std::uint64_t step = 0;
  store::Kind kind = store::Kind::Periodic;
  bool memory = false;  // a memory checkpoint: staging and the partner's copy, no shard (kind is ignored)

  Frame to_frame() const {
    Frame f;
    f.type = kRequest;
    f.a = step;
    f.flags = memory ? kRequestMemory : kind == store::Kind::Terminal ? kRequestTerminal : 0;
    return f;
  }
  static RequestFrame from_frame(const Frame& f) {
    return {f.a, f.flags == kRequestTerminal ? store::Kind::Terminal : store::Kind::Periodic,
            f.flags == kRequestMemory};
  }
};

// Sent up: `ranks` of the sender's subtree have a durable shard of `step`; a = step, b = ranks, flags =
// kRecordsReady when their records can be read (ranks = 1: its .rec, else its gathered file).
struct ShardsDoneFrame {
  std::uint64_t step = 0;
  std::uint64_t ranks = 0;
  bool records_ready = false;

  Frame to_frame() const {
    Frame f;
    f.type = kShardsDone;
    f.a = step;
    f.b = ranks;
    f.flags = records_ready ? kRecordsReady : 0;
    return f;
  }
  static ShardsDoneFrame from_frame(const Frame& f) { return {f.a, f.b, (f.flags & kRecordsReady) != 0}; }
};

// Sent up: `rank` could not persist `step`; a = step, subject = rank.
struct ShardFailedFrame {
  std::uint64_t step = 0;
  int rank = -1;

  Frame to_frame() const {
    Frame f;
    f.type = kShardFailed;
    f.a = step;
    f.subject = rank;
    return f;
  }
  static ShardFailedFrame from_frame(const Frame& f) { return {f.a, f.subject}; }
};

// Flooded: the writer retired `step` (store::retire); each rank removes its own files of it. a = step.
struct RetiredFrame {
  std::uint64_t step = 0;

  Frame to_frame() const {
    Frame f;
    f.type = kRetired;
    f.a = step;
    return f;
  }
  static RetiredFrame from_frame(const Frame& f) { return {f.a}; }
};

// Flooded: the leader wrote a restore round's file; a = round, flags = 1: the plan, 2: the verdict. A frame
// with other flags names no file (valid() is false).
struct RestoreFileFrame {
  int round = 0;
  RestoreFile file = RestoreFile::Plan;
  bool valid = true;

  Frame to_frame() const {
    Frame f;
    f.type = kRestoreFile;
    f.a = static_cast<std::uint64_t>(round);
    f.flags = file == RestoreFile::Plan ? 1 : 2;
    return f;
  }
  static RestoreFileFrame from_frame(const Frame& f) {
    return {static_cast<int>(f.a), f.flags == 1 ? RestoreFile::Plan : RestoreFile::Verdict,
            f.flags == 1 || f.flags == 2};
  }
};

// Flooded by the root when a count of `step` is late: every rank that sent its count sends it again. a = step,
// b = the root's recount number (a flood seen twice is passed on once).
struct RecountFrame {
  std::uint64_t step = 0;
  std::uint64_t recount = 0;

  Frame to_frame() const {
    Frame f;
    f.type = kRecount;
    f.a = step;
    f.b = recount;
    return f;
  }
  static RecountFrame from_frame(const Frame& f) { return {f.a, f.b}; }
};

}  // namespace ckpt::hooks::heartbeat
