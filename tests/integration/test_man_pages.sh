#!/usr/bin/env bash
# The generated man pages (man/mangen.cpp): each renders with groff -man -ww without a warning and opens with
# man -l, and each names every option and key its program has, as the program itself knows them:
#   ckpt(1)             every option and command of `ckpt --help` and `ckpt COMMAND --help`
#   ckpt-controller(8)  every option and command of `ckpt-controller --help-all`, and every key
#                       parse_controller_config handles (core/src/controller/config.cpp)
#   ckpt-run(1)         every option of `ckpt-run --help`, and each of them is one ckpt-run parses
#   spank_ckpt(8)       every --ckpt-* option and plugstack.conf key the plugin registers and parses
#                       (core/src/options.cpp), and each CKPT_* variable the plugin exports
source "$(dirname "$0")/lib.sh"
MAN=$CKPT_BUILD_DIR/man
BIN=$CKPT_BUILD_DIR
for tool in groff man; do command -v "$tool" > /dev/null || fail "needs $tool (scripts/install-deps.sh: groff, man-db)"; done
for page in ckpt.1 ckpt-run.1 ckpt-controller.8 spank_ckpt.8; do
  [ -s "$MAN/$page" ] || fail "$MAN/$page is not built"
  [ -s "$MAN/$page.gz" ] || fail "$MAN/$page.gz is not built"
done

# ---- renders cleanly ------------------------------------------------------------------------------------------
for page in ckpt.1 ckpt-run.1 ckpt-controller.8 spank_ckpt.8; do
  LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$MAN/$page" > "$SCRATCH/$page.groff" 2>&1 || true
  if [ -s "$SCRATCH/$page.groff" ]; then cat "$SCRATCH/$page.groff" >&2; fail "groff -man -ww warns on $page"; fi
  LC_ALL=C.UTF-8 MANWIDTH=100 man -l "$MAN/$page.gz" 2> "$SCRATCH/$page.err" > /dev/null
  [ ! -s "$SCRATCH/$page.err" ] || { cat "$SCRATCH/$page.err" >&2; fail "man -l $page.gz warns"; }
  # The text the checks below read: no hyphenation, no justification, long lines, no escapes.
  LC_ALL=C.UTF-8 groff -man -Tutf8 -rHY=0 -dAD=l -rLL=300n -P-cbou "$MAN/$page" > "$SCRATCH/$page.txt"
  grep -q "^NAME" "$SCRATCH/$page.txt" && grep -q "^SYNOPSIS" "$SCRATCH/$page.txt" || fail "$page has no NAME or SYNOPSIS"
  # The compressed page is the page.
  cmp -s <(gzip -dc "$MAN/$page.gz") "$MAN/$page" || fail "$page.gz is not $page"
done
pass "4 pages render with groff -ww and man -l without a warning"

# in_page PAGE WORD WHAT: the rendered PAGE shows WORD (literally, as a whole word).
in_page() {
  grep -qwF -- "$2" "$SCRATCH/$1.txt" || fail "$1 does not mention $3 '$2'"
}
# Long options (--x) and subcommands from CLI11's help text.
help_options() { grep -oE -- '(^|[ ,])--[a-z][a-z0-9-]*' | sed 's/^[ ,]//' | grep -vxE -- '--help(-all)?' | sort -u; }

# ---- ckpt(1) --------------------------------------------------------------------------------------------------
n=0
commands=$("$BIN/cli/ckpt" --help | sed -n '/^Subcommands:/,$p' | awk 'NR > 1 && NF { print $1 }')
[ -n "$commands" ] || fail "ckpt --help lists no commands"
for c in $commands; do
  in_page ckpt.1 "ckpt $c" "command"
  for o in $("$BIN/cli/ckpt" "$c" --help | help_options); do in_page ckpt.1 "$o" "option of ckpt $c"; n=$((n + 1)); done
done
pass "ckpt(1): $(echo $commands | wc -w) commands and $n options of ckpt --help"

