#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "ckpt/options.hpp"
#include "ckpt/srun_cmdline.hpp"

using namespace ckpt;
using Words = std::vector<std::string>;

namespace {

SrunCommandLine parse(const Words& args) {
  auto line = parse_srun_command_line(args);
  INFO(line.error());
  REQUIRE(line.ok());
  return *line;
}

// Every option as srun would get it again, one word each.
Words rendered(const SrunCommandLine& line) {
  Words out;
  for (const auto& option : line.options) {
    for (auto& word : option.words()) out.push_back(word);
  }
  return out;
}

}  // namespace

TEST_CASE("srun command line: long options with and without '='", "[srun_cmdline]") {
  auto line = parse({"srun", "--nodes=4", "--ntasks-per-node", "1", "--overlap", "--label", "python", "train.py"});
  CHECK(line.srun == "srun");
  CHECK(line.command == Words{"python", "train.py"});
  REQUIRE(line.options.size() == 4);
  CHECK(line.options[0].long_name() == "nodes");
  CHECK(line.options[0].value == "4");
  CHECK(line.options[1].long_name() == "ntasks-per-node");
  CHECK(line.options[1].value == "1");
  CHECK_FALSE(line.options[2].value);
  CHECK(rendered(line) == Words{"--nodes=4", "--ntasks-per-node=1", "--overlap", "--label"});
}

TEST_CASE("srun command line: short options, attached, separate and clustered", "[srun_cmdline]") {
  SECTION("-N 4 and -N4") {
    auto line = parse({"srun", "-N", "4", "-n8", "a.out"});
    REQUIRE(line.options.size() == 2);
    CHECK(line.options[0].long_name() == "nodes");
    CHECK(line.options[0].value == "4");
    CHECK(line.options[1].long_name() == "ntasks");
    CHECK(line.options[1].value == "8");
    CHECK(rendered(line) == Words{"-N", "4", "-n", "8"});
    CHECK(line.command == Words{"a.out"});
  }
  SECTION("a cluster of flags") {
    auto line = parse({"srun", "-lvu", "hostname"});
    REQUIRE(line.options.size() == 3);
    CHECK(line.options[0].long_name() == "label");
    CHECK(line.options[1].long_name() == "verbose");
    CHECK(line.options[2].long_name() == "unbuffered");
    CHECK(rendered(line) == Words{"-l", "-v", "-u"});
  }
  SECTION("a cluster ending in an option with its value, attached or in the next word") {
    auto attached = parse({"srun", "-lN4", "hostname"});
    CHECK(rendered(attached) == Words{"-l", "-N", "4"});
    CHECK(attached.command == Words{"hostname"});
    auto separate = parse({"srun", "-lN", "4", "hostname"});
    CHECK(rendered(separate) == Words{"-l", "-N", "4"});
    CHECK(separate.command == Words{"hostname"});
  }
  SECTION("the value of a short option may start with a dash or hold letters of flags") {
    auto line = parse({"srun", "-o", "-", "-Jlv", "a.out"});
    REQUIRE(line.options.size() == 2);
    CHECK(line.options[0].value == "-");
    CHECK(line.options[1].long_name() == "job-name");
    CHECK(line.options[1].value == "lv");
  }
}

TEST_CASE("srun command line: options whose value is optional never take the next word", "[srun_cmdline]") {
  auto line = parse({"srun", "--exclusive", "-K", "-I5", "--x11=first", "--bcast", "a.out", "x"});
  REQUIRE(line.options.size() == 5);
  CHECK_FALSE(line.options[0].value);
  CHECK_FALSE(line.options[1].value);
  CHECK(line.options[2].long_name() == "immediate");
  CHECK(line.options[2].value == "5");
  CHECK(line.options[3].value == "first");
  CHECK_FALSE(line.options[4].value);
  CHECK(line.command == Words{"a.out", "x"});
  // Given back attached: a separate "5" would be srun's program.
  CHECK(rendered(line) == Words{"--exclusive", "-K", "-I5", "--x11=first", "--bcast"});
}

