#!/usr/bin/env bash
# The ckpt command line: ls, verify, latest and gc on real checkpoints, and its one-line errors (missing dir,
# no permission, unreadable files, bad arguments).
source "$(dirname "$0")/store_lib.sh"

# expect RC WANT_STDOUT_GLOB WANT_STDERR_GLOB -- command...: runs it and checks the exit code and both streams.
expect() {
  local want_rc="$1" want_out="$2" want_err="$3"
  shift 4
  local rc=0 out err
  out="$("$@" 2>"$work/stderr")" || rc=$?
  err="$(cat "$work/stderr")"
  [[ $rc -eq $want_rc ]] || fail "$*: exit $rc, expected $want_rc (stderr: $err)"
  # shellcheck disable=SC2053
  [[ "$out" == $want_out ]] || fail "$*: stdout '$out' does not match '$want_out'"
  # shellcheck disable=SC2053
  [[ "$err" == $want_err ]] || fail "$*: stderr '$err' does not match '$want_err'"
  if [[ -n "$err" && "$want_err" != "*" ]]; then
    [[ "$(wc -l <<<"$err")" -eq 1 ]] || fail "$*: stderr has more than one line"
  fi
}

json_get() { "$PY" -c 'import json, sys; print(eval(sys.argv[1], {"d": json.load(sys.stdin)}))' "$1"; }

root="$work/ckpts"
"$CRASHER" save "$root" 100 >/dev/null
"$CRASHER" save "$root" 200 >/dev/null
"$CRASHER" save "$root" 300 --kind terminal --dead 1 --dead 2 >/dev/null
"$CRASHER" save "$root" 400 --kill-at ShardsDurable >/dev/null 2>&1 || true

# ---- ls
out="$("$CKPT" ls "$root")" || fail "ls failed"
[[ "$(wc -l <<<"$out")" -eq 5 ]] || fail "ls: expected a header and 4 lines, got: $out"
grep -Eq '^STEP +KIND +STATE +RANKS +BYTES +AGE +DETAIL$' <<<"$out" || fail "ls: header: $out"
grep -Eq '^200 +periodic +complete +4 +4\.0 MiB +[0-9]+s +4 shards$' <<<"$out" || fail "ls: line for 200: $out"
grep -Eq '^300 +terminal +complete +4 +1\.0 MiB ' <<<"$out" || fail "ls: line for 300: $out"
grep -Eq '^400 +- +incomplete +- +4\.0 MiB +[0-9]+s +no manifest; 4 shard records$' <<<"$out" || fail "ls: 400: $out"
json="$("$CKPT" ls "$root" --json)" || fail "ls --json failed"
[[ "$(json_get '[e["step"] for e in d]' <<<"$json")" == "[100, 200, 300, 400]" ]] || fail "ls --json steps"
[[ "$(json_get '[e["state"] for e in d]' <<<"$json")" == "['complete', 'complete', 'complete', 'incomplete']" ]] ||
  fail "ls --json states: $json"
[[ "$(json_get 'd[2]["kind"], d[2]["ranks"], d[2]["shards"], d[2]["bytes"] > 1048576' <<<"$json")" == \
  "('terminal', 4, 1, True)" ]] || fail "ls --json terminal entry: $json"
[[ "$(json_get 'd[3]["kind"], d[3]["ranks"], 0 <= d[3]["age_s"] < 600' <<<"$json")" == "(None, None, True)" ]] ||
  fail "ls --json incomplete entry: $json"
expect 0 "no checkpoints in $work" "" -- "$CKPT" ls "$work"
expect 0 "[]" "" -- "$CKPT" ls "$work" --json

# ---- latest
expect 0 "$(step_dir "$root" 300)" "ckpt: note: step 400: skipped, incomplete: *" -- "$CKPT" latest "$root"
json="$("$CKPT" latest "$root" --json 2>/dev/null)" || fail "latest --json failed"
[[ "$(json_get 'd["step"], d["kind"], d["ranks"]' <<<"$json")" == "(300, 'terminal', 4)" ]] ||
  fail "latest --json: $json"
expect 1 "" "ckpt: no usable checkpoint in $work" -- "$CKPT" latest "$work"
expect 1 '*"step": null*' "" -- "$CKPT" latest "$work" --json

