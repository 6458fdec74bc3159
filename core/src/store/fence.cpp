// Fencing of stale runs: the epoch record and the decisions over it. Pure; the store's file-system side
// (control.cpp) reads and writes the record and asks these.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/store.hpp"

namespace ckpt::store {

namespace {

constexpr std::size_t kMaxJobId = 128;

std::string job_label(const std::string& job_id) { return job_id.empty() ? "the job" : "job " + job_id; }

// (epoch, generation) of a run and of a record, in order: a later generation of one run is a newer run.
bool older(std::uint64_t epoch, std::uint64_t generation, const EpochRecord& than) {
  return epoch < than.epoch || (epoch == than.epoch && generation < than.generation);
}

std::string run_label(std::uint64_t epoch, std::uint64_t generation) {
  return "run " + std::to_string(epoch) + (generation ? " (generation " + std::to_string(generation) + ")" : "");
}

}  // namespace

std::string to_json(const EpochRecord& record) {
  nlohmann::json doc = {{"job_id", record.job_id}, {"epoch", record.epoch}, {"run_id", record.run_id}};
  if (record.generation != 0) doc["generation"] = record.generation;
  return doc.dump() + "\n";
}

Result<EpochRecord> parse_epoch_record(std::string_view text) {
  nlohmann::json doc = nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) return Error{"epoch record: not a JSON object"};
  EpochRecord r;
  auto job = doc.find("job_id");
  if (job == doc.end() || !job->is_string()) return Error{"epoch record: job_id: expected a string"};
  r.job_id = job->get<std::string>();
  if (r.job_id.size() > kMaxJobId) return Error{"epoch record: job_id: too long"};
  auto epoch = doc.find("epoch");
  if (epoch == doc.end() || !epoch->is_number_unsigned()) {
    return Error{"epoch record: epoch: expected a non-negative integer"};
  }
  r.epoch = epoch->get<std::uint64_t>();
  if (auto generation = doc.find("generation"); generation != doc.end()) {
    if (!generation->is_number_unsigned()) return Error{"epoch record: generation: expected a non-negative integer"};
    r.generation = generation->get<std::uint64_t>();
  }
  if (auto run = doc.find("run_id"); run != doc.end()) {
    if (!run->is_string()) return Error{"epoch record: run_id: expected a string"};
    r.run_id = run->get<std::string>();
  }
  return r;
}

std::optional<std::string> fence_refusal(const Fence& run, const std::optional<EpochRecord>& record) {
  if (!record) return std::nullopt;
  const std::string me = run_label(run.epoch, run.generation) + " of " + job_label(run.job_id) + " is fenced: ";
  if (record->job_id != run.job_id) {
    return me + job_label(record->job_id) + " (" + run_label(record->epoch, record->generation) +
           ") has started in this checkpoint dir";
  }
  if (older(run.epoch, run.generation, *record)) {
    return me + run_label(record->epoch, record->generation) + " has started";
  }
  return std::nullopt;
}

EpochAction plan_epoch_raise(const Fence& run, const std::optional<EpochRecord>& record) {
  if (!record || record->job_id != run.job_id) return EpochAction::Write;
  if (older(run.epoch, run.generation, *record)) return EpochAction::Fenced;
  if (record->epoch == run.epoch && record->generation == run.generation) return EpochAction::Keep;
  return EpochAction::Write;
}

}  // namespace ckpt::store