TEST_CASE("srun command line: '--' ends the options", "[srun_cmdline]") {
  SECTION("what follows is the program, even when it looks like an option") {
    auto line = parse({"srun", "-N2", "--", "--version", "-x"});
    REQUIRE(line.options.size() == 1);
    CHECK(line.command == Words{"--version", "-x"});
  }
  SECTION("the value of an option may be '--'") {
    auto line = parse({"srun", "--job-name", "--", "a.out"});
    REQUIRE(line.options.size() == 1);
    CHECK(line.options[0].value == "--");
    CHECK(line.command == Words{"a.out"});
  }
  SECTION("the first word that is no option starts the program; its own options stay with it") {
    auto line = parse({"srun", "-N1", "python", "-u", "--nodes", "3"});
    CHECK(line.options.size() == 1);
    CHECK(line.command == Words{"python", "-u", "--nodes", "3"});
  }
  SECTION("a lone '-' is the program") {
    CHECK(parse({"srun", "-"}).command == Words{"-"});
  }
}

TEST_CASE("srun command line: options the table does not know are kept as flags", "[srun_cmdline]") {
  auto line = parse({"srun", "--made-up", "-j", "--made-up-too=v", "a.out"});
  REQUIRE(line.options.size() == 3);
  CHECK(line.options[0].spec == nullptr);
  CHECK(line.options[0].long_name() == "made-up");
  CHECK_FALSE(line.options[0].value);
  CHECK(line.options[1].spec == nullptr);
  CHECK(line.options[2].value == "v");
  CHECK(rendered(line) == Words{"--made-up", "-j", "--made-up-too=v"});
  CHECK(line.command == Words{"a.out"});
}

TEST_CASE("srun command line: every --ckpt-* option of the plugin's table is known", "[srun_cmdline]") {
  for (const auto& spec : option_specs()) {
    const std::string name = spec.name;
    INFO(name);
    const SrunOptionSpec* known = find_srun_option(name);
    REQUIRE(known != nullptr);
    CHECK(known->arg == (kOptionHasArg == 1 ? SrunArg::Required : SrunArg::Optional));
    auto separate = parse({"srun", "--" + name, "value", "a.out"});
    REQUIRE(separate.options.size() == 1);
    CHECK(separate.options[0].value == "value");
    CHECK(separate.command == Words{"a.out"});
    auto attached = parse({"srun", "--" + name + "=value", "a.out"});
    CHECK(attached.options[0].value == "value");
  }
}

TEST_CASE("srun command line: the table names each option and letter once", "[srun_cmdline]") {
  std::set<std::string> names;
  std::set<char> letters;
  for (const auto& spec : srun_option_table()) {
    INFO(spec.name);
    CHECK(names.insert(spec.name).second);
    if (spec.short_name != 0) CHECK(letters.insert(spec.short_name).second);
  }
  for (const char* name : {"nodes", "exclude", "nodelist", "ntasks-per-node", "overlap", "export"}) {
    CHECK(names.count(name) == 1);
  }
  CHECK(find_srun_short_option('N')->name == std::string("nodes"));
  CHECK(find_srun_short_option('x')->name == std::string("exclude"));
  CHECK(find_srun_short_option('j') == nullptr);
  CHECK(find_srun_option("nod") == nullptr);  // abbreviations are not expanded
}

TEST_CASE("srun command line: malformed lines fail with one line", "[srun_cmdline]") {
  CHECK(parse_srun_command_line({}).error() == "no srun command line");
  CHECK(parse_srun_command_line({"srun"}).error() == "no command after the srun options");
  CHECK(parse_srun_command_line({"srun", "-N2", "--"}).error() == "no command after the srun options");
  CHECK(parse_srun_command_line({"srun", "--label"}).error() == "no command after the srun options");
  CHECK(parse_srun_command_line({"srun", "-N"}).error() == "srun option -N needs a value");
  CHECK(parse_srun_command_line({"srun", "-lN"}).error() == "srun option -N needs a value");
  CHECK(parse_srun_command_line({"srun", "--nodes"}).error() == "srun option --nodes needs a value");
  CHECK(parse_srun_command_line({"srun", "--ckpt-dir"}).error() == "srun option --ckpt-dir needs a value");
  // A value given with '=' may be empty; srun judges it.
  CHECK(parse({"srun", "--nodes=", "a.out"}).options[0].value == "");
}