# ---- verify
expect 0 "step 300: ok (1 shards, 1.0 MiB, checksums match)" "*" -- "$CKPT" verify "$root"
expect 0 "step 100: ok (4 shards, 4.0 MiB, checksums match)" "" -- "$CKPT" verify "$root" --step 100
expect 0 "step 100: ok (4 shards, 4.0 MiB, sizes match)" "" -- "$CKPT" verify "$root" --step 100 --sizes-only
expect 1 "" "ckpt: step 400: no manifest (incomplete)" -- "$CKPT" verify "$root" --step 400
expect 1 "" "ckpt: step 999 does not exist" -- "$CKPT" verify "$root" --step 999
expect 2 "" "ckpt: --step 'abc': not a non-negative integer" -- "$CKPT" verify "$root" --step abc
expect 2 "" "ckpt: --step '-1': not a non-negative integer" -- "$CKPT" verify "$root" --step=-1
expect 1 "" "ckpt: no checkpoints in $work" -- "$CKPT" verify "$work"

# ---- gc: nothing while the newer save (400) is incomplete; then old ones and leftovers go
expect 0 "nothing to delete" "" -- "$CKPT" gc "$root" --keep 1 --dry-run
"$CRASHER" save "$root" 500 >/dev/null
expect 0 "would delete $(step_dir "$root" 100)
would delete $(step_dir "$root" 200)
would delete $(step_dir "$root" 400)" "" -- "$CKPT" gc "$root" --keep 2 --dry-run
[[ -d "$(step_dir "$root" 100)" && -d "$(step_dir "$root" 400)" ]] || fail "gc --dry-run deleted something"
expect 0 "deleted $(step_dir "$root" 100)
deleted $(step_dir "$root" 200)
deleted $(step_dir "$root" 400)" "" -- "$CKPT" gc "$root" --keep 2
[[ "$(cd "$root" && echo *)" == "000000000300 000000000500 latest" ]] || fail "gc left: $(ls "$root")"
expect 0 "nothing to delete" "" -- "$CKPT" gc "$root" --keep 2
expect 0 "step 500: ok (4 shards, 4.0 MiB, checksums match)" "" -- "$CKPT" verify "$root"
[[ "$(cat "$root/latest")" == 000000000500 ]] || fail "the latest pointer is not 500"

# ---- bad arguments: one line, prefixed, exit 2
expect 2 "" "ckpt: --keep '0x': not a non-negative integer" -- "$CKPT" gc "$root" --keep 0x
expect 2 "" "ckpt: --keep must be at least 1" -- "$CKPT" gc "$root" --keep 0
expect 2 "" "ckpt: *--keep*" -- "$CKPT" gc "$root"
expect 2 "" "ckpt: *" -- "$CKPT"
expect 2 "" "ckpt: *" -- "$CKPT" frobnicate
expect 0 "*Usage*" "" -- "$CKPT" --help

# ---- a missing dir, a file instead of a dir
for cmd in "ls" "latest" "verify" "gc --keep 1"; do
  # shellcheck disable=SC2086
  expect 2 "" "ckpt: cannot open checkpoint dir '$work/nope': No such file or directory" -- "$CKPT" $cmd "$work/nope"
  # shellcheck disable=SC2086
  expect 2 "" "ckpt: cannot open checkpoint dir '$root/latest': Not a directory" -- "$CKPT" $cmd "$root/latest"
done

# ---- no permission and unreadable files, checked as an unprivileged user (root reads everything)
as_user=()
if [[ $(id -u) -eq 0 ]]; then
  if command -v runuser >/dev/null && id nobody >/dev/null 2>&1; then
    as_user=(runuser -u nobody --)
  else
    echo "test_ckpt_cli: no unprivileged user to check permission errors with" >&2
    exit 77
  fi
