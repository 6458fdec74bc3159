// ckpt-mangen: writes slurm-ckpt's man pages (roff) from the tables the programs themselves use, so that a page
// cannot drift from its program:
//   ckpt(1)             the CLI11 definitions of the ckpt commands (cli/commands.hpp), walked in process
//   ckpt-controller(8)  `ckpt-controller --help-all` (its CLI11 definitions, as the program prints them) and the
//                       config keys parse_controller_config accepts (with their meaning from kControllerKeys)
//   ckpt-run(1)         ckpt-run's option table (ckpt-run/run_options.hpp)
//   spank_ckpt(8)       core's option table, site key table, built-in defaults and exported variables
//
//   ckpt-mangen PAGE [HELP_FILE] > PAGE    (PAGE: ckpt.1, ckpt-run.1, ckpt-controller.8 or spank_ckpt.8)
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ckpt/memtier.hpp"
#include "ckpt/options.hpp"
#include "ckpt/recovery.hpp"
#include "ckpt/site_keys.hpp"
#include "commands.hpp"
#include "roff.hpp"
#include "run_options.hpp"

namespace {

using ckpt::man::bold;
using ckpt::man::italic;
using ckpt::man::Page;
using ckpt::man::roff_name;

// One command's interface, from CLI11 in process or from CLI11's help text.
struct Opt {
  std::string names;  // "-c,--config" or "DIR"
  std::string arg;    // "TEXT", "DUR", "" for a flag
  std::string desc;
  bool required = false;
  bool positional = false;
};
struct Cmd {
  std::string name;
  std::string desc;
  std::vector<Opt> opts;
  std::vector<Cmd> subs;
};

bool is_help(const std::string& names) { return names == "-h,--help" || names == "--help-all"; }

Cmd from_app(const CLI::App& app) {
  Cmd cmd{app.get_name(), app.get_description(), {}, {}};
  for (const CLI::Option* o : app.get_options()) {
    Opt opt;
    opt.positional = o->get_lnames().empty() && o->get_snames().empty();
    opt.names = opt.positional ? o->get_name(true) : o->get_name(false, true);
    if (opt.names.empty() || is_help(opt.names)) continue;
    opt.arg = o->get_items_expected_min() == 0 ? "" : o->get_type_name();
    opt.desc = o->get_description();
    opt.required = o->get_required();
    cmd.opts.push_back(opt);
  }
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    cmd.subs.push_back(from_app(*sub));
  }
  return cmd;
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(' ');
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(' ') - b + 1);
}
std::size_t indent_of(const std::string& s) {
  auto b = s.find_first_not_of(' ');
  return b == std::string::npos ? 0 : b;
}

// One entry line of CLI11's help ("  -c,--config TEXT            config file"): names, type and description.
Opt parse_help_entry(const std::string& line, bool positional) {
  Opt opt;
  opt.positional = positional;
  std::string body = trim(line);
  auto gap = body.find("  ");
  std::string head = gap == std::string::npos ? body : body.substr(0, gap);
  opt.desc = gap == std::string::npos ? "" : trim(body.substr(gap));
  std::istringstream words(head);
  words >> opt.names;
  std::string word;
  while (words >> word) {
    if (word == "REQUIRED") {
      opt.required = true;
    } else {
      opt.arg = word;
    }
  }
  return opt;
}

