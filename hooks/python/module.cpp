// slurm_ckpt._native: the Python binding of ckpt::hooks::Checkpointer. Errors raise slurm_ckpt.Error (a
// RuntimeError) whose message starts with "ckpt: ". Calls that may block release the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <stdexcept>
#include <string>

#include "ckpt/address.hpp"
#include "ckpt/env_contract.hpp"
#include "ckpt/hooks.hpp"
#include "ckpt/recovery.hpp"

namespace py = pybind11;
using ckpt::hooks::Checkpointer;

void bind_group_unblock(py::module& m);  // group_unblock.cpp
void bind_inplace(py::module& m);        // inplace_binding.cpp

namespace {

struct CkptError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check(const ckpt::Status& s) {
  if (!s) throw CkptError(s.error());
}

template <class T>
T take(ckpt::Result<T> r) {
  if (!r) throw CkptError(r.error());
  return std::move(r).value();
}

// Settings may be given as any Python value; str() of it is parsed like the environment variable.
ckpt::hooks::Options options_from(const py::kwargs& kwargs) {
  ckpt::hooks::Options options;
  for (const auto& [key, value] : kwargs) {
    if (value.is_none()) continue;
    std::string text = py::isinstance<py::bool_>(value) ? (value.cast<bool>() ? "on" : "off") : py::str(value).cast<std::string>();
    check(options.set(key.cast<std::string>(), text));
  }
  return options;
}

// The native checkpointer; owned by Python, closed by close() or when collected.
class PyCheckpointer {
 public:
  explicit PyCheckpointer(const py::kwargs& kwargs) : impl_(take(Checkpointer::create(options_from(kwargs)))) {}

  Checkpointer& get() { return *impl_; }

  void register_region(const std::string& name, std::uintptr_t ptr, std::size_t size, bool device, bool sync,
                       const std::string& meta, std::uintptr_t stream) {
    check(impl_->register_region(spec(name, ptr, size, device, sync, meta, stream)));
  }

  void set_regions(const std::vector<py::tuple>& regions) {
    std::vector<ckpt::hooks::RegionSpec> specs;
    specs.reserve(regions.size());
    for (const py::tuple& t : regions) {
      if (t.size() != 7) throw CkptError("ckpt: set_regions: expected (name, ptr, size, device, sync, meta, stream)");
      specs.push_back(spec(t[0].cast<std::string>(), t[1].cast<std::uintptr_t>(), t[2].cast<std::size_t>(),
                           t[3].cast<bool>(), t[4].cast<bool>(), t[5].cast<std::string>(),
                           t[6].cast<std::uintptr_t>()));
    }
    py::gil_scoped_release release;
    check(impl_->set_regions(specs));
  }

  void put_blob(const std::string& name, const py::buffer& data, const std::string& meta) {
    py::buffer_info info = data.request();
    auto size = static_cast<std::size_t>(info.size * info.itemsize);
    check(impl_->put_blob(name, info.ptr, size, meta));
  }

  py::list restored() {
    py::list out;
    for (const auto& r : impl_->restored()) {
      out.append(py::make_tuple(r.name, r.meta_json,
                                py::memoryview::from_memory(r.data, static_cast<py::ssize_t>(r.size)),
                                reinterpret_cast<std::uintptr_t>(r.data)));
    }
    return out;
  }

 private:
  static ckpt::hooks::RegionSpec spec(const std::string& name, std::uintptr_t ptr, std::size_t size, bool device,
                                      bool sync, const std::string& meta, std::uintptr_t stream) {
    ckpt::hooks::RegionSpec s;
    s.name = name;
    s.data = reinterpret_cast<void*>(ptr);
    s.size = size;
    s.memory = device ? ckpt::hooks::Memory::Device : ckpt::hooks::Memory::Host;
    s.sync = sync;
    s.meta_json = meta;
    s.stream = reinterpret_cast<void*>(stream);
    return s;
  }

