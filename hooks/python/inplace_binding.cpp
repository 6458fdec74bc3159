// slurm_ckpt._native.inplace: restart in place's decisions and records (ckpt/inplace.hpp) for slurm_ckpt.restart,
// which keeps only the effects. Records that do not parse read as None; writes that fail raise Error.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "ckpt/env_contract.hpp"
#include "ckpt/format.hpp"
#include "ckpt/inplace.hpp"

namespace py = pybind11;
namespace ip = ckpt::inplace;

namespace {

PyObject* g_error = PyExc_RuntimeError;  // slurm_ckpt.Error, once bind_inplace ran

[[noreturn]] void raise(const std::string& message) {
  PyErr_SetString(g_error, message.c_str());
  throw py::error_already_set();
}

void check(const ckpt::Status& s) {
  if (!s) raise(s.error());
}

template <class T>
T take(ckpt::Result<T> r) {
  if (!r) raise(r.error());
  return std::move(r).value();
}

// A record type's to_json, and parse as a static method that returns None for what a reader would refuse.
template <class T, class Class>
void json_methods(Class& c, ckpt::Result<T> (*parse)(std::string_view)) {
  c.def("to_json", [](const T& self) { return ip::to_json(self); });
  c.def_static("parse", [parse](const std::string& text) -> std::optional<T> {
    auto r = parse(text);
    if (!r) return std::nullopt;
    return std::move(r).value();
  }, py::arg("text"));
}

// CKPT_SHRINK's value as the core reads it; ValueError naming the variable when it is not one.
ip::Shrink shrink_of(const std::string& text) {
  auto policy = ip::parse_shrink(text);
  if (!policy) {
    throw py::value_error("ckpt: " + ckpt::env::name_of("shrink") + "=" + ckpt::printable(text.substr(0, 100)) + ": " +
                          policy.error());
  }
  return *policy;
}

// A Checkpointer config's layout dict ({"dp", "tp", "pp", "zero1"}) as the core's.
ckpt::store::Layout layout_of(const py::dict& layout) {
  ckpt::store::Layout l;
  l.dp = layout["dp"].cast<int>();
  l.tp = layout["tp"].cast<int>();
  l.pp = layout["pp"].cast<int>();
  l.zero1 = layout["zero1"].cast<bool>();
  return l;
}

}  // namespace