// CLI11's --help-all: the app's description, "Options:" and "Subcommands:", each subcommand's name at column 0,
// its description and its own "Options:" and "Positionals:" indented.
Cmd from_help(const std::string& text, const std::string& name) {
  Cmd app{name, "", {}, {}};
  std::istringstream in(text);
  std::string line;
  std::getline(in, app.desc);
  enum { None, Options, Subcommands } section = None;
  Cmd* sub = nullptr;
  bool positional = false;
  Opt* last = nullptr;
  while (std::getline(in, line)) {
    if (trim(line).empty()) continue;
    const std::size_t indent = indent_of(line);
    const std::string t = trim(line);
    if (indent == 0 && t == "Options:") {
      section = Options;
    } else if (indent == 0 && t == "Subcommands:") {
      section = Subcommands;
    } else if (indent == 0 && t.rfind("Usage:", 0) == 0) {
      continue;
    } else if (section == Options && indent == 2) {
      app.opts.push_back(parse_help_entry(line, false));
      last = &app.opts.back();
    } else if (section == Subcommands && indent == 0) {
      app.subs.push_back(Cmd{t, "", {}, {}});
      sub = &app.subs.back();
      last = nullptr;
    } else if (section == Subcommands && sub != nullptr && indent == 2) {
      if (t == "Options:" || t == "Positionals:") {
        positional = t == "Positionals:";
      } else {
        sub->desc += (sub->desc.empty() ? "" : " ") + t;
      }
    } else if (section == Subcommands && sub != nullptr && indent == 4) {
      sub->opts.push_back(parse_help_entry(line, positional));
      last = &sub->opts.back();
    } else if (last != nullptr && indent > 4) {
      last->desc += (last->desc.empty() ? "" : " ") + t;  // a description CLI11 put on its own line
    }
  }
  std::vector<Opt> kept;
  for (const auto& o : app.opts) {
    if (!is_help(o.names)) kept.push_back(o);
  }
  app.opts = kept;
  return app;
}

// "-c,--config" -> "\fB\-c\fR, \fB\-\-config\fR \fITEXT\fR"
std::string option_tag(const Opt& o) {
  if (o.positional) return italic(o.names);
  std::string tag;
  std::istringstream names(o.names);
  std::string n;
  while (std::getline(names, n, ',')) tag += (tag.empty() ? "" : ", ") + bold(n);
  if (!o.arg.empty()) tag += " " + italic(o.arg);
  return tag;
}

// A command's words in bold, joined by unpaddable spaces: a synopsis longer than the line is filled, and filling
// would stretch a plain space inside the name ("ckpt  simulate").
std::string command_name(const std::string& prefix) {
  std::istringstream words(prefix);
  std::string word, out;
  while (words >> word) out += (out.empty() ? "" : "\\ ") + roff_name(word);
  return "\\fB" + out + "\\fR";
}

// The synopsis of one command: "\fBckpt\ gc\fR [\fB\-\-dry\-run\fR] \fIDIR\fR ..."
std::string synopsis(const std::string& prefix, const Cmd& cmd) {
  std::string line = command_name(prefix);
  for (const auto& o : cmd.opts) {
    std::string first = o.names.substr(0, o.names.find(','));
    std::string one = o.positional ? italic(o.names) : bold(first) + (o.arg.empty() ? "" : " " + italic(o.arg));
    line += " " + (o.required ? one : "[" + one + "]");
  }
  return line;
}

void write_commands(Page& page, const std::string& prog, const Cmd& app) {
  for (const auto& sub : app.subs) {
    page.item(synopsis(prog + " " + sub.name, sub), sub.desc + ".");
    if (sub.opts.empty()) continue;
    page.raw(".RS");
    for (const auto& o : sub.opts) page.item(option_tag(o), o.desc);
    page.raw(".RE");
  }
}

std::string strip_program(const std::string& desc, const std::string& prog) {
  return desc.rfind(prog + ": ", 0) == 0 ? desc.substr(prog.size() + 2) : desc;
}

void name_section(Page& page, const std::string& prog, const std::string& what) {
  page.section("NAME");
  page.raw(roff_name(prog) + " \\- " + ckpt::man::roff_text(what));
}

void durations_paragraph(Page& page) {
  page.paragraph("A DURATION is a number with a unit: 90s, 15m, 2h, 1h30m, 3d; one fraction in any unit and "
                 "milliseconds are accepted where a command says so (1.8h, 1.5m, 0.25s, 120ms).");
}

