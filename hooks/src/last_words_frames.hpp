#pragma once
// The last words' report (heartbeat::kReport) in typed form, so that neither its sender nor its readers handle the
// frame's generic fields. The wire format is heartbeat::Frame's: subject = rank, a = step, b = packed coordinate,
// flags = kReportMidUpdate | kReportCannotWrite.
#include <cstdint>

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

}  // namespace ckpt::hooks::heartbeat