  std::unique_ptr<Checkpointer> impl_;
};

const char* rendezvous_name(ckpt::hooks::RendezvousKind kind) {
  switch (kind) {
    case ckpt::hooks::RendezvousKind::Auto: return "auto";
    case ckpt::hooks::RendezvousKind::Files: return "files";
    case ckpt::hooks::RendezvousKind::Pmix: return "pmix";
  }
  return "?";
}

py::dict config_dict(const ckpt::hooks::Config& c) {
  py::dict d;
  d["dir"] = c.dir;
  d["interval"] = ckpt::format_interval(c.interval);
  d["keep"] = c.keep;
  d["grace_s"] = c.grace_s;
  d["last_words"] = c.last_words;
  d["layout"] = py::dict(py::arg("dp") = c.layout.dp, py::arg("tp") = c.layout.tp, py::arg("pp") = c.layout.pp,
                         py::arg("zero1") = c.layout.zero1);
  d["coord"] = py::dict(py::arg("dp") = c.coord.dp, py::arg("tp") = c.coord.tp, py::arg("pp") = c.coord.pp);
  d["layout_declared"] = c.layout_declared;
  d["mtbf_s"] = c.mtbf_s;
  d["max_restarts"] = c.max_restarts;
  d["restart_count"] = c.restart_count;
  d["job_id"] = c.job_id;
  d["resume_step"] = c.resume_step ? py::cast(*c.resume_step) : py::none();
  d["resume_path"] = c.resume_path;
  d["end_time"] = c.end_time ? py::cast(*c.end_time) : py::none();
  d["rank"] = c.rank;
  d["world_size"] = c.world_size;
  d["local_rank"] = c.local_rank;
  d["rank_source"] = c.rank_source;
  d["rendezvous"] = rendezvous_name(c.rendezvous);
  d["copy_threads"] = c.copy_threads;
  d["commit_timeout_s"] = c.commit_timeout_s;
  d["agree_lead"] = c.agree_lead;
  d["signals"] = c.signals;
  d["run_id"] = c.run_id;
  return d;
}

py::dict stats_dict(const ckpt::hooks::Stats& s) {
  py::dict d;
  d["snapshots"] = s.snapshots;
  d["persisted"] = s.persisted;
  d["committed"] = s.committed;
  d["failed"] = s.failed;
  d["last_snapshot_step"] = s.last_snapshot_step ? py::cast(*s.last_snapshot_step) : py::none();
  d["last_committed_step"] = s.last_committed_step ? py::cast(*s.last_committed_step) : py::none();
  d["last_stall_s"] = s.last_stall_s;
  d["total_stall_s"] = s.total_stall_s;
  d["last_copy_s"] = s.last_copy_s;
  d["last_persist_s"] = s.last_persist_s;
  d["last_commit_s"] = s.last_commit_s;
  d["last_persist_bytes"] = s.last_persist_bytes;
  d["backpressure_waits"] = s.backpressure_waits;
  d["backpressure_s"] = s.backpressure_s;
  d["last_backpressure_s"] = s.last_backpressure_s;
  d["state_bytes"] = s.state_bytes;
  d["staging_bytes"] = s.staging_bytes;
  d["blob_bytes"] = s.blob_bytes;
  d["restore_read_bytes"] = s.restore_read_bytes;
  d["restore_live_bytes"] = s.restore_live_bytes;
  d["restore_s"] = s.restore_s;
  d["memory_checkpoints"] = s.memory_checkpoints;
  d["partner_copies"] = s.partner_copies;
  d["partner_failures"] = s.partner_failures;
  d["last_partner_s"] = s.last_partner_s;
  d["memory_tier_off"] = s.memory_tier_off;
  d["memory_interval"] = s.memory_interval;
  d["auto_interval_s"] = s.auto_interval_s;
  d["auto_cost_s"] = s.auto_cost_s;
  d["auto_stall_s"] = s.auto_stall_s;
  d["auto_interference_s"] = s.auto_interference_s;
  d["auto_persist_floor_s"] = s.auto_persist_floor_s;
  d["auto_mtbf_s"] = s.auto_mtbf_s;
  d["auto_checkpoints"] = s.auto_checkpoints;
  d["auto_interval_inputs"] = s.auto_interval_inputs;
  return d;
}

py::dict last_words_dict(const ckpt::hooks::LastWordsReport& r) {
  py::dict d;
  d["armed"] = r.armed;
  d["triggered"] = r.triggered;
  d["done"] = r.done;
  d["lost_peer"] = r.lost_peer;
  d["counted_dead"] = r.counted_dead;
  d["committed"] = r.committed;
  d["step"] = r.step;
  d["root"] = r.root;
  d["lost"] = r.lost;
  d["detect_unix"] = r.detect_unix;
  d["decided_unix"] = r.decided_unix;
  d["done_unix"] = r.done_unix;
  d["summary"] = r.summary;
  d["stand_ins"] = r.stand_ins;
  d["behind"] = r.behind;
  return d;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "slurm-ckpt's training-side hooks (libckpt); see slurm_ckpt.torch for the PyTorch helper";
  py::register_exception<CkptError>(m, "Error", PyExc_RuntimeError);
  bind_group_unblock(m);
  bind_inplace(m);

  m.def("publish_address", [] {
    auto chosen = ckpt::net::publish_address();
    if (!chosen) throw CkptError(chosen.error());
    return py::make_tuple(chosen->address, chosen->how, chosen->warning);
  }, "(address, how, warning): the address this process publishes to its peers and binds (ckpt/address.hpp); "
     "raises Error when CKPT_ADDR or the named interface cannot be had.");
  m.def("expand_hostlist", [](const std::string& list) {
    auto names = ckpt::recovery::expand_hostlist(list);
    if (!names) throw CkptError(names.error());
    return *names;
  }, py::arg("list"), "A Slurm hostlist (\"n[1-3],gpu07\") as names, in order; raises Error on a malformed one.");
  m.def("env_names", [] {
    py::dict out;
    for (const auto& v : ckpt::env::contract()) out[py::str(v.key)] = py::str(v.name);
    return out;
  }, "The environment contract (ckpt/env_contract.hpp): setting key -> variable name.");
  m.def("option_keys", [] {
    py::list out;
    for (const auto& k : ckpt::hooks::option_keys()) out.append(py::make_tuple(k.key, k.env, k.expected));
    return out;
  }, "Every setting: (key, environment variable, what a valid value looks like).");

  py::class_<ckpt::hooks::MemoryCopy>(m, "MemoryCopy", py::buffer_protocol(),
                                      "A checkpoint in memory kept after the last words: `rank`'s host ranges of "
                                      "`step`, as bytes (the buffer protocol: torch.frombuffer takes it without a copy).")
      .def_readonly("rank", &ckpt::hooks::MemoryCopy::rank)
      .def_readonly("step", &ckpt::hooks::MemoryCopy::step)
      .def_property_readonly("ranges", [](const ckpt::hooks::MemoryCopy& c) {
             py::list out;
             for (const auto& r : c.ranges) out.append(py::make_tuple(r.name, r.offset, r.length));
             return out;
           }, "[(name, offset, length)]: the shard's ranges, in order")
      .def_buffer([](ckpt::hooks::MemoryCopy& c) {
        return py::buffer_info(c.data.get(), 1, py::format_descriptor<std::uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(c.size)}, {1});
      });