// ---- ckpt(1) ----------------------------------------------------------------------------------------------------
std::string page_ckpt() {
  CLI::App app{kCkptAbout, "ckpt"};
  int exit_code = 0;
  add_store_commands(app, exit_code);
  add_interval_commands(app, exit_code);
  add_export_commands(app, exit_code);
  const Cmd cmd = from_app(app);
  Page page("CKPT", 1, CKPT_VERSION);
  name_section(page, "ckpt", strip_program(cmd.desc, "ckpt"));
  page.section("SYNOPSIS");
  page.raw(bold("ckpt") + " " + italic("COMMAND") + " [" + italic("OPTIONS") + "]");
  page.section("DESCRIPTION");
  page.paragraph("ckpt inspects and maintains the checkpoint dirs that slurm-ckpt's hooks write (the CKPT_DIR of "
                 "a job), and answers questions about checkpoint intervals. It reads a checkpoint dir the way a "
                 "restarting job does: the checkpoint it names is the one a restart would resume from.");
  page.section("COMMANDS");
  write_commands(page, "ckpt", cmd);
  page.section("DURATIONS");
  durations_paragraph(page);
  page.section("EXIT STATUS");
  page.item("0", "Success.");
  page.item("1", "A negative answer: the checkpoint did not verify, there is no checkpoint to resume from.");
  page.item("2", "The question could not be asked: a bad option, an unreadable dir.");
  page.section("EXAMPLES");
  page.example("ckpt ls /scratch/alice/ckpt/4242\nckpt verify /scratch/alice/ckpt/4242 --step 3000\n"
               "ckpt gc /scratch/alice/ckpt/4242 --keep 2 --dry-run\n"
               "ckpt interval --cost 30s --mtbf 6h --restart 2m");
  page.section("SEE ALSO");
  page.raw(".BR spank_ckpt (8),\n.BR ckpt\\-controller (8),\n.BR ckpt\\-run (1)");
  return page.str();
}

// ---- ckpt-controller(8) -----------------------------------------------------------------------------------------
struct KeyDoc {
  const char* key;
  const char* arg;
  const char* meaning;
};
// What each config key means. Which keys exist is parse_controller_config's answer, not this table's: a key it
// rejects is left out of the page, and the man page test fails for a key it accepts that has no line here.
constexpr KeyDoc kControllerKeys[] = {
    {"listen", "HOST:PORT|off",
     "Where events (from the plugin and ckpt-run), client commands and /metrics arrive (default 127.0.0.1:6830). "
     "off: only the spool_dir"},
    {"spool_dir", "DIR", "Also take events dropped as files in this dir"},
    {"database", "FILE", "The SQLite database of jobs, requeues and history (default /var/lib/slurm-ckpt/controller.db)"},
    {"backend", "libslurm|rest", "How Slurm is reached: libslurm (a host with slurm.conf; the default) or slurmrestd"},
    {"rest_url", "URL", "slurmrestd's base URL, for backend = rest"},
    {"rest_user", "USER", "The user slurmrestd acts as (X-SLURM-USER-NAME), for backend = rest (default root)"},
    {"rest_token_file", "FILE", "File holding the JWT for slurmrestd (mode 0600); else $SLURM_JWT"},
    {"munge_socket", "FILE", "The cluster's MUNGE socket, when it is not libmunge's default"},
    {"max_restarts", "N", "Restarts without checkpoint progress for a job that gives no --ckpt-max-restarts (default 3)"},
    {"bad_node_ttl", "DURATION",
     "How long a node that failed a job, or that the job reported slow (action exclude), stays excluded from it "
     "(default 1h)"},
    {"drain_bad_nodes", "yes|no",
     "Also drain excluded nodes through Slurm (default no; undo with ckpt-controller forget-node NODE)"},
    {"down_dead_nodes", "yes|no",
     "Mark a node whose slurmd refuses connections DOWN at once, instead of after SlurmdTimeout (default yes)"},
    {"settle", "DURATION", "Collect the ranks' reports this long after the first failure before probing the silent "
                           "nodes (default 500ms)"},
    {"probe_timeout", "DURATION", "Timeout of the TCP probe of a silent node's slurmd (default 1s)"},
    {"slurmd_rpc_timeout", "DURATION", "Timeout of one RPC to a silent node's slurmd whose port accepted"},
    {"hung_after", "DURATION", "A node whose slurmd answered no RPC for this long hangs (0s: no RPC check)"},
    {"down_hung_nodes", "yes|no", "Mark a hung node DOWN at once (default no: only exclude it from the job; a user who floods a slurmd can make its RPCs time out)"},
    {"reconcile_interval", "DURATION",
     "How often the controller compares its jobs with Slurm's, catching what no plugin could report (default 2s)"},
    {"completing_timeout", "DURATION", "Longest wait for a requeued job to leave COMPLETING (default 2m)"},
    {"webhook_url", "URL", "Alerts: a JSON POST on give-up, on bad-node exclusion and on a slow-node report"},
    {"webhook_timeout", "DURATION", "Timeout of one alert POST (default 5s)"},
    {"admin_users", "USER[,USER...]",
     "Who may release jobs and forget nodes, and read every job (default root; root and SlurmUser always may). "
     "Anyone else sees only their own jobs"},
    {"slurm_user", "USER", "Events from this user are trusted like root's (default: SlurmUser, asked from Slurm)"},
    {"log_level", "error|warning|info|debug",
     "What the controller logs to stderr (default info; warn is read as warning)"},
    {"history_max_rows", "N", "History lines kept per job, the oldest dropped first (default 1000)"},
    {"history_max_age", "DURATION",
     "History lines and records of finished jobs older than this are dropped (default 30d, at least 1h)"},
};

