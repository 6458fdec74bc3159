// Fencing of stale runs: the epoch record and the decisions over it. Pure; the store's file-system side
// (store_control.cpp) reads and writes the record and asks these.
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "ckpt/store.hpp"

namespace ckpt::store {

namespace {

constexpr std::size_t kMaxJobId = 128;

std::string job_label(const std::string& job_id) { return job_id.empty() ? "the job" : "job " + job_id; }

}  // namespace

std::string to_json(const EpochRecord& record) {
  nlohmann::json doc = {{"job_id", record.job_id}, {"epoch", record.epoch}, {"run_id", record.run_id}};
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
  if (auto run = doc.find("run_id"); run != doc.end()) {
    if (!run->is_string()) return Error{"epoch record: run_id: expected a string"};
    r.run_id = run->get<std::string>();
  }
  return r;
}

std::optional<std::string> fence_refusal(const Fence& run, const std::optional<EpochRecord>& record) {
  if (!record) return std::nullopt;
  const std::string me = "run " + std::to_string(run.epoch) + " of " + job_label(run.job_id) + " is fenced: ";
  if (record->job_id != run.job_id) {
    return me + job_label(record->job_id) + " (run " + std::to_string(record->epoch) +
           ") has started in this checkpoint dir";
  }
  if (record->epoch > run.epoch) return me + "run " + std::to_string(record->epoch) + " has started";
  return std::nullopt;
}

EpochAction plan_epoch_raise(const Fence& run, const std::optional<EpochRecord>& record) {
  if (!record || record->job_id != run.job_id || record->epoch < run.epoch) return EpochAction::Write;
  if (record->epoch == run.epoch) return EpochAction::Keep;
  return EpochAction::Fenced;
}

}  // namespace ckpt::store
