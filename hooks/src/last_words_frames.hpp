#pragma once
// The last words' frames in typed form, so that neither their senders nor their readers handle heartbeat::Frame's
// generic fields; each struct says once which field carries what. from_frame() is given a frame of its type (the
// caller switches on the type) and checks nothing else: ranks and stage indexes are the caller's to bound.
#include <cstdint>
#include <optional>

#include "heartbeat.hpp"

namespace ckpt::hooks::heartbeat {

inline constexpr std::uint32_t kReportMidUpdate = 1;    // frozen between ckpt_before_update and the step's end
inline constexpr std::uint32_t kReportCannotWrite = 2;  // the rank failed to ready its state: counted as lost

struct ReportFrame {
  int rank = -1;
  std::uint64_t step = 0;
  std::uint64_t coord = 0;  // pack_coord of the rank's coordinate
  bool mid_update = false;
  bool can_write = true;

  // The frame to send; the network sets `from` (and the magic) on every send.
  Frame to_frame() const {
    Frame f;
    f.type = kReport;
    f.from = rank;
    f.subject = rank;
    f.a = step;
    f.b = coord;
    f.flags = (mid_update ? kReportMidUpdate : 0) | (can_write ? 0 : kReportCannotWrite);
    return f;
  }
  // The report a kReport frame carries (the caller checks the type and the rank's range).
  static ReportFrame from_frame(const Frame& f) {
    ReportFrame r;
    r.rank = f.subject;
    r.step = f.a;
    r.coord = f.b;
    r.mid_update = (f.flags & kReportMidUpdate) != 0;
    r.can_write = (f.flags & kReportCannotWrite) == 0;
    return r;
  }
};

// Flooded: last words started somewhere; subject = the rank that started them.
struct AlarmFrame {
  int started_by = -1;

  Frame to_frame() const {
    Frame f;
    f.type = kAlarm;
    f.subject = started_by;
    return f;
  }
  static AlarmFrame from_frame(const Frame& f) { return {f.subject}; }
};

// Sent up: `rank`'s terminal shard of `step`; subject = rank, a = step, flags = 1 when it is durable.
struct WroteFrame {
  int rank = -1;
  std::uint64_t step = 0;
  bool durable = false;

  Frame to_frame() const {
    Frame f;
    f.type = kWrote;
    f.subject = rank;
    f.a = step;
    f.flags = durable ? 1 : 0;
    return f;
  }
  static WroteFrame from_frame(const Frame& f) { return {f.subject, f.a, f.flags == 1}; }
};

// The root's decision, flooded: subject = root, a = step, b = how many pipeline stages follow (one StageFrame
// each), spare = how many stand-ins follow (one StandInFrame each), flags = 1 when the survivors write.
struct DecisionFrame {
  int root = -1;
  std::uint64_t step = 0;
  std::uint64_t stages = 0;
  bool write = false;
  std::uint32_t stand_ins = 0;

  Frame to_frame() const {
    Frame f;
    f.type = kDecision;
    f.subject = root;
    f.a = step;
    f.b = stages;
    f.flags = write ? 1 : 0;
    f.spare = stand_ins;
    return f;
  }
  static DecisionFrame from_frame(const Frame& f) { return {f.subject, f.a, f.b, f.flags == 1, f.spare}; }
};

// What a rank holds in memory besides its live state (the memory tier), sent up before its report: subject = the
// rank, a = the step its staging holds whole (flags & kHeldOwn), b = the step of the copy it holds of `ward`'s
// shard (flags & kHeldWard; spare = the ward), checked again just before. One frame per ward; one without a ward
// when it holds none.
inline constexpr std::uint32_t kHeldOwn = 1;
inline constexpr std::uint32_t kHeldWard = 2;

struct HeldFrame {
  int rank = -1;
  std::optional<std::uint64_t> own_step;
  int ward = -1;
  std::uint64_t ward_step = 0;  // meaningful when ward >= 0

  Frame to_frame() const {
    Frame f;
    f.type = kHeld;
    f.subject = rank;
    f.a = own_step.value_or(0);
    f.b = ward_step;
    f.spare = ward >= 0 ? static_cast<std::uint32_t>(ward) : 0;
    f.flags = (own_step ? kHeldOwn : 0) | (ward >= 0 ? kHeldWard : 0);
    return f;
  }
  static HeldFrame from_frame(const Frame& f) {
    HeldFrame h;
    h.rank = f.subject;
    if (f.flags & kHeldOwn) h.own_step = f.a;
    if (f.flags & kHeldWard) {
      h.ward = static_cast<int>(f.spare);
      h.ward_step = f.b;
    }
    return h;
  }
};

// One stand-in of the decision, flooded: `holder` writes `ward`'s shard of `step` from its partner copy; the ward's
// packed coordinate (pack_coord) rides in spare (low half) and flags (high half), since only the root knows it.
struct StandInFrame {
  int ward = -1;
  int holder = -1;
  std::uint64_t step = 0;
  std::uint64_t ward_coord = 0;

  Frame to_frame() const {
    Frame f;
    f.type = kStandIn;
    f.subject = ward;
    f.a = static_cast<std::uint64_t>(holder);
    f.b = step;
    f.spare = static_cast<std::uint32_t>(ward_coord & 0xffffffffu);
    f.flags = static_cast<std::uint32_t>(ward_coord >> 32);
    return f;
  }
  static StandInFrame from_frame(const Frame& f) {
    return {f.subject, static_cast<int>(f.a), f.b, (static_cast<std::uint64_t>(f.flags) << 32) | f.spare};
  }
};

// Flooded, once per job: the memory tier does not fit `rank` (it needs `need` bytes, CKPT_MEMORY is `budget`), so
// every rank turns it off; subject = rank, a = need, b = budget.
struct TierOffFrame {
  int rank = -1;
  std::uint64_t need = 0;
  std::uint64_t budget = 0;

  Frame to_frame() const {
    Frame f;
    f.type = kTierOff;
    f.subject = rank;
    f.a = need;
    f.b = budget;
    return f;
  }
  static TierOffFrame from_frame(const Frame& f) { return {f.subject, f.a, f.b}; }
};

// One stage of the decision, flooded: subject = stage, a = its writing dp index (negative: none, as two's
// complement), b = step.
struct StageFrame {
  int stage = -1;
  int writer = -1;
  std::uint64_t step = 0;

  Frame to_frame() const {
    Frame f;
    f.type = kStage;
    f.subject = stage;
    f.a = static_cast<std::uint64_t>(static_cast<std::int64_t>(writer));
    f.b = step;
    return f;
  }
  static StageFrame from_frame(const Frame& f) {
    return {f.subject, static_cast<int>(static_cast<std::int64_t>(f.a)), f.b};
  }
};

// The root's end of the last words, flooded: a = step, flags = 1 when the terminal checkpoint was committed.
struct OutcomeFrame {
  std::uint64_t step = 0;
  bool committed = false;

  Frame to_frame() const {
    Frame f;
    f.type = kOutcome;
    f.a = step;
    f.flags = committed ? 1 : 0;
    return f;
  }
  static OutcomeFrame from_frame(const Frame& f) { return {f.a, f.flags == 1}; }
};

}  // namespace ckpt::hooks::heartbeat