bool controller_accepts(const std::string& key) {
  auto r = ckpt::recovery::parse_controller_config(key + " = x\n");
  return r || r.error().find("unknown key") == std::string::npos;
}

std::string page_controller(const std::string& help) {
  const Cmd cmd = from_help(help, "ckpt-controller");
  Page page("CKPT-CONTROLLER", 8, CKPT_VERSION);
  name_section(page, "ckpt-controller", strip_program(cmd.desc, "ckpt-controller"));
  page.section("SYNOPSIS");
  page.raw(bold("ckpt-controller") + " [" + bold("-c") + " " + italic("FILE") + "] [" + bold("run") + "]");
  page.raw(".br");
  page.raw(bold("ckpt-controller") + " [" + bold("-c") + " " + italic("FILE") + "] [" + bold("--url") + " " +
           italic("URL") + "] " + italic("COMMAND") + " [" + italic("ARGS") + "]");
  page.section("DESCRIPTION");
  page.paragraph("ckpt-controller is slurm-ckpt's job-level recovery controller. It takes the SPANK plugin's "
                 "job-start, task-exit and job-end reports (MUNGE-authenticated, over HTTP or a spool dir), "
                 "reconciles them with Slurm, classifies each job's ending (node failure, task crash, time limit, "
                 "preemption, out of memory, user cancel, clean exit, do-not-restart exit code) and requeues a "
                 "failed job at once, away from its bad nodes, within a restart budget that resets only when the "
                 "job's newest complete checkpoint advanced.");
  page.paragraph("ckpt-controller run is the daemon: in the foreground, logging to stderr, stopped by SIGTERM; it "
                 "tells systemd when it is ready. The other commands are its clients. Every decision is recorded "
                 "in the database before it is sent to Slurm, so a restarted or upgraded controller carries on.");
  page.section("OPTIONS");
  for (const auto& o : cmd.opts) page.item(option_tag(o), o.desc);
  page.section("COMMANDS");
  write_commands(page, "ckpt-controller", cmd);
  page.section("CONFIGURATION");
  page.paragraph("The config file has one key = value a line; # starts a comment. An unknown key or a bad value "
                 "stops the controller with one line naming the file, the line and the key (check a file with "
                 "ckpt-controller check-config). The keys:");
  for (const auto& k : kControllerKeys) {
    if (!controller_accepts(k.key)) {
      std::fprintf(stderr, "ckpt-mangen: config key '%s' is not accepted by parse_controller_config; left out\n",
                   k.key);
      continue;
    }
    page.item(bold(k.key) + " = " + italic(k.arg), std::string(k.meaning) + ".");
  }
  durations_paragraph(page);
  page.section("ENVIRONMENT");
  page.item(bold("CKPT_CONTROLLER_CONFIG"), "The config file when -c is not given.");
  page.item(bold("SLURM_CONF"), "Slurm's config, for the libslurm backend.");
  page.item(bold("SLURM_JWT"), "The token for slurmrestd when rest_token_file is not set.");
  page.section("FILES");
  page.item(italic("/etc/slurm-ckpt/controller.conf"), "The config file.");
  page.item(italic("/var/lib/slurm-ckpt/controller.db"), "The database (database = ...).");
  page.item(italic("/lib/systemd/system/ckpt-controller.service"),
            "The systemd unit: systemctl enable --now ckpt-controller, once controller.conf and plugstack.conf "
            "name the same place (plugstack.conf: controller=http://LISTEN).");
  page.section("SEE ALSO");
  page.raw(".BR spank_ckpt (8),\n.BR ckpt\\-run (1),\n.BR ckpt (1),\n.BR slurm.conf (5)");
  return page.str();
}

