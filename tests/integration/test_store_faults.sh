#!/usr/bin/env bash
# Fault injection on real files: a save is SIGKILLed at each phase (mid-shard, after the shards but before the
# manifest, mid-manifest, after the rename but before the directory fsync, after the commit). Afterwards the
# checkpoint a restart would use must be the previous complete one or the new one whole, and it must verify.
source "$(dirname "$0")/store_lib.sh"

# check_after_kill ROOT CASE EXPECTED_STEP NEW_STEP: what a restart sees after the kill.
check_after_kill() {
  local root="$1" case="$2" expected="$3" new="$4"
  local latest
  if ! latest="$("$CKPT" latest "$root" 2>/dev/null)"; then
    fail "$case: ckpt latest found nothing"
    return
  fi
  [[ "$latest" == "$(step_dir "$root" "$expected")" ]] || fail "$case: ckpt latest gave $latest, not step $expected"
  "$CKPT" verify "$root" --step "$expected" >/dev/null || fail "$case: ckpt verify --step $expected failed"
  local resolved
  resolved="$("$CRASHER" resolve "$root" 2>/dev/null)" || fail "$case: resolve found nothing"
  [[ "$resolved" == "$expected" ]] || fail "$case: resolve_resume gave $resolved, expected $expected"
  # A crash is not corruption: nothing may have been marked FAILED.
  if compgen -G "$root/*/FAILED" >/dev/null; then fail "$case: a checkpoint was marked FAILED"; fi
  local new_state
  new_state="$(state_of "$root" "$new")"
  if [[ "$expected" == "$new" ]]; then
    [[ "$new_state" == complete ]] || fail "$case: step $new is $new_state, expected complete"
  else
    [[ "$new_state" == incomplete ]] || fail "$case: step $new is $new_state, expected incomplete"
    if "$CKPT" verify "$root" --step "$new" >/dev/null 2>&1; then fail "$case: ckpt verify passed a torn step $new"; fi
  fi
}

# phase kill_rank expected_step: the previous checkpoint is 100, the save being killed is 200.
cases=(
  "ShardOpened 0 100"
  "ShardOpened 3 100"
  "ShardHalfWritten 0 100"
  "ShardHalfWritten 2 100"
  "ShardHalfWritten 3 100"
  "ShardsDurable 0 100"
  "ShardsDurable 3 100"
  "ManifestHalfWritten 3 100"
  "ManifestTempWritten 3 100"
  "ManifestRenamed 3 200"
  "Committed 3 200"
)

for c in "${cases[@]}"; do
  read -r phase rank expected <<<"$c"
  name="$phase/rank$rank"
  root="$work/$phase-$rank"
  "$CRASHER" save "$root" 100 >/dev/null
  rc=0
  "$CRASHER" save "$root" 200 --kill-at "$phase" --kill-rank "$rank" >/dev/null 2>&1 || rc=$?
  if [[ $rc -ne 137 ]]; then
    fail "$name: store_crasher exited $rc, expected death by SIGKILL (137)"
    continue
  fi
  check_after_kill "$root" "$name" "$expected" 200

  # The job restarts and saves again: a killed save of 200 is redone, a committed one is kept as it is.
  if [[ "$expected" == 100 ]]; then
    "$CRASHER" save "$root" 200 >/dev/null || fail "$name: saving step 200 again failed"
    [[ "$("$CKPT" latest "$root" 2>/dev/null)" == "$(step_dir "$root" 200)" ]] || fail "$name: redone 200 not latest"
    "$CKPT" verify "$root" --step 200 >/dev/null || fail "$name: redone step 200 does not verify"
  else
    if "$CRASHER" save "$root" 200 >/dev/null 2>&1; then fail "$name: a committed step 200 was written again"; fi
    "$CKPT" verify "$root" --step 200 >/dev/null || fail "$name: step 200 changed after a refused rewrite"
  fi
  out="$("$CKPT" gc "$root" --keep 1)" || fail "$name: gc failed"
  [[ "$out" == "deleted $(step_dir "$root" 100)" ]] || fail "$name: gc printed '$out'"
  "$CKPT" verify "$root" --step 200 >/dev/null || fail "$name: step 200 does not verify after gc"
  echo "ok: killed at $name -> resume from $expected"
done

# Kill at an arbitrary moment, many times over: the invariant holds whatever the timing.
root="$work/random"
"$CRASHER" save "$root" 100 --bytes 4194304 >/dev/null
previous=100
for i in $(seq 1 12); do
  step=$((100 + i))
  "$CRASHER" save "$root" "$step" --bytes 4194304 >/dev/null 2>&1 &
  pid=$!
  sleep "0.0$((RANDOM % 10))$((RANDOM % 10))"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  latest="$("$CKPT" latest "$root" 2>/dev/null)" || { fail "random kill $i: nothing to resume from"; continue; }
  if [[ "$latest" == "$(step_dir "$root" "$step")" ]]; then
    previous=$step
  elif [[ "$latest" != "$(step_dir "$root" "$previous")" ]]; then
    fail "random kill $i: latest is $latest, expected step $previous or $step"
  fi
  "$CKPT" verify "$root" --step "$previous" >/dev/null || fail "random kill $i: step $previous does not verify"
done
echo "ok: 12 random kills, resume from $previous"

if [[ $failures -ne 0 ]]; then
  echo "test_store_faults: $failures failures" >&2
  exit 1
fi
echo "test_store_faults: all passed"
