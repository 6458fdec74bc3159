// The C ABI: thin wrappers that turn Status/Result into 0/-1 plus a thread-local message, and catch everything.
#include "ckpt.h"

#include <cstdint>
#include <exception>
#include <limits>
#include <string>

#include "ckpt/hooks.hpp"
#include "log.hpp"

struct ckpt_checkpointer {
  std::unique_ptr<ckpt::hooks::Checkpointer> impl;
};

namespace {

thread_local std::string g_error;

int fail(std::string message) {
  g_error = ckpt::hooks::log::prefixed(message);
  return -1;
}

int done(const ckpt::Status& s) { return s ? (g_error.clear(), 0) : fail(s.error()); }

// Runs `body`, turning any exception into a failure of `what`.
template <class F>
int guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    return fail(std::string(what) + ": " + e.what());
  } catch (...) {
    return fail(std::string(what) + ": unknown error");
  }
}

// Fails the call when a pointer argument is NULL: "ckpt: ckpt_restore: step is NULL".
#define CKPT_NEED(fn, ptr) \
  if ((ptr) == nullptr) return fail(std::string(fn) + ": " #ptr " is NULL")

int register_region(const char* fn, ckpt_checkpointer* cp, const char* name, void* data, size_t size, unsigned flags,
                    const char* meta_json, ckpt::hooks::Memory memory, void* stream) {
  CKPT_NEED(fn, cp);
  CKPT_NEED(fn, name);
  if ((flags & ~CKPT_REGION_SYNC) != 0) return fail(std::string(fn) + ": unknown region flags " + std::to_string(flags));
  ckpt::hooks::RegionSpec spec;
  spec.name = name;
  spec.data = data;
  spec.size = size;
  spec.memory = memory;
  spec.sync = (flags & CKPT_REGION_SYNC) != 0;
  spec.meta_json = meta_json != nullptr ? meta_json : "{}";
  spec.stream = stream;
  return done(cp->impl->register_region(spec));
}

}  // namespace