  py::class_<PyCheckpointer>(m, "Checkpointer", "The native checkpointer; settings override the CKPT_* environment.")
      .def(py::init<const py::kwargs&>())
      .def_property_readonly("enabled", [](PyCheckpointer& self) { return self.get().enabled(); })
      .def_property_readonly("rank", [](PyCheckpointer& self) { return self.get().config().rank; })
      .def_property_readonly("world_size", [](PyCheckpointer& self) { return self.get().config().world_size; })
      .def_property_readonly("local_rank", [](PyCheckpointer& self) { return self.get().config().local_rank; })
      .def_property_readonly("config", [](PyCheckpointer& self) { return config_dict(self.get().config()); })
      .def("register_host", [](PyCheckpointer& self, const std::string& name, std::uintptr_t ptr, std::size_t size,
                               const std::string& meta, bool sync) {
             self.register_region(name, ptr, size, false, sync, meta, 0);
           },
           py::arg("name"), py::arg("ptr"), py::arg("size"), py::arg("meta") = "{}", py::arg("sync") = false,
           "Registers host memory at address ptr.")
      .def("register_device", [](PyCheckpointer& self, const std::string& name, std::uintptr_t ptr, std::size_t size,
                                 std::uintptr_t stream, const std::string& meta, bool sync) {
             self.register_region(name, ptr, size, true, sync, meta, stream);
           },
           py::arg("name"), py::arg("ptr"), py::arg("size"), py::arg("stream") = 0, py::arg("meta") = "{}",
           py::arg("sync") = false, "Registers CUDA device memory written by work on `stream` (a cudaStream_t).")
      .def("set_regions", &PyCheckpointer::set_regions, py::arg("regions"),
           "Replaces every region: a list of (name, ptr, size, device, sync, meta, stream).")
      .def("put_blob", &PyCheckpointer::put_blob, py::arg("name"), py::arg("data"), py::arg("meta") = "{}",
           "Copies a small bytes-like value now; later checkpoints save its latest value.")
      .def("restore", [](PyCheckpointer& self, bool copy, const std::vector<std::string>& reshard_prefixes,
                         const std::vector<std::tuple<std::string, std::uintptr_t, std::size_t>>& live) {
             ckpt::hooks::RestoreOptions options;
             options.copy_into_regions = copy;
             options.reshard_prefixes = reshard_prefixes;
             for (const auto& [name, ptr, size] : live) {
               ckpt::hooks::RegionSpec r;
               r.name = name;
               r.data = reinterpret_cast<void*>(ptr);
               r.size = size;
               options.live.push_back(std::move(r));
             }
             py::gil_scoped_release release;
             return take(self.get().restore(options));
           },
           py::arg("copy_into_regions") = true, py::arg("reshard_prefixes") = std::vector<std::string>{},
           py::arg("live") = std::vector<std::tuple<std::string, std::uintptr_t, std::size_t>>{},
           "Loads the newest complete checkpoint; returns its step, 0 if none. A ZeRO-1 checkpoint of another world "
           "size also yields the ranges of other shards named by reshard_prefixes. `live`: (name, address, size) of "
           "host memory this rank holds already; ranges whose bytes there match their checksums are not read.")
      .def("restored", &PyCheckpointer::restored,
           "The loaded checkpoint's regions as (name, meta_json, memoryview, address); valid until the next snapshot.")
      .def("before_update", [](PyCheckpointer& self) {
             py::gil_scoped_release release;
             check(self.get().before_update());
           }, "The guard: call before every optimizer.step().")
      .def("poll", [](PyCheckpointer& self, std::uint64_t step) {
             ckpt::hooks::Decision d;
             {
               py::gil_scoped_release release;
               d = take(self.get().poll(step));
             }
             return py::make_tuple(d.snapshot, d.stop, ckpt::store::to_string(d.kind));
           }, py::arg("step"), "What after_step(step) will do: (snapshot, stop, kind).")
      .def("after_step", [](PyCheckpointer& self, std::uint64_t step) {
             py::gil_scoped_release release;
             return take(self.get().after_step(step));
           }, py::arg("step"), "Call after each update with the number of completed updates; True: stop the loop.")
      .def("time_section", [](PyCheckpointer& self, double seconds) { self.get().time_section(seconds); },
           py::arg("seconds"), "A section of this step's own work (no collective inside) took `seconds`.")
      .def("save", [](PyCheckpointer& self, std::uint64_t step, bool terminal) {
             py::gil_scoped_release release;
             check(self.get().save(step, terminal ? ckpt::store::Kind::Terminal : ckpt::store::Kind::Periodic));
           }, py::arg("step"), py::arg("terminal") = false, "Takes a checkpoint now (collective).")
      .def("close", [](PyCheckpointer& self) {
             py::gil_scoped_release release;
             check(self.get().close());
           }, "Waits for the last persist and commit.")
      .def("abort", [](PyCheckpointer& self) {
             py::gil_scoped_release release;
             check(self.get().abort());
           }, "Closes after a training error without waiting for other ranks (after the last words, if any).")
      .def("stats", [](PyCheckpointer& self) { return stats_dict(self.get().stats()); })
      .def("last_words", [](PyCheckpointer& self) { return last_words_dict(self.get().last_words_report()); },
           "What the last words did on this rank: triggered, done, lost_peer, lost ranks, committed, step, root, "
           "times, stand_ins, behind (the decider's only). Any thread may call it.")
      .def("release_memory_copies", [](PyCheckpointer& self) { return self.get().release_memory_copies(); },
           "After the last words, once close() or abort() returned: the partner copies this rank held and its own "
           "staging's last two snapshots and their blobs, moved out of the checkpointer ([MemoryCopy]); empty "
           "without the memory tier, when no last words ran, or a second time.");
}
