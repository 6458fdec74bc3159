#include "status_page.hpp"

#include <algorithm>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "engine.hpp"

namespace ckpt::controller {

using nlohmann::json;

namespace {

constexpr std::size_t kMaxJobs = 200;        // rows of the jobs table
constexpr std::size_t kMaxTimelines = 20;    // jobs whose history is drawn
constexpr std::size_t kMaxLines = 400;       // the newest history lines of one job

// The page. @NONCE@ is replaced by a fresh nonce per answer, @DATA@ by the escaped JSON. The script builds every
// element with createElement / textContent: no text from a job is ever parsed as markup.
constexpr const char* kTemplate = R"PAGE(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'nonce-@NONCE@'; style-src 'nonce-@NONCE@'; img-src data:; base-uri 'none'; form-action 'none'">
<link rel="icon" href="data:,">
<title>ckpt-controller status</title>
<style nonce="@NONCE@">
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 24px 40px; color: #1d2327; background: #fafafa; }
h1 { font-size: 20px; margin: 18px 0 4px; }
h2 { font-size: 16px; margin: 0 0 6px; }
.sub { color: #555; margin: 0 0 12px; }
.notice { border: 1px solid #e0b000; background: #fff8e1; padding: 8px 12px; margin: 10px 0; }
.notice code, td code { background: #f0f0f0; padding: 0 3px; }
.chips span { display: inline-block; border-radius: 10px; padding: 1px 9px; margin: 0 6px 4px 0; background: #e8eaed; }
table { border-collapse: collapse; margin: 8px 0 16px; background: #fff; }
th, td { border: 1px solid #dde; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eef0f4; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.state { font-weight: 600; }
.st-running { color: #2e7d32; } .st-failing { color: #c62828; } .st-gave-up { color: #b00020; }
.st-pending, .st-requeueing, .st-relaunching { color: #6a1b9a; } .st-completed { color: #1565c0; }
section.job { background: #fff; border: 1px solid #dde; padding: 10px 14px; margin: 0 0 16px; }
svg.timeline { width: 100%; max-width: 1100px; height: auto; display: block; }
ul.recoveries { margin: 6px 0; padding-left: 18px; }
ul.recoveries svg { vertical-align: middle; margin-left: 8px; }
.legend { color: #444; font-size: 12px; margin: 4px 0 6px; }
.legend svg { vertical-align: middle; margin: 0 3px 0 10px; }
details { margin-top: 6px; } details table { font-size: 12px; }
.empty { color: #777; font-style: italic; }
</style>
</head>
<body>
<h1>ckpt-controller status</h1>
<p class="sub" id="generated"></p>
<div id="page"></div>
<script type="application/json" id="ckpt-data">@DATA@</script>
<script nonce="@NONCE@">
(function () {
  "use strict";
  var SVGNS = "http://www.w3.org/2000/svg";
  var data = JSON.parse(document.getElementById("ckpt-data").textContent);
  var page = document.getElementById("page");
  var STATE_COLOR = { running: "#43a047", failing: "#e53935", requeueing: "#8e24aa", relaunching: "#ab47bc",
    pending: "#b0bec5", completed: "#1e88e5", cancelled: "#757575", "gave-up": "#212121", gone: "#cfd8dc" };
  var PHASE_COLOR = { decision: "#ffb300", slurm: "#5e35b1", launch: "#00897b",
    agreement: "#ffb300", "last words": "#f4511e", reformation: "#5e35b1", "state load": "#3949ab",
    "first step": "#00897b" };
  var IN_PLACE_PHASES = ["agreement", "last words", "reformation", "state load", "first step"];
  var TERMINAL = { completed: 1, cancelled: 1, "gave-up": 1, gone: 1 };

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function sv(tag, attrs, text) {
    var e = document.createElementNS(SVGNS, tag);
    for (var k in attrs || {}) e.setAttribute(k, attrs[k]);
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function add(parent, child) { parent.appendChild(child); return child; }
  function titled(node, text) { add(node, sv("title", {}, text)); return node; }
  function pad(n) { return (n < 10 ? "0" : "") + n; }
  function clock(t) {
    if (!t) return "-";
    var d = new Date(t * 1000);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + pad(d.getHours()) + ":" +
      pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }
  function dur(s) {
    if (s < 60) return (s < 10 ? s.toFixed(2) : s.toFixed(1)) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }
  function swatch(color, shape) {
    var s = sv("svg", { width: 14, height: 10, viewBox: "0 0 14 10" });
    if (shape === "diamond") add(s, sv("path", { d: "M7 0 L12 5 L7 10 L2 5 Z", fill: color }));
    else if (shape === "cross") add(s, sv("path", { d: "M3 1 L11 9 M11 1 L3 9", stroke: color, "stroke-width": 2 }));
    else add(s, sv("rect", { width: 14, height: 10, fill: color }));
    return s;
  }

  // ---- what a job's history says: state intervals, failures, checkpoints and lost work, recoveries ----------
  var TRANSITION = /^([a-z-]+) -> ([a-z-]+): /;
  var TASK_EXIT = /: rank \d+ (killed by signal|exited)/;
  var DECIDED = /^([^;]+); newest complete checkpoint: (?:step (\d+)|none); lost work ([0-9.]+) s/;
  var NOT_A_FAILURE = { "clean exit": 1, "user cancel": 1 };  // the run ended; nothing was lost
  // "running again after 6.000 s (in-place): detected at 1700000000.000; agreement 0.500 s, last words ...": the
  // phases of each path, in order.
  var RECOVERY = /running again after ([0-9.]+) s \(([^)]*)\): (?:detected at [0-9.]+; )?(.*)$/;
  var PHASE = /^([a-z ]+) (-?[0-9.]+) s$/;

  // A recovery's phases as [name, from, to], the last one ending at `end`; null when a part is not a phase.
  function phasesOf(text, from, end) {
    var phases = [], at = from, ok = true;
    text.split(", ").forEach(function (part) {
      var y = PHASE.exec(part);
      if (!y) { ok = false; return; }
      phases.push([y[1], at, at + +y[2]]);
      at += +y[2];
    });
    if (!ok || !phases.length) return null;
    phases[phases.length - 1][2] = end;
    return phases;
  }

  function model(lines, job, now) {
    var m = { states: [], failures: [], checkpoints: [], recoveries: [], start: lines[0].time, end: lines[0].time };
    var state = "running", since = lines[0].time, run = lines[0].restart_count, failedAt = null, episode = null;
    lines.forEach(function (l) {
      var x, t = l.time;
      m.end = Math.max(m.end, t);
      if (l.kind === "transition" && (x = TRANSITION.exec(l.text))) {
        m.states.push({ state: state, from: since, to: t, run: run });
        state = x[2]; since = t; run = l.restart_count;
        if (state === "failing") {
          failedAt = t;
          episode = { time: t, text: l.text, first: true };
          m.failures.push(episode);
        }
      } else if (l.kind === "event" && TASK_EXIT.test(l.text)) {
        m.failures.push({ time: t, text: l.text, first: false });
      } else if (l.kind === "decision" && (x = DECIDED.exec(l.text))) {
        var failed = failedAt !== null ? failedAt : t, ended = NOT_A_FAILURE[x[1]] === 1;
        if (ended && episode) episode.ended = true;
        m.checkpoints.push({ step: x[2] === undefined ? null : +x[2], lost: +x[3], failed: failed,
          ended: ended, text: l.text });
      } else if (l.kind === "recovery" && (x = RECOVERY.exec(l.text))) {
        var total = +x[1], from = t - total, phases = phasesOf(x[3], from, t);
        if (phases) {
          m.recoveries.push({ path: x[2] || "requeue", total: total, run: l.restart_count, text: l.text,
            phases: phases });
          m.start = Math.min(m.start, from);
        }
      }
    });
    if (!TERMINAL[job.state]) m.end = Math.max(m.end, now);
    m.states.push({ state: state, from: since, to: m.end, run: run });
    m.checkpoints.forEach(function (c) { m.start = Math.min(m.start, c.failed - c.lost); });
    return m;
  }

  function tickStep(span) {
    var steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];
    for (var i = 0; i < steps.length; i++) if (span / steps[i] <= 10) return steps[i];
    return 86400 * Math.ceil(span / 86400 / 10);
  }
  function tickLabel(s) {
    if (s < 60) return "+" + s + " s";
    if (s < 3600) return "+" + Math.floor(s / 60) + " min" + (s % 60 ? " " + s % 60 + " s" : "");
    return "+" + Math.floor(s / 3600) + " h" + (s % 3600 ? " " + Math.round(s % 3600 / 60) + " min" : "");
  }

  function timeline(m, job) {
    var W = 1000, L = 150, R = 30, H = 150;
    var span = Math.max(m.end - m.start, 1);
    function x(t) { return L + (t - m.start) / span * (W - L - R); }
    function wide(a, b) { return Math.max(x(b) - x(a), 2); }
    var svg = sv("svg", { "class": "timeline", viewBox: "0 0 " + W + " " + H, role: "img",
      "aria-label": "timeline of job " + job.job_id });
    [["runs", 30], ["failures, checkpoints", 66], ["recovery phases", 102]].forEach(function (lane) {
      add(svg, sv("text", { x: 4, y: lane[1] + 4, "font-size": 12, fill: "#333" }, lane[0]));
      add(svg, sv("line", { x1: L, x2: W - R, y1: lane[1], y2: lane[1], stroke: "#eceff1", "stroke-width": 22 }));
    });
    var g = add(svg, sv("g", { "class": "runs" }));
    m.states.forEach(function (s) {
      var r = add(g, sv("rect", { x: x(s.from), y: 20, width: wide(s.from, s.to), height: 20,
        fill: STATE_COLOR[s.state] || "#999", "data-state": s.state }));
      titled(r, s.state + " (run " + s.run + "): " + clock(s.from) + ", " + dur(s.to - s.from));
      if (s.state === "running" && x(s.to) - x(s.from) > 44) {
        add(g, sv("text", { x: x(s.from) + 4, y: 34, "font-size": 11, fill: "#fff" }, "run " + s.run));
      }
    });
    var last = m.states[m.states.length - 1];
    if (TERMINAL[last.state]) add(g, sv("text", { x: Math.min(x(last.from) + 4, W - R - 60), y: 15, "font-size": 11,
      fill: "#333" }, last.state));
    g = add(svg, sv("g", { "class": "failures" }));
    m.checkpoints.forEach(function (c) {
      var from = c.failed - c.lost;
      if (!c.ended) titled(add(g, sv("rect", { x: x(from), y: 58, width: wide(from, c.failed), height: 16, fill: "#ffcdd2",
        "class": "lost-work" })), "lost work " + dur(c.lost) + (c.step === null ? " (no checkpoint)" : ""));
      if (c.step === null) return;
      var cx = x(from);
      titled(add(g, sv("path", { d: "M" + cx + " 57 L" + (cx + 7) + " 66 L" + cx + " 75 L" + (cx - 7) + " 66 Z",
        fill: "#1e88e5", "class": "checkpoint" })), "newest complete checkpoint: step " + c.step);
      add(g, sv("text", { x: cx + 9, y: 54, "font-size": 11, fill: "#1565c0" }, "step " + c.step));
    });
    m.failures.forEach(function (f) {
      var fx = x(f.time);
      if (f.ended) return;  // the run ended (a clean exit, a cancel): no failure to mark
      if (!f.first) {
        titled(add(g, sv("line", { x1: fx, x2: fx, y1: 60, y2: 72, stroke: "#e57373", "stroke-width": 1 })), f.text);
        return;
      }
      titled(add(g, sv("path", { d: "M" + (fx - 6) + " 60 L" + (fx + 6) + " 72 M" + (fx + 6) + " 60 L" + (fx - 6) +
        " 72", stroke: "#c62828", "stroke-width": 3, "class": "failure" })), clock(f.time) + " " + f.text);
    });
    g = add(svg, sv("g", { "class": "recovery" }));
    m.recoveries.forEach(function (r) {
      r.phases.forEach(function (p) {
        titled(add(g, sv("rect", { x: x(p[1]), y: 94, width: wide(p[1], p[2]), height: 16, fill: PHASE_COLOR[p[0]],
          "class": "phase phase-" + p[0] })), p[0] + " " + dur(p[2] - p[1]));
      });
      add(g, sv("text", { x: Math.min(x(r.phases[2][2]) + 4, W - R - 40), y: 124, "font-size": 11, fill: "#333" },
        dur(r.total)));
    });
    axis(svg, m.start, span, x, H);
    return svg;
  }

  function axis(svg, start, span, x, H) {
    var step = tickStep(span);
    add(svg, sv("line", { x1: x(start), x2: x(start + span), y1: H - 18, y2: H - 18, stroke: "#90a4ae" }));
    for (var s = 0; s <= span + 1e-9; s += step) {
      add(svg, sv("line", { x1: x(start + s), x2: x(start + s), y1: H - 22, y2: H - 14, stroke: "#90a4ae" }));
      var anchor = x(start + s) > x(start + span) - 30 ? "end" : "middle";
      add(svg, sv("text", { x: x(start + s), y: H - 2, "font-size": 11, fill: "#555", "text-anchor": anchor },
        s === 0 ? clock(start).slice(11) : tickLabel(s)));
    }
  }

  function legend(m) {
    var p = el("div", { "class": "legend" });
    var items = [["running", STATE_COLOR.running], ["failing", STATE_COLOR.failing],
     ["requeueing", STATE_COLOR.requeueing], ["pending", STATE_COLOR.pending], ["failure", "#c62828", "cross"],
     ["checkpoint", "#1e88e5", "diamond"], ["lost work", "#ffcdd2"], ["decision", PHASE_COLOR.decision],
     ["slurm", PHASE_COLOR.slurm], ["launch", PHASE_COLOR.launch]];
    if (m.recoveries.some(function (r) { return r.path === "in-place"; })) {
      IN_PLACE_PHASES.forEach(function (name) { items.push([name, PHASE_COLOR[name]]); });
    }
    items.forEach(function (item) {
      add(p, swatch(item[1], item[2]));
      add(p, document.createTextNode(item[0]));
    });
    return p;
  }

  function phaseBar(r) {
    var s = sv("svg", { width: 240, height: 14, viewBox: "0 0 240 14" }), at = 0, total = Math.max(r.total, 1e-6);
    r.phases.forEach(function (p) {
      var w = Math.max((p[2] - p[1]) / total * 240, 1);
      titled(add(s, sv("rect", { x: at, y: 0, width: w, height: 14, fill: PHASE_COLOR[p[0]] })),
        p[0] + " " + dur(p[2] - p[1]));
      at += w;
    });
    return s;
  }

  // "n2 0.48 (exclude)": a slow node as the jobs table names it.
  function slowText(s) { return s.node + " " + (+s.score).toFixed(2) + " (" + s.action + ")"; }
  function slowNodes(sec, slow) {
    if (!slow.length) return;
    var t = add(sec, el("table", { "class": "slow-nodes" }));
    var hr = add(t, el("tr"));
    ["slow node", "of the job's best", "action", "reported"].forEach(function (c) { add(hr, el("th", {}, c)); });
    slow.forEach(function (s) {
      var tr = add(t, el("tr", { "data-node": s.node }));
      add(tr, el("td", {}, s.node));
      add(tr, el("td", { "class": "num" }, (+s.score).toFixed(2)));
      add(tr, el("td", {}, s.action));
      add(tr, el("td", {}, clock(s.time)));
    });
  }

  function jobSection(job, lines) {
    var sec = el("section", { "class": "job", id: "job-" + job.job_id, "data-job": job.job_id });
    var h = add(sec, el("h2", {}, "Job " + job.job_id + " "));
    add(h, el("span", { "class": "state st-" + job.state }, job.state));
    if (job.reason) add(sec, el("p", { "class": "sub" }, job.reason));
    slowNodes(sec, job.slow_nodes || []);
    if (lines && lines.error) { add(sec, el("p", { "class": "empty" }, "history: " + lines.error)); return sec; }
    if (!lines || !lines.length) { add(sec, el("p", { "class": "empty" }, "no history")); return sec; }
    var m = model(lines, job, data.generated);
    add(sec, timeline(m, job));
    add(sec, legend(m));
    var ul = add(sec, el("ul", { "class": "recoveries" }));
    m.recoveries.forEach(function (r, i) {
      var li = add(ul, el("li", { "class": "recovery", "data-seconds": r.total.toFixed(3) },
        "recovery " + (i + 1) + " (" + r.path + "): " +
        (r.path === "in-place" ? "went on in place in run " : "running again as run ") + r.run + " after " +
        dur(r.total) +
        " = " + r.phases.map(function (p) { return p[0] + " " + dur(p[2] - p[1]); }).join(" + ")));
      add(li, phaseBar(r));
    });
    if (!m.recoveries.length) add(ul, el("li", { "class": "empty" }, "no recovery"));
    var det = add(sec, el("details"));
    add(det, el("summary", {}, "history (" + lines.length + " lines)"));
    var t = add(det, el("table"));
    lines.forEach(function (l) {
      var tr = add(t, el("tr", { "data-kind": l.kind }));
      add(tr, el("td", {}, clock(l.time)));
      add(tr, el("td", { "class": "num" }, "run " + l.restart_count));
      add(tr, el("td", {}, l.kind));
      add(tr, el("td", {}, l.text));
    });
    return sec;
  }

  function header() {
    var s = data.status || {};
    var who = data.viewer.uid === null ? "anonymous reader" :
      "uid " + data.viewer.uid + (data.viewer.all ? " (sees every job)" : " (sees own jobs)");
    document.getElementById("generated").textContent = "generated " + clock(data.generated) + " for " + who +
      (s.backend ? "; backend " + s.backend + ", up " + dur(s.uptime_s || 0) : "");
    if (data.viewer.uid === null) {
      var n = add(page, el("div", { "class": "notice", id: "anonymous" }));
      add(n, document.createTextNode("Shown without a MUNGE credential: job counts only. To see your jobs, save " +
        "the page as yourself and open the file: "));
      add(n, el("code", {}, "ckpt-controller page -o status.html"));
    }
    var chips = add(page, el("p", { "class": "chips", id: "counts" }));
    var counts = s.jobs || {};
    Object.keys(counts).sort().forEach(function (k) { add(chips, el("span", {}, counts[k] + " " + k)); });
    if (!Object.keys(counts).length) add(chips, el("span", {}, "no jobs tracked"));
    if (s.excluded_nodes && s.excluded_nodes.length) {
      add(page, el("h2", {}, "Excluded nodes"));
      var t = add(page, el("table", { id: "excluded" }));
      s.excluded_nodes.forEach(function (b) {
        var tr = add(t, el("tr"));
        add(tr, el("td", {}, b.node)); add(tr, el("td", {}, "jobs " + b.jobs.join(",")));
        add(tr, el("td", {}, "until " + clock(b.expires))); add(tr, el("td", {}, b.reason));
      });
    }
  }

  function jobsTable() {
    add(page, el("h2", {}, "Jobs" + (data.jobs_total > data.jobs.length ? " (the " + data.jobs.length +
      " most recently updated of " + data.jobs_total + ")" : "")));
    if (!data.jobs.length) { add(page, el("p", { "class": "empty", id: "no-jobs" }, "no job to show")); return; }
    var t = add(page, el("table", { id: "jobs" }));
    var hr = add(t, el("tr"));
    ["job", "state", "run", "restarts", "budget (no progress / max)", "progress step", "ending", "excluded nodes",
     "slow nodes", "reason", "updated"].forEach(function (c) { add(hr, el("th", {}, c)); });
    data.jobs.forEach(function (j) {
      var tr = add(t, el("tr", { "data-job": j.job_id }));
      var a = add(add(tr, el("td")), el("a", { href: "#job-" + j.job_id }, j.job_id));
      a.setAttribute("title", "timeline of job " + j.job_id);
      add(tr, el("td", { "class": "state st-" + j.state }, j.state));
      add(tr, el("td", { "class": "num" }, j.restart_count));
      add(tr, el("td", { "class": "num" }, j.restarts));
      add(tr, el("td", { "class": "num budget" }, j.restarts_without_progress + " / " + j.max_restarts));
      add(tr, el("td", { "class": "num" }, j.progress_step === null ? "-" : j.progress_step));
      add(tr, el("td", {}, j.ending || "-"));
      add(tr, el("td", {}, (j.excluded_nodes || []).join(",") || "-"));
      add(tr, el("td", { "class": "slow" }, (j.slow_nodes || []).map(slowText).join(", ") || "-"));
      add(tr, el("td", {}, j.reason || ""));
      add(tr, el("td", {}, clock(j.updated)));
    });
  }

  header();
  jobsTable();
  data.jobs.forEach(function (j) {
    var lines = data.histories[String(j.job_id)];
    if (lines !== undefined) add(page, jobSection(j, lines));
  });
  document.body.setAttribute("data-rendered", "ok");
})();
</script>
</body>
</html>
)PAGE";

std::string nonce() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) std::snprintf(buf + 8 * i, 9, "%08x", static_cast<unsigned>(rd()));
  return std::string(buf, 32);
}

// JSON that cannot end the <script> element it is embedded in nor start markup: '<', '>' and '&' only ever occur
// inside JSON strings, where \u003c and friends mean the same.
std::string script_safe(const json& j) {
  const std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(text.size() + 64);
  for (char c : text) {
    if (c == '<') out += "\\u003c";
    else if (c == '>') out += "\\u003e";
    else if (c == '&') out += "\\u0026";
    else out += c;
  }
  return out;
}

void replace_all(std::string& s, const std::string& what, const std::string& with) {
  for (std::size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + with.size())) {
    s.replace(at, what.size(), with);
  }
}

// The newest kMaxLines of a job's history, or {"error": ...}.
json history_of(Engine& engine, std::uint32_t job_id, const ckpt::recovery::ReadAccess& access) {
  auto lines = engine.history_json(job_id, access);
  if (!lines) return json{{"error", lines.error()}};
  if (!*lines) return json::array();
  json all = std::move(**lines);
  if (all.size() <= kMaxLines) return all;
  json tail = json::array();
  for (std::size_t i = all.size() - kMaxLines; i < all.size(); ++i) tail.push_back(std::move(all[i]));
  return tail;
}

}  // namespace

std::optional<std::string> render_status_page(Engine& engine, const ckpt::recovery::ReadAccess& access, double now,
                                              std::optional<std::uint32_t> job) {
  json jobs = json::array();
  if (job) {
    auto one = engine.job_json(*job, now, access);
    if (!one) return std::nullopt;
    jobs.push_back((*one)["summary"]);
  } else {
    jobs = engine.jobs_json(now, access);
    std::stable_sort(jobs.begin(), jobs.end(), [](const json& a, const json& b) {
      return a.value("updated", 0.0) > b.value("updated", 0.0);
    });
  }
  const std::size_t total = jobs.size();
  if (jobs.size() > kMaxJobs) jobs.erase(jobs.begin() + static_cast<std::ptrdiff_t>(kMaxJobs), jobs.end());
  json histories = json::object();
  for (std::size_t i = 0; i < jobs.size() && i < kMaxTimelines; ++i) {
    const auto id = jobs[i]["job_id"].get<std::uint32_t>();
    histories[std::to_string(id)] = history_of(engine, id, access);
  }
  json data = {{"generated", now},
               {"viewer", {{"uid", access.uid ? json(*access.uid) : json(nullptr)}, {"all", access.all}}},
               {"status", engine.status_json(now, access)},
               {"jobs", std::move(jobs)},
               {"jobs_total", total},
               {"histories", std::move(histories)}};
  std::string html = kTemplate;
  replace_all(html, "@NONCE@", nonce());
  replace_all(html, "@DATA@", script_safe(data));
  return html;
}

}  // namespace ckpt::controller
