#pragma once
// Carries out a job's requeue intent against Slurm, one idempotent step at a time, as rec::next_intent_step
// decides: mark the dead nodes DOWN and drain the opted-in ones, requeue (unless Slurm's restart count shows it
// happened), update the job to start at once off the bad nodes, and follow the new run. Each step is durable in
// SQLite before the next one acts, so a controller killed anywhere carries the intent on after its restart and
// never requeues twice.
//
// What it needs of the engine that owns the records is its Host: the record's bookkeeping, Slurm's view of the job
// and the nodes, when to look at the job again, and the crash points of the restart tests.
//
// Call order: the engine's thread, under the engine's lock: drive(record, now) whenever a job in Requeueing is due.
#include <cstdint>
#include <optional>
#include <string>

#include "backend.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/recovery_plan.hpp"
#include "observe.hpp"

namespace ckpt::controller {

class IntentRunner {
 public:
  using JobRecord = ckpt::recovery::JobRecord;
  using JobState = ckpt::recovery::JobState;

  class Host {
   public:
    virtual void note(JobRecord& r, const std::string& kind, const std::string& text, double now) = 0;
    virtual bool transition(JobRecord& r, JobState to, const std::string& why, double now) = 0;
    virtual void give_up(JobRecord& r, const std::string& reason, const SlurmJob* slurm, double now) = 0;
    virtual void new_run(JobRecord& r, std::uint32_t restart_count, double now) = 0;
    // The record changed: it is written at the next flush.
    virtual void mark_dirty(JobRecord& r, double now) = 0;
    virtual void flush() = 0;
    // True while a change of the job's record is not yet written (a flush failed).
    virtual bool unflushed(std::uint32_t job_id) const = 0;
    virtual std::optional<SlurmJob> load_job(JobRecord& r, double now, bool& failed) = 0;
    virtual void refresh_nodes(double now, bool force) = 0;
    virtual void check_again_at(std::uint32_t job_id, double at) = 0;
    // The intent is done: Slurm is asked about the job every cycle until `until` (its new run is about to start).
    virtual void watch_new_run(std::uint32_t job_id, double until) = 0;
    virtual void crash_point(const char* name) = 0;

   protected:
    ~Host() = default;
  };

  IntentRunner(Host& host, SlurmBackend& backend, Metrics& metrics, double completing_timeout_s)
      : host_(host), backend_(backend), metrics_(metrics), completing_timeout_s_(completing_timeout_s) {}

  // Takes the steps of r's intent that can be taken now (at most 8 looks at Slurm).
  void drive(JobRecord& r, double now);

 private:
  // One step; true when the next step may follow at once.
  bool take_step(JobRecord& r, const ckpt::recovery::IntentStep& step, SlurmJob& s, double now);
  bool on_mark_down(JobRecord& r, const ckpt::recovery::IntentStep& step, SlurmJob& s, double now);
  bool on_requeued(JobRecord& r, const ckpt::recovery::IntentStep& step, double now, const SlurmJob& s);
  bool on_requeue(JobRecord& r, SlurmJob& s, double now);
  bool on_expedite(JobRecord& r, const ckpt::recovery::IntentStep& step, double now);
  bool on_finish(JobRecord& r, const ckpt::recovery::IntentStep& step, const SlurmJob& s, double now);

  Host& host_;
  SlurmBackend& backend_;
  Metrics& metrics_;
  const double completing_timeout_s_;
};

}  // namespace ckpt::controller