// ---- ckpt-run(1) ------------------------------------------------------------------------------------------------
std::string page_run() {
  Page page("CKPT-RUN", 1, CKPT_VERSION);
  name_section(page, "ckpt-run", "relaunch a job step inside its allocation when a node fails");
  page.section("SYNOPSIS");
  std::string line = bold("ckpt-run");
  for (const auto& o : ckpt::run::kRunOptions) line += " [" + bold(o.name) + " " + italic(o.arg) + "]";
  page.raw(line + " [" + bold("--") + "] " + bold("srun") + " [" + italic("srun options") + "] " + italic("command") +
           " [" + italic("args") + "]");
  page.section("DESCRIPTION");
  page.paragraph("ckpt-run runs a job step inside an sbatch allocation and, when a node of the step fails, "
                 "relaunches it there without the bad nodes instead of giving up the allocation. The recovery "
                 "controller decides (it hears the ranks' failure reports, probes the silent nodes and applies "
                 "the restart budget); ckpt-run asks it, kills what is left of the failed step and starts srun "
                 "--overlap --exclude=BAD_NODES with the same options on the healthy nodes. Every rank stays on "
                 "the node it ran on, where its node tier is, and the ranks of a bad node move together to a free "
                 "node (srun --distribution=arbitrary with a host file; not where the srun line names its own "
                 "distribution), where with --ckpt-memory they fetch their state back from the copies their "
                 "partners' nodes kept. When too few healthy "
                 "nodes remain, it hands the job over to the controller for a requeue of the whole job.");
  page.paragraph("Give the allocation spare nodes, and --no-kill so that it outlives a node's failure.");
  page.section("OPTIONS");
  for (const auto& o : ckpt::run::kRunOptions) {
    page.item(bold(o.name) + " " + italic(o.arg), std::string(o.usage) + ".");
  }
  durations_paragraph(page);
  page.section("ENVIRONMENT");
  page.item(bold("CKPT_CONTROLLER_URL"), "The controller, when --controller is not given: the plugin exports "
                                         "the site's controller= URL to every job.");
  page.item(bold("CKPT_SPARES"), "The job's --ckpt-spares (spank_ckpt(8)): without --spares, a value above 0 "
                                 "restarts in place with that many spare nodes.");
  page.item(bold("CKPT_MAX_SPARES"), "The site's max_spares: a larger --spares or CKPT_SPARES is refused.");
  page.section("EXIT STATUS");
  page.paragraph("The status of the last step it ran; 1 when it handed the job over or was stopped; 2 for a bad "
                 "command line or when it is not inside an allocation.");
  page.section("EXAMPLES");
  page.example("#SBATCH -N4 --no-kill\nckpt-run srun -N3 --ntasks-per-node=1 python3 train.py");
  page.paragraph("Restart in place with one spare node of five:");
  page.example("#SBATCH -N5 --no-kill --requeue --ckpt-last-words=on --ckpt-spares=1\n"
               "ckpt-run srun -N4 --ntasks-per-node=8 python3 train.py");
  page.section("SEE ALSO");
  page.raw(".BR ckpt\\-controller (8),\n.BR spank_ckpt (8),\n.BR srun (1),\n.BR sbatch (1)");
  return page.str();
}