extern "C" {

const char* ckpt_last_error(void) { return g_error.c_str(); }

int ckpt_open(const char* const* settings, size_t count, ckpt_checkpointer** out) {
  return guarded("ckpt_open", [&] {
    CKPT_NEED("ckpt_open", out);
    *out = nullptr;
    if (count > 0 && settings == nullptr) return fail("ckpt_open: settings is NULL but count is " + std::to_string(count));
    ckpt::hooks::Options options;
    for (size_t i = 0; i < count; ++i) {
      if (settings[i] == nullptr) return fail("ckpt_open: setting " + std::to_string(i) + " is NULL");
      std::string_view kv(settings[i]);
      auto eq = kv.find('=');
      if (eq == std::string_view::npos || eq == 0) return fail("setting '" + std::string(kv) + "' is not key=value");
      if (ckpt::Status s = options.set(kv.substr(0, eq), kv.substr(eq + 1)); !s) return fail(s.error());
    }
    auto created = ckpt::hooks::Checkpointer::create(options);
    if (!created) return fail(created.error());
    *out = new ckpt_checkpointer{std::move(created).value()};
    g_error.clear();
    return 0;
  });
}

int ckpt_enabled(const ckpt_checkpointer* cp) { return cp != nullptr && cp->impl->enabled() ? 1 : 0; }

int ckpt_rank(const ckpt_checkpointer* cp) { return cp != nullptr ? cp->impl->config().rank : -1; }

int ckpt_world_size(const ckpt_checkpointer* cp) { return cp != nullptr ? cp->impl->config().world_size : -1; }

int ckpt_register_host(ckpt_checkpointer* cp, const char* name, void* data, size_t size, unsigned flags,
                       const char* meta_json) {
  return guarded("ckpt_register_host", [&] {
    return register_region("ckpt_register_host", cp, name, data, size, flags, meta_json, ckpt::hooks::Memory::Host,
                           nullptr);
  });
}

int ckpt_register_device(ckpt_checkpointer* cp, const char* name, void* data, size_t size, void* stream,
                         unsigned flags, const char* meta_json) {
  return guarded("ckpt_register_device", [&] {
    return register_region("ckpt_register_device", cp, name, data, size, flags, meta_json,
                           ckpt::hooks::Memory::Device, stream);
  });
}

int ckpt_put_blob(ckpt_checkpointer* cp, const char* name, const void* data, size_t size, const char* meta_json) {
  return guarded("ckpt_put_blob", [&] {
    CKPT_NEED("ckpt_put_blob", cp);
    CKPT_NEED("ckpt_put_blob", name);
    return done(cp->impl->put_blob(name, data, size, meta_json != nullptr ? meta_json : "{}"));
  });
}

int ckpt_restore(ckpt_checkpointer* cp, uint64_t* step) {
  return guarded("ckpt_restore", [&] {
    CKPT_NEED("ckpt_restore", cp);
    CKPT_NEED("ckpt_restore", step);
    auto r = cp->impl->restore(true);
    if (!r) return fail(r.error());
    *step = *r;
    g_error.clear();
    return 0;
  });
}

int ckpt_restored_region(const ckpt_checkpointer* cp, const char* name, const void** data, size_t* size) {
  return guarded("ckpt_restored_region", [&] {
    CKPT_NEED("ckpt_restored_region", cp);
    CKPT_NEED("ckpt_restored_region", name);
    CKPT_NEED("ckpt_restored_region", data);
    CKPT_NEED("ckpt_restored_region", size);
    for (const auto& r : cp->impl->restored()) {
      if (r.name == name) {
        *data = r.data;
        *size = r.size;
        g_error.clear();
        return 0;
      }
    }
    return fail("ckpt_restored_region: no restored region '" + std::string(name) + "'");
  });
}

int ckpt_before_update(ckpt_checkpointer* cp) {
  return guarded("ckpt_before_update", [&] {
    CKPT_NEED("ckpt_before_update", cp);
    return done(cp->impl->before_update());
  });
}

int ckpt_after_step(ckpt_checkpointer* cp, uint64_t step, int* stop) {
  return guarded("ckpt_after_step", [&] {
    CKPT_NEED("ckpt_after_step", cp);
    auto r = cp->impl->after_step(step);
    if (!r) return fail(r.error());
    if (stop != nullptr) *stop = *r ? 1 : 0;
    g_error.clear();
    return 0;
  });
}

int ckpt_time_section(ckpt_checkpointer* cp, double seconds) {
  return guarded("ckpt_time_section", [&] {
    CKPT_NEED("ckpt_time_section", cp);
    cp->impl->time_section(seconds);
    g_error.clear();
    return 0;
  });
}

int ckpt_save(ckpt_checkpointer* cp, uint64_t step, int terminal) {
  return guarded("ckpt_save", [&] {
    CKPT_NEED("ckpt_save", cp);
    return done(cp->impl->save(step, terminal != 0 ? ckpt::store::Kind::Terminal : ckpt::store::Kind::Periodic));
  });
}

int ckpt_stats_get(const ckpt_checkpointer* cp, ckpt_stats* out) {
  return guarded("ckpt_stats_get", [&] {
    CKPT_NEED("ckpt_stats_get", cp);
    CKPT_NEED("ckpt_stats_get", out);
    ckpt::hooks::Stats s = cp->impl->stats();
    *out = ckpt_stats{};
    out->snapshots = s.snapshots;
    out->persisted = s.persisted;
    out->committed = s.committed;
    out->failed = s.failed;
    out->last_committed_step = s.last_committed_step.value_or(std::numeric_limits<uint64_t>::max());
    out->backpressure_waits = s.backpressure_waits;
    out->state_bytes = s.state_bytes;
    out->staging_bytes = s.staging_bytes;
    out->last_stall_s = s.last_stall_s;
    out->total_stall_s = s.total_stall_s;
    out->last_copy_s = s.last_copy_s;
    out->last_persist_s = s.last_persist_s;
    out->last_commit_s = s.last_commit_s;
    out->backpressure_s = s.backpressure_s;
    out->auto_interval_s = s.auto_interval_s;
    out->auto_cost_s = s.auto_cost_s;
    out->auto_stall_s = s.auto_stall_s;
    out->auto_interference_s = s.auto_interference_s;
    out->auto_persist_floor_s = s.auto_persist_floor_s;
    out->auto_mtbf_s = s.auto_mtbf_s;
    out->auto_checkpoints = s.auto_checkpoints;
    g_error.clear();
    return 0;
  });
}

int ckpt_watch_nccl(ckpt_checkpointer* cp, void* comm) {
  return guarded("ckpt_watch_nccl", [&] {
    CKPT_NEED("ckpt_watch_nccl", cp);
    return done(cp->impl->watch_nccl(comm));
  });
}

int ckpt_close(ckpt_checkpointer* cp) {
  return guarded("ckpt_close", [&] {
    CKPT_NEED("ckpt_close", cp);
    return done(cp->impl->close());
  });
}

void ckpt_free(ckpt_checkpointer* cp) {
  try {
    delete cp;  // ~Checkpointer closes and logs a failure
  } catch (...) {
    // nothing may escape into C
  }
}

}  // extern "C"