void bind_inplace(py::module& parent) {
  py::module m = parent.def_submodule("inplace", "restart in place: decisions and records (ckpt/inplace.hpp)");
  g_error = parent.attr("Error").ptr();  // registered by the module, which outlives this
  m.attr("EXIT_PEER_LOST") = ip::kExitPeerLost;

  py::enum_<ip::State>(m, "State")
      .value("WAITING", ip::State::Waiting).value("FORMING", ip::State::Forming)
      .value("TRAINING", ip::State::Training).value("RECOVERING", ip::State::Recovering)
      .value("FINISHED", ip::State::Finished).value("LEFT", ip::State::Left);
  py::enum_<ip::Event>(m, "Event")
      .value("CLAIMED", ip::Event::Claimed).value("UNNEEDED", ip::Event::Unneeded)
      .value("FORMED", ip::Event::Formed).value("JOIN_FAILED", ip::Event::JoinFailed)
      .value("RETURNED", ip::Event::Returned).value("PEER_LOST", ip::Event::PeerLost)
      .value("PLANNED", ip::Event::Planned).value("FAILED", ip::Event::Failed)
      .value("HANDED_OVER", ip::Event::HandedOver);
  py::enum_<ip::AfterTrain>(m, "AfterTrain")
      .value("RETURN", ip::AfterTrain::Return).value("RAISE", ip::AfterTrain::Raise)
      .value("ROLL_CALL", ip::AfterTrain::RollCall).value("RECOVER", ip::AfterTrain::Recover)
      .value("LEAVE", ip::AfterTrain::Leave);
  py::enum_<ip::AfterJoinFailure>(m, "AfterJoinFailure")
      .value("RAISE", ip::AfterJoinFailure::Raise).value("HAND_OVER", ip::AfterJoinFailure::HandOver)
      .value("RECOVER", ip::AfterJoinFailure::Recover);
  py::enum_<ip::Verdict>(m, "Verdict")
      .value("GO", ip::Verdict::Go).value("NO_PLAN", ip::Verdict::NoPlan)
      .value("ABANDONED", ip::Verdict::Abandoned).value("COUNTED_LOST", ip::Verdict::CountedLost);

  py::class_<ip::Machine>(m, "Machine", "One process's state and generation; on() follows the public table.")
      .def(py::init<ip::State, std::uint32_t>(), py::arg("state"), py::arg("generation") = 0)
      .def_property_readonly("state", &ip::Machine::state)
      .def_property_readonly("generation", &ip::Machine::generation)
      .def("on", [](ip::Machine& self, ip::Event e, std::optional<std::uint32_t> claimed) { check(self.on(e, claimed)); },
           py::arg("event"), py::arg("claimed_generation") = py::none(),
           "Applies the event; raises Error for a transition the table does not have.");

  py::class_<ip::Failure>(m, "Failure")
      .def(py::init<>())
      .def_readwrite("lost", &ip::Failure::lost).def_readwrite("root", &ip::Failure::root)
      .def_readwrite("step", &ip::Failure::step).def_readwrite("detect_unix", &ip::Failure::detect_unix)
      .def_readwrite("decided_unix", &ip::Failure::decided_unix).def_readwrite("done_unix", &ip::Failure::done_unix)
      .def_readwrite("stand_ins", &ip::Failure::stand_ins).def_readwrite("behind", &ip::Failure::behind);

  auto plan = py::class_<ip::Plan>(m, "Plan");
  plan.def(py::init<>())
      .def_readwrite("generation", &ip::Plan::generation).def_readwrite("world", &ip::Plan::world)
      .def_readwrite("addr", &ip::Plan::addr).def_readwrite("port", &ip::Plan::port)
      .def_readwrite("root", &ip::Plan::root).def_readwrite("lost", &ip::Plan::lost)
      .def_readwrite("step", &ip::Plan::step).def_readwrite("takeover", &ip::Plan::takeover)
      .def_readwrite("detect_unix", &ip::Plan::detect_unix).def_readwrite("written_unix", &ip::Plan::written_unix)
      .def_readwrite("abandon", &ip::Plan::abandon).def_readwrite("world_before", &ip::Plan::world_before)
      .def_readwrite("copies", &ip::Plan::copies).def_readwrite("behind", &ip::Plan::behind)
      .def_property_readonly("abandons", &ip::Plan::abandons).def_property_readonly("shrinks", &ip::Plan::shrinks);
  json_methods<ip::Plan>(plan, &ip::parse_plan);

  auto phases = py::class_<ip::Phases>(m, "Phases");
  phases.def(py::init<>())
      .def_readwrite("generation", &ip::Phases::generation).def_readwrite("detect", &ip::Phases::detect)
      .def_readwrite("decided", &ip::Phases::decided).def_readwrite("last_words_done", &ip::Phases::last_words_done)
      .def_readwrite("plan", &ip::Phases::plan).def_readwrite("group", &ip::Phases::group)
      .def_readwrite("restored", &ip::Phases::restored).def_readwrite("first_step", &ip::Phases::first_step)
      .def_readwrite("step", &ip::Phases::step).def_readwrite("lost", &ip::Phases::lost);
  json_methods<ip::Phases>(phases, &ip::parse_phases);

  auto claim = py::class_<ip::Claim>(m, "Claim");
  claim.def(py::init<>())
      .def_readwrite("generation", &ip::Claim::generation).def_readwrite("rank", &ip::Claim::rank);
  json_methods<ip::Claim>(claim, &ip::parse_claim);

  py::class_<ip::SpareMailbox>(m, "SpareMailbox")
      .def(py::init<>())
      .def_readwrite("addr", &ip::SpareMailbox::addr).def_readwrite("port", &ip::SpareMailbox::port)
      .def_readwrite("token", &ip::SpareMailbox::token);
  auto spare = py::class_<ip::Spare>(m, "Spare");
  spare.def(py::init<>())
      .def_readwrite("node", &ip::Spare::node).def_readwrite("local", &ip::Spare::local)
      .def_readwrite("pid", &ip::Spare::pid).def_readwrite("ready_unix", &ip::Spare::ready_unix)
      .def_readwrite("mailbox", &ip::Spare::mailbox)
      .def_property_readonly("slot", &ip::Spare::slot);
  json_methods<ip::Spare>(spare, &ip::parse_spare);

  auto mailbox = py::class_<ip::Mailbox>(m, "Mailbox");
  mailbox.def(py::init<>())
      .def_readwrite("rank", &ip::Mailbox::rank).def_readwrite("generation", &ip::Mailbox::generation)
      .def_readwrite("addr", &ip::Mailbox::addr).def_readwrite("port", &ip::Mailbox::port)
      .def_readwrite("pid", &ip::Mailbox::pid);
  json_methods<ip::Mailbox>(mailbox, &ip::parse_mailbox);

  py::class_<ip::Role>(m, "Role")
      .def_readonly("root", &ip::Role::root).def_readonly("writes_plan", &ip::Role::writes_plan)
      .def_readonly("lost", &ip::Role::lost).def_readonly("sources", &ip::Role::sources)
      .def_readonly("children", &ip::Role::children);

  // `finished` is asked (a file read on the shared dir) only where core says it can change the answer.
  m.def("after_train", [](std::uint32_t generation, bool raised, bool mesh_failed, bool lost_peer, bool counted_dead,
                          const py::object& finished) {
    ip::TrainOutcome outcome{raised, mesh_failed, lost_peer, counted_dead, false};
    if (ip::finished_matters(outcome) && !finished.is_none()) outcome.finished = finished().cast<bool>();
    return ip::after_train(generation, outcome);
  }, py::arg("generation"), py::arg("raised"), py::arg("mesh_failed"), py::arg("lost_peer"), py::arg("counted_dead"),
        py::arg("finished") = py::none(),
        "What run() does after train(); `finished` is a callable (rank 0 marked training finished), or None.");
  py::class_<ip::Donor>(m, "Donor", "Who sends a replacement its state (ckpt/inplace.hpp).")
      .def_readonly("rank", &ip::Donor::rank)
      .def_readonly("partner_copy", &ip::Donor::partner_copy);
  m.def("state_donors", [](const ip::Plan& p, const py::dict& layout) {
    return ip::state_donors(p, layout_of(layout));
  }, py::arg("plan"), py::arg("layout"),
        "Replacement rank -> the survivor that hands it its state (a Checkpointer config's layout dict).");
  m.def("training_stuck", [](bool last_words_done, bool returned, double cpu_idle_s) {
    return ip::training_stuck(ip::TrainingThread{last_words_done, returned, cpu_idle_s});
  }, py::arg("last_words_done"), py::arg("returned"), py::arg("cpu_idle_s"));
  m.attr("STUCK_IDLE_S") = ip::kStuckIdleS;
  m.def("after_join_failure", &ip::after_join_failure, py::arg("generation"), py::arg("missing"));
  m.attr("WATCH_PERIOD_S") = ip::kWatchPeriodMs / 1000.0;
  m.def("gone_for_good", &ip::gone_for_good, py::arg("absent"), py::arg("refused"));
  m.def("roll_call_settled", &ip::roll_call_settled, py::arg("absent"), py::arg("refused"));
  m.def("join_failure", &ip::join_failure, py::arg("plan"), py::arg("missing"), py::arg("now_unix"));
  m.def("recovery_role", &ip::recovery_role, py::arg("world"), py::arg("failure"), py::arg("rank"),
        py::arg("plan_exists"), py::arg("group_size") = ckpt::overlay::kGroupSize);
  m.def("plan_generation", [](std::uint32_t generation, int world, int root, const ip::Failure& failure,
                              const std::vector<std::string>& free_spares, const std::string& shrink,
                              const std::optional<py::dict>& layout) {
    std::optional<ckpt::store::Layout> l;
    if (layout) l = layout_of(*layout);
    return ip::plan_generation(generation, world, root, failure, free_spares, shrink_of(shrink), l);
  }, py::arg("generation"), py::arg("world"), py::arg("root"), py::arg("failure"), py::arg("free_spares"),
        py::arg("shrink") = "off", py::arg("layout") = std::nullopt,
        "The root's plan; `shrink` as CKPT_SHRINK spells it, `layout` a Checkpointer config's layout dict.");
  m.def("rank_after", &ip::rank_after, py::arg("plan"), py::arg("rank"));
  m.def("check_shrink", [](const std::string& shrink) { (void)shrink_of(shrink); }, py::arg("shrink"),
        "Raises ValueError naming the variable when CKPT_SHRINK's value is not one.");
  m.def("verdict", &ip::verdict, py::arg("plan"), py::arg("rank"));

  // The GIL is released around file system calls: a slow shared file system holds up only the caller.
  using gil = py::call_guard<py::gil_scoped_release>;
  m.def("records_dir", &ip::records_dir, py::arg("ckpt_dir"), py::arg("id"));
  py::class_<ip::Records>(m, "Records", "The run's dir (.control/inplace-<id>/), created 0700.")
      .def(py::init([](const std::string& dir) { return take(ip::Records::open(dir)); }), py::arg("dir"))
      .def_property_readonly("dir", &ip::Records::dir)
      .def("write_plan", [](ip::Records& r, const ip::Plan& p, const std::vector<std::pair<std::string, int>>& claims) {
        ckpt::Result<ip::Plan> written = ckpt::Error{""};
        {
          py::gil_scoped_release release;
          written = r.write_plan(p, claims);
        }
        return take(std::move(written));
      }, py::arg("plan"), py::arg("claims") = std::vector<std::pair<std::string, int>>{})
      .def("read_plan", &ip::Records::read_plan, py::arg("generation"), gil())
      .def("has_plan", &ip::Records::has_plan, py::arg("generation"), gil())
      .def("write_phases", [](ip::Records& r, const ip::Phases& p) { check(r.write_phases(p)); }, py::arg("phases"))
      .def("read_phases", &ip::Records::read_phases, py::arg("generation"), gil())
      .def("write_spare", [](ip::Records& r, const ip::Spare& s) { check(r.write_spare(s)); }, py::arg("spare"))
      .def("read_spare", &ip::Records::read_spare, py::arg("slot"), gil())
      .def("read_claim", &ip::Records::read_claim, py::arg("slot"), gil())
      .def("free_spares", &ip::Records::free_spares, gil())
      .def("publish_mailbox", [](ip::Records& r, const ip::Mailbox& mb) { check(r.publish_mailbox(mb)); },
           py::arg("mailbox"))
      .def("read_mailbox", &ip::Records::read_mailbox, py::arg("rank"), gil())
      .def("mark", [](ip::Records& r, const std::string& marker, const std::string& why,
                      const std::vector<int>& lost) { check(r.mark(marker, why, lost)); },
           py::arg("marker"), py::arg("why") = "", py::arg("lost") = std::vector<int>{})
      .def("marked", &ip::Records::marked, py::arg("marker"), gil())
      .def("secret", [](const ip::Records& r) {
        auto s = take(r.secret());
        return py::bytes(reinterpret_cast<const char*>(s.data()), s.size());
      });
}