// ---- spank_ckpt(8) ----------------------------------------------------------------------------------------------
std::string seconds(std::uint64_t s) {
  if (s != 0 && s % 3600 == 0) return std::to_string(s / 3600) + "h";
  if (s != 0 && s % 60 == 0) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

std::string page_spank() {
  using ckpt::BuiltinDefaults;
  Page page("SPANK_CKPT", 8, CKPT_VERSION);
  name_section(page, "spank_ckpt", "Slurm SPANK plugin for checkpointing and fast recovery of training jobs");
  page.section("SYNOPSIS");
  page.raw("In " + italic("plugstack.conf") + ":");
  page.example("required spank_ckpt.so [KEY=VALUE ...]");
  page.section("DESCRIPTION");
  page.paragraph("spank_ckpt.so gives every job the --ckpt-* options of sbatch, salloc and srun, resolves them "
                 "against the site's policy from plugstack.conf, and hands every rank its settings and the newest "
                 "complete, verified checkpoint to resume from as CKPT_* environment variables. Where the site "
                 "runs ckpt-controller it reports job starts, task exits and job ends to it.");
  page.paragraph("An unknown plugstack.conf key or a bad value makes the plugin fail closed with one line naming "
                 "it. A job that gives no --ckpt option on a site with enabled_by_default=no gets nothing and pays "
                 "nothing. Options given to sbatch reach every srun in the batch script.");
  page.section("OPTIONS");
  for (const auto& o : ckpt::option_specs()) {
    page.item(bold(std::string("--") + o.name) + "=" + italic(o.arginfo),
              std::string(o.usage) + ". Expected: " + o.expected + ". Site default: plugstack.conf key " + o.key +
                  ".");
  }
  page.section("PLUGSTACK KEYS");
  page.paragraph("The arguments after the plugin's path are key=value pairs. Each option's key sets the site's "
                 "default for it:");
  for (const auto& o : ckpt::option_specs()) {
    page.item(bold(o.key) + "=" + italic(o.arginfo), std::string("Default for --") + o.name + ".");
  }
  page.paragraph("Site policy:");
  const ckpt::SitePolicy site;  // the built-in policy: what each key is without a value
  for (const auto& k : ckpt::site_key_specs()) {
    std::string text = std::string(k.usage) + ".";
    const std::string key = k.key;
    if (key == "min_interval") text += " Default: " + seconds(site.min_interval_s) + ".";
    if (key == "max_interval") text += " Default: " + seconds(site.max_interval_s) + ".";
    if (key == "enabled_by_default") text += std::string(" Default: ") + (site.enabled_by_default ? "yes" : "no") + ".";
    if (key == "max_spares") text += " Default: " + std::to_string(site.max_spares) + ".";
    if (key == "max_memory") {
      text += " A capped job is told so in one line: ckpt: --ckpt-memory: 8G is above the site maximum of 4G: the "
              "memory tier uses 4G.";
    }
    page.item(bold(k.key) + "=" + italic(k.arginfo), text);
  }
  page.paragraph("Without a user's or the site's value: keep " + std::to_string(BuiltinDefaults::keep) +
                 ", last words " + (BuiltinDefaults::last_words ? "on" : "off") + ", MTBF " +
                 seconds(BuiltinDefaults::mtbf_s) + ", max restarts " + std::to_string(BuiltinDefaults::max_restarts) +
                 ", grace " + seconds(BuiltinDefaults::grace_s) + ", spares " +
                 std::to_string(BuiltinDefaults::spares) + ", memory tier " +
                 ckpt::format_memory(BuiltinDefaults::memory_bytes) + ", memory interval " +
                 std::to_string(BuiltinDefaults::memory_interval) + " step.");
  durations_paragraph(page);
  page.paragraph("A SIZE is a number of bytes with an optional unit: K, M, G, T (or KiB, MiB, GiB, TiB) are powers "
                 "of 1024, KB, MB, GB, TB powers of 1000: 512M, 4G, 1T.");
  page.section("ENVIRONMENT");
  page.paragraph("Every rank of a job with checkpointing receives:");
  ckpt::Settings settings;
  settings.dir = "/";
  for (const auto& [name, value] : ckpt::settings_environment(settings)) {
    // CKPT_LAST_WORDS -> last_words: the option or site key it carries.
    std::string key = name.substr(5);
    for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    std::string text = "The site's " + key + ".";
    for (const auto& o : ckpt::option_specs()) {
      if (key == o.key) text = std::string("The job's --") + o.name + ", else the site's " + o.key + ", else the default.";
    }
    if (name == "CKPT_INTERVAL") text += " Normalized: auto, 900s or 500steps.";
    if (name == "CKPT_MEMORY") text += " Within the site's max_memory; normalized: off, 4G, 512M or bytes.";
    page.item(bold(name), text);
  }
  page.paragraph("and, where they apply, CKPT_RESTART_COUNT, CKPT_JOB_ID, CKPT_END_TIME (when the job has a "
                 "time limit), CKPT_KILL_WAIT, CKPT_REQUEUE (controller or self), CKPT_TRUSTED_DIRS, and "
                 "CKPT_RESUME_STEP and CKPT_RESUME_PATH when there is a complete checkpoint to resume from.");
  page.section("EXAMPLES");
  page.example("required spank_ckpt.so dir=/scratch/%u/ckpt/%j allowed_dirs=/scratch interval=auto keep=3 "
               "grace=5m min_interval=5m node_mtbf=50000h enabled_by_default=no max_spares=2 "
               "controller=http://127.0.0.1:6830\n"
               "\n"
               "sbatch --ckpt-interval=auto --ckpt-grace=5m -t 4:00:00 --requeue train.sbatch");
  page.section("FILES");
  page.item(italic("/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_ckpt.so"),
            "The plugin, in Debian's Slurm PluginDir (so plugstack.conf may name it without a path).");
  page.item(italic("/etc/slurm/plugstack.conf"), "Where Debian's Slurm reads SPANK plugins from, by default.");
  page.item(italic(std::string(BuiltinDefaults::node_dir) + "/" + ckpt::memtier::kNodeDirPrefix + "UID.JOBID"),
            "A job's node tier on each node (under the site's node_dir): with --ckpt-memory, the ranks' staging and "
            "the partner copies they keep, in files, so that a relaunch in the job restores from them (a replaced "
            "node's ranks from their partners'). The plugin's job epilog removes it when the job ends on the node, as the "
            "job's user, and its job prolog removes one an earlier job with the same id left; a dir of that name that "
            "is not the user's is left alone.");
  page.section("SEE ALSO");
  page.raw(".BR spank (7),\n.BR ckpt (1),\n.BR ckpt\\-controller (8),\n.BR ckpt\\-run (1),\n.BR slurm.conf (5)");
  return page.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: ckpt-mangen ckpt.1|ckpt-run.1|ckpt-controller.8 HELP_FILE|spank_ckpt.8\n");
    return 2;
  }
  const std::string page = argv[1];
  std::string out;
  if (page == "ckpt.1") {
    out = page_ckpt();
  } else if (page == "ckpt-run.1") {
    out = page_run();
  } else if (page == "spank_ckpt.8") {
    out = page_spank();
  } else if (page == "ckpt-controller.8" && argc == 3) {
    std::ifstream in(argv[2]);
    std::stringstream help;
    help << in.rdbuf();
    if (!in || help.str().empty()) {
      std::fprintf(stderr, "ckpt-mangen: %s: no ckpt-controller --help-all output\n", argv[2]);
      return 1;
    }
    out = page_controller(help.str());
  } else {
    std::fprintf(stderr, "ckpt-mangen: unknown page '%s'\n", page.c_str());
    return 2;
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}