fi
if [[ ${#as_user[@]} -gt 0 ]] && ! "${as_user[@]}" test -x "$CKPT"; then
  echo "test_ckpt_cli: $CKPT is not reachable by nobody; permission checks skipped" >&2
  exit 77
fi
private="$work/private"
mine="$work/mine"
"$CRASHER" save "$private" 100 >/dev/null
"$CRASHER" save "$mine" 100 >/dev/null
"$CRASHER" save "$mine" 200 >/dev/null
if [[ ${#as_user[@]} -gt 0 ]]; then
  chmod 700 "$private"
  chown -R nobody "$mine"
else
  chmod 000 "$private"
fi
for cmd in "ls" "latest" "verify" "gc --keep 1"; do
  # shellcheck disable=SC2086
  expect 2 "" "ckpt: cannot open checkpoint dir '$private': Permission denied" -- \
    "${as_user[@]}" "$CKPT" $cmd "$private"
done
chmod 000 "$(step_dir "$mine" 200)/rank-00001.shard"
expect 1 "" "ckpt: step 200: shard rank-00001.shard (rank 1): cannot open rank-00001.shard: Permission denied" -- \
  "${as_user[@]}" "$CKPT" verify "$mine" --step 200
# Unreadable is not corrupt: a restart passes over it but does not mark it FAILED for everyone.
[[ "$("${as_user[@]}" "$CRASHER" resolve "$mine" 2>/dev/null)" == 100 ]] || fail "unreadable shard: resolve not 100"
[[ ! -e "$(step_dir "$mine" 200)/FAILED" ]] || fail "unreadable shard: step 200 was marked FAILED"
chmod 644 "$(step_dir "$mine" 200)/rank-00001.shard"
chmod 000 "$(step_dir "$mine" 200)/MANIFEST.json"
expect 1 "" "ckpt: step 200: cannot open MANIFEST.json: Permission denied" -- \
  "${as_user[@]}" "$CKPT" verify "$mine" --step 200
out="$("${as_user[@]}" "$CKPT" ls "$mine")" || fail "ls with an unreadable manifest failed"
grep -Eq '^200 .* corrupt .*cannot open MANIFEST.json: Permission denied$' <<<"$out" || fail "ls unreadable: $out"
chmod 000 "$(step_dir "$mine" 100)"
out="$("${as_user[@]}" "$CKPT" ls "$mine")" || fail "ls with an unreadable step dir failed"
grep -Eq '^100 .* corrupt .*cannot open step dir 000000000100: Permission denied$' <<<"$out" || fail "ls: $out"
expect 1 "" "ckpt: no usable checkpoint in $mine" -- "${as_user[@]}" "$CKPT" latest "$mine"

# ---- simulate: the memory tier
sim=("$CKPT" simulate --cost 2s --restart 10s --mtbf 60s --work 200s --failure-times 20,50,90)
expect 2 "" "ckpt: --memory-interval: the memory tier recovers in place: give --in-place-restart too" -- \
  "${sim[@]}" --memory-interval 1s
expect 2 "" "ckpt: the fraction caught with the memory tier must be between the catchable fraction (0.5) and 1 (got 0.2)" \
  -- "${sim[@]}" --in-place-restart 1s --memory-interval 1s --catchable 0.5 --memory-catchable 0.2
# Nothing caught from live state (a shard only the dead rank held), everything from the memory tier: the tier keeps
# the work in place loses, and says so.
json="$("${sim[@]}" --in-place-restart 1s --memory-interval 1s --memory-cost 0.01s --memory-catchable 1 --json)" ||
  fail "simulate with the memory tier failed"
rows="$(json_get '{p["policy"]: (p["from_memory"], p["last_words"], round(p["goodput"], 4)) for p in d["policies"]}' <<<"$json")"
[[ "$(json_get '[p["policy"] for p in d["policies"]][-2:]' <<<"$json")" == "['in-place', 'memory-tier']" ]] ||
  fail "simulate: no memory-tier row: $rows"
[[ "$(json_get '[p for p in d["policies"] if p["policy"] == "memory-tier"][0]["from_memory"]' <<<"$json")" == 3 ]] ||
  fail "simulate: the memory tier caught fewer than the 3 failures: $rows"
[[ "$(json_get '(lambda g: g["memory-tier"] > g["in-place"])({p["policy"]: p["goodput"] for p in d["policies"]})' \
  <<<"$json")" == True ]] || fail "simulate: the memory tier's goodput is not above in place's: $rows"

if [[ $failures -ne 0 ]]; then
  echo "test_ckpt_cli: $failures failures" >&2
  exit 1
fi
echo "test_ckpt_cli: all passed"