# ---- ckpt-controller(8) ---------------------------------------------------------------------------------------
"$BIN/controller/ckpt-controller" --help-all > "$SCRATCH/controller.help"
n=0
for o in $(help_options < "$SCRATCH/controller.help"); do in_page ckpt-controller.8 "$o" "option"; n=$((n + 1)); done
commands=$(sed -n '/^Subcommands:/,$p' "$SCRATCH/controller.help" | awk 'NR > 1 && /^[a-z]/ { print $1 }')
[ -n "$commands" ] || fail "ckpt-controller --help-all lists no commands"
for c in $commands; do in_page ckpt-controller.8 "ckpt-controller $c" "command"; done
# The keys the parser handles: the names in its table of keys (`{"name", "what it expects",` in kKeys).
keys=$(sed -n '/^const ConfigKey kKeys\[\] = {/,/^};/p' "$CKPT_SOURCE_DIR/core/src/controller/config.cpp" |
  grep -oE '^ +\{"[a-z_]+",' | sed 's/.*"\(.*\)".*/\1/' | sort -u)
[ "$(echo "$keys" | wc -l)" -ge 10 ] || fail "found only $(echo "$keys" | wc -l) keys in core/src/controller/config.cpp"
for k in $keys; do
  grep -qE "^ +$k = " "$SCRATCH/ckpt-controller.8.txt" || fail "ckpt-controller(8) does not document config key '$k' (add it to kControllerKeys in man/mangen.cpp)"
done
# ... and documents no key the parser does not know.
for k in $(grep -oE '^ +[a-z_]+ = ' "$SCRATCH/ckpt-controller.8.txt" | awk '{ print $1 }'); do
  grep -qx "$k" <<< "$keys" || fail "ckpt-controller(8) documents key '$k', which parse_controller_config does not know"
done
pass "ckpt-controller(8): $n options, $(echo $commands | wc -w) commands, $(echo "$keys" | wc -l) config keys"

# ---- ckpt-run(1) ----------------------------------------------------------------------------------------------
"$BIN/ckpt-run/ckpt-run" --help > "$SCRATCH/run.help" 2>&1 || fail "ckpt-run --help failed"
options=$(help_options < "$SCRATCH/run.help")
[ "$(echo "$options" | wc -w)" -ge 4 ] || fail "ckpt-run --help lists only: $options"
for o in $options; do
  in_page ckpt-run.1 "$o" "option"
  # Each one is an option ckpt-run parses: given a value, the command line is only refused for the allocation.
  env -u SLURM_JOB_ID "$BIN/ckpt-run/ckpt-run" "$o" 1 -- srun true > /dev/null 2> "$SCRATCH/run.err" || true
  grep -q "not inside a Slurm allocation" "$SCRATCH/run.err" || { cat "$SCRATCH/run.err" >&2; fail "ckpt-run does not parse $o, which its help lists"; }
done
pass "ckpt-run(1): $(echo $options | wc -w) options, each parsed by ckpt-run"

# ---- spank_ckpt(8) --------------------------------------------------------------------------------------------
# The options the plugin registers and the keys parse_site_policy handles, from the core's tables and parser.
src=$CKPT_SOURCE_DIR/core/src/options.cpp
options=$(grep -oE '\{OptionId::[A-Za-z]+, "ckpt-[a-z-]+", "[a-z_]+"' "$src" | sed 's/.*"\(ckpt-[a-z-]*\)", "\([a-z_]*\)"/\1 \2/')
[ "$(echo "$options" | wc -l)" -ge 7 ] || fail "found only $(echo "$options" | wc -l) options in options.cpp"
while read -r name key; do
  in_page spank_ckpt.8 "--$name" "option"
  grep -qE "^ +$key=" "$SCRATCH/spank_ckpt.8.txt" || fail "spank_ckpt(8) does not document plugstack key '$key'"
done <<< "$options"
site_keys=$(grep -oE 'key == "[a-z_]+"' "$src" | sed 's/.*"\(.*\)"/\1/' | sort -u)
[ "$(echo "$site_keys" | wc -l)" -ge 6 ] || fail "found only $(echo "$site_keys" | wc -l) site keys in options.cpp"
for k in $site_keys; do
  grep -qE "^ +$k=" "$SCRATCH/spank_ckpt.8.txt" || fail "spank_ckpt(8) does not document plugstack key '$k' (add it to site_key_specs())"
done
for v in $(grep -oE '"CKPT_[A-Z_]+"' "$src" | tr -d '"' | sort -u); do in_page spank_ckpt.8 "$v" "variable"; done
pass "spank_ckpt(8): $(echo "$options" | wc -l) options and their keys, $(echo $site_keys | wc -w) site keys, the CKPT_* variables"
finish
