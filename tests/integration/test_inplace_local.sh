#!/usr/bin/env bash
# Restart in place without Slurm: slurm_ckpt.inplace alone (tests/hooks/inplace_test.py), the group's watchdog
# (tests/hooks/restart_test.py), then slurm-examples/train_ddp.py as 3 ranks and 1 spare on this host, started
# with the variables `ckpt-run --spares` gives each step. A rank is killed (SIGKILL) or frozen (SIGSTOP) mid-run:
# the survivors stay alive, the spare takes its rank over, and the final weights are bitwise identical to an
# uninterrupted run's; the same for slurm-examples/train_dp_tp.py (DP2 x TP2, subgroups), and with a second death
# while the job recovers (the replacement, or a survivor once the last words committed). With no spare, the
# survivors exit 75 (the requeue path), or with CKPT_SHRINK=on go on as fewer data-parallel replicas. The same on the real cluster: test_inplace_cluster.sh.
set -euo pipefail
: "${CKPT_BUILD_DIR:?}"
source "${CKPT_SOURCE_DIR:?}/tests/integration/torch_lib.sh"
have_torch || { echo "test_inplace_local: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }
W=$(mktemp -d /tmp/test_inplace_local.XXXXXX)
pids=()
stranger=""
cleanup() {
  for p in "${pids[@]}" $stranger; do kill -KILL "$p" 2>/dev/null || true; done
  pkill -KILL -f "tests/hooks/store_stranger.py" 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "FAIL: test_inplace_local: $*" >&2; echo "(kept in $W)" >&2; exit 1; }

(cd "$W" && "$PY" "$CKPT_SOURCE_DIR/tests/hooks/inplace_test.py") || fail "slurm_ckpt.inplace unit tests"
(cd "$W" && "$PY" "$CKPT_SOURCE_DIR/tests/hooks/restart_test.py") || fail "slurm_ckpt.restart watchdog tests"

source "$CKPT_SOURCE_DIR/tests/integration/inplace_local_lib.sh"

# A stranger on the node (another user when this runs as root) connects to every mailbox, to generation 0's store
# and to the spare's claim socket before the crash: it plants plans and rendezvous keys under plain names, tries
# to read the job's, sends the spare a claim with a guessed token, and keeps its connections open through the
# recovery.
as_stranger=() TEST_USER=${CKPT_TEST_USER:-ckptuser}
if [ "$(id -u)" -eq 0 ] && command -v runuser >/dev/null; then
  id "$TEST_USER" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$TEST_USER"
  as_stranger=(runuser -u "$TEST_USER" --)
fi
attack() {  # DIR: the run's dir
  local control=("$1"/ckpt/.control/inplace-*) targets
  targets=$("$PY" -c '
import json, sys
for path in sys.argv[1:]:
    e = json.load(open(path))
    e, kind = (e["mailbox"], "spare:") if "mailbox" in e else (e, "")
    print("%s%s:%s" % (kind, e["addr"], e["port"]))' "${control[0]}"/mailbox-* "${control[0]}/gen-0.plan" \
    "${control[0]}"/spare-*)
  (cd /tmp && exec "${as_stranger[@]}" "$PY" "$CKPT_SOURCE_DIR/tests/hooks/store_stranger.py" $targets) \
    > "$1/stranger.log" 2>&1 &
  stranger=$!
  for _ in $(seq 300); do grep -q "holding its connections" "$1/stranger.log" && break; sleep 0.05; done
}

launch reference 1
[ -s "$W/reference/final" ] || { cat "$W"/reference/log* >&2; fail "the uninterrupted run wrote no weights"; }
[ "${status[*]}" = "0 0 0 0" ] || fail "uninterrupted run: exit statuses ${status[*]} (the idle spare exits 0)"
echo "ok: uninterrupted: 3 ranks and an idle spare, all exit 0"

for case in "crash 2 KILL" "freeze 1 STOP"; do
  read -r name victim sig <<< "$case"
  launch "$name" 1 "$victim" "$sig" $((8 + RANDOM % 10))
  grep -q "in-place recovery 1: ranks \[$victim\] lost; spares \['h3.0'\] take them over" "$W/$name"/log* ||
    { tail -n 20 "$W/$name"/log* >&2; fail "$name: no in-place recovery of rank $victim"; }
  grep -q "spare h3.0 takes rank $victim over (generation 1)" "$W/$name/log3" || fail "$name: the spare did not take over"
  # run(..., warm=build): the spare built the model before it counted as ready, the survivors kept theirs
  warm_at=$(grep -n -m1 "spare h3.0: warm in [0-9.]* s; ready" "$W/$name/log3" | cut -d: -f1)
  took_at=$(grep -n -m1 "spare h3.0 takes rank" "$W/$name/log3" | cut -d: -f1)
  [ -n "$warm_at" ] && [ "$warm_at" -lt "$took_at" ] ||
    { head -n 5 "$W/$name/log3" >&2; fail "$name: the spare did not warm up before it was ready"; }
  cmp -s "$W/reference/final" "$W/$name/final" || fail "$name: the final weights differ"
  if [ "$sig" = STOP ]; then
    grep -q "this process is stale and leaves\|is fenced" "$W/$name/log$victim" ||
      { tail -n 15 "$W/$name/log$victim" >&2; fail "$name: the thawed rank did not leave as stale"; }
    ! grep -q "committed the terminal checkpoint" "$W/$name/log$victim" || fail "$name: the thawed rank committed"
  fi
  echo "ok: $name of rank $victim: the spare took it over in place; bitwise identical ($(grep -ho '"first_step": [0-9.]*' "$W/$name"/log* | head -1))"
done

# Slower steps: the stranger's attack (its start, then every mailbox, store and spare) must end before the run does.
STRANGER=1 STEP_SLEEP=0.4 launch hostile 1 1 KILL 10
[ "$(grep -c "planted 10 keys; read nothing" "$W/hostile/stranger.log")" = 4 ] &&
  [ "$(grep -c ": sent 4 malformed payloads" "$W/hostile/stranger.log")" = 5 ] &&
  grep -q "^spare:.*guessed token; holding a silent connection" "$W/hostile/stranger.log" ||
  { cat "$W/hostile/stranger.log" >&2; fail "hostile: the stranger did not reach the mailboxes, the store and the spare"; }
grep -q "spare h3.0 takes rank 1 over (generation 1)" "$W/hostile/log3" ||
  { tail -n 20 "$W/hostile"/log* >&2; fail "hostile: no recovery in place with a stranger on the stores"; }
cmp -s "$W/reference/final" "$W/hostile/final" || fail "hostile: the final weights differ"
echo "ok: a stranger on every mailbox, the store and the spare (malformed bytes first, then keys and claims) read nothing, planted nothing the job used and stopped nothing; bitwise identical"

# A survivor a step behind (tests/hooks/behind_ddp.py): rank 1's last collective of step 12 fails where rank 0's
# ended, then rank 2 dies. The terminal checkpoint is of step 12, which rank 1 does not hold; rank 0 sends it its
# state, as it sends the spare rank 2's: nobody reads more than the small blobs from the checkpoint dir.
CKPT_TEST_BEHIND_AT=12 PROGRAM=$CKPT_SOURCE_DIR/tests/hooks/behind_ddp.py launch behind 1
grep -q "replica dp1 of stage pp0 disqualified: at step 11, not the agreed step 12" "$W/behind"/log* ||
  { tail -n 20 "$W/behind"/log* >&2; fail "behind: the last words did not find rank 1 a step behind"; }
grep -q '"behind": *\[1\]' "$W/behind"/ckpt/.control/inplace-*/gen-1.plan ||
  { cat "$W/behind"/ckpt/.control/inplace-*/gen-1.plan >&2; fail "behind: the plan does not name rank 1 behind"; }
for r in 1 3; do
  line=$(grep -h "ckpt: rank [12]: restored step 12 from" "$W/behind/log$r" | tail -1)
  restore_figures "$line"
  [ -n "$read_b" ] && [ "$read_b" -lt 65536 ] && [ "${live_b:-0}" -gt 100000 ] ||
    { tail -n 20 "$W/behind/log$r" >&2; fail "behind: process $r did not restore step 12 from what rank 0 sent: $line"; }
done
cmp -s "$W/reference/final" "$W/behind/final" || fail "behind: the final weights differ"
echo "ok: a survivor a step behind and the spare took step 12 from rank 0's memory ($read_b bytes read); bitwise identical"

# DP2 x TP2 (train_dp_tp.py, which makes TP and DP subgroups): 2 "nodes" of 2 ranks and 1 spare. Rank 2's death
# leaves rank 3 blocked in a TP collective and ranks 0 and 1 in DP ones: the watchdog must shut the subgroups'
# sockets too, or a survivor misses the next generation.
launch_tp() {  # NAME [VICTIM]
  local d=$W/$1 i role tp_pids=()
  mkdir -p "$d/ckpt"
  for i in 0 1 2 3 4; do
    role=(CKPT_INPLACE_RANK_BASE=$((i - i % 2)))
    [ "$i" = 4 ] && role=(CKPT_INPLACE_SPARE=1)
    env -u SLURM_JOB_ID -u SLURM_STEP_ID CKPT_DIR="$d/ckpt" CKPT_LAST_WORDS=on CKPT_HEARTBEAT_TIMEOUT=1s \
      CKPT_INTERVAL=5steps CKPT_INPLACE_ID="local.$1" CKPT_INPLACE_WORLD=4 SLURM_PROCID=$((i % 2)) \
      SLURM_LOCALID=$((i % 2)) SLURMD_NODENAME="h$((i / 2))" CKPT_INPLACE_JOIN_TIMEOUT=5 "${role[@]}" \
      "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_dp_tp.py" --steps 30 --step-sleep 0.05 --out "$d/final" \
      > "$d/log$i" 2>&1 &
    tp_pids+=($!)
    pids+=($!)
  done
  if [ -n "${2:-}" ]; then
    for _ in $(seq 600); do
      [ "$({ sed -n 's/^train_dp_tp: step \([0-9]*\) .*/\1/p' "$d/log0" 2>/dev/null || true; } | tail -1)" -ge 10 ] \
        2>/dev/null && break
      sleep 0.02
    done
    kill -KILL "${tp_pids[$2]}"
  fi
  status=()
  for i in "${!tp_pids[@]}"; do wait "${tp_pids[$i]}" && status+=(0) || status+=($?); done
}
launch_tp tp-reference
[ "${status[*]}" = "0 0 0 0 0" ] || fail "DP x TP uninterrupted: exit statuses ${status[*]}"
launch_tp tp-crash 2
grep -q "spare h2.0 takes rank 2 over (generation 1)" "$W/tp-crash/log4" ||
  { tail -n 20 "$W/tp-crash"/log* >&2; fail "DP x TP: the spare did not take rank 2 over"; }
! grep -q "did not form" "$W/tp-crash"/log* || fail "DP x TP: generation 1 did not form at once"
for t in 0 1; do
  cmp -s "$W/tp-reference/final.tp$t" "$W/tp-crash/final.tp$t" || fail "DP x TP: slice tp$t differs"
done
echo "ok: DP x TP crash of rank 2: the spare took it over in place; bitwise identical"

# The replacement dies while it joins: in gloo's connect (the join timer and the roll call), or after the group
# formed but before the Checkpointer's heartbeat mesh did (the mesh's timeout and the roll call), or later (an
# ordinary recovery). Whichever, the second spare takes the rank over, in place.
for delay in 0 0.05; do
  name=replacement-$delay
  KILL_REPLACEMENT=$delay launch "$name" 2 2 KILL 10
  grep -q "spare h4.0 takes rank 2 over" "$W/$name/log4" ||
    { tail -n 20 "$W/$name"/log* >&2; fail "$name: the second spare did not take over"; }
  cmp -s "$W/reference/final" "$W/$name/final" || fail "$name: the final weights differ"
  # Dead after its group formed: the survivors' heartbeat networks, watching its mailbox, give up on it at once.
  ! grep -q "not every rank joined the mesh within" "$W/$name"/log* ||
    { grep -h "joined the mesh" "$W/$name"/log* >&2; fail "$name: the heartbeat network waited out its timeout"; }
  echo "ok: the replacement died $delay s after its claim: the second spare took rank 2 over; bitwise identical"
done
# Dead before it checked in (or in gloo's connect): the store's host finds its mailbox refusing and generation 1
# gives up on it at once, not at the join timeout.
grep -q "ranks \[2\] of generation 1 are gone: their mailboxes refuse connections" "$W/replacement-0"/log* ||
  { tail -n 20 "$W/replacement-0"/log* >&2; fail "replacement-0: the dead replacement was not found refusing"; }

# A survivor dies after the last words committed, before the next generation formed: rank 2 is killed, then rank
# 1 once the terminal checkpoint is committed (at step 12 or 13: not a periodic one). Generation 1 (the first spare
# for rank 2) cannot form without rank 1, whose mailbox refuses; generation 2 has the second spare take rank 1 over.
KILL_SURVIVOR=1 launch survivor-dies 2 2 KILL 12
grep -q "ranks \[1\] of generation 1 are gone: their mailboxes refuse connections" "$W/survivor-dies"/log* &&
  grep -q "spare h4.0 takes rank 1 over (generation 2)" "$W/survivor-dies/log4" ||
  { tail -n 20 "$W/survivor-dies"/log* >&2; fail "survivor-dies: rank 1 was not found gone and taken over"; }
cmp -s "$W/reference/final" "$W/survivor-dies/final" || fail "survivor-dies: the final weights differ"
echo "ok: a survivor died after the last words: found gone at once, the second spare took it over; bitwise identical"

# No spare, but CKPT_SHRINK=on (--ckpt-shrink=on): rank 1 dies and the survivors go on in place as 2 data-parallel
# replicas, rank 2 renumbered 1, each from the state it holds; they finish the run, nobody exits 75.
CKPT_SHRINK=on launch shrink 0 1 KILL 10
[ "${status[0]}" = 0 ] && [ "${status[2]}" = 0 ] ||
  { tail -n 20 "$W/shrink"/log* >&2; fail "shrink: survivors exited ${status[0]} and ${status[2]}, not 0"; }
grep -q "in-place recovery 1: ranks \[1\] lost; no spare left: 2 of 3 data-parallel replicas go on (CKPT_SHRINK)" \
  "$W/shrink/log0" || { tail -n 20 "$W/shrink"/log* >&2; fail "shrink: no recovery with 2 replicas"; }
resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\) (2 ranks,.*/\1/p' "$W/shrink/log0" | tail -1)
[ -n "$resumed" ] && [ "$resumed" -ge 9 ] || fail "shrink: did not resume on 2 ranks from step 9 or later (${resumed:-none})"
grep -q "done after step 30" "$W/shrink/log0" && [ -s "$W/shrink/final" ] || fail "shrink: training did not finish"
grep -q "ckpt: rank 1: restored step $resumed from .* found in memory)" "$W/shrink/log2" ||
  { tail -n 10 "$W/shrink/log2" >&2; fail "shrink: the old rank 2 did not restore as rank 1 from its own memory"; }
! grep -q "handing over to ckpt-run" "$W/shrink"/log* || fail "shrink: a survivor handed over"
echo "ok: no spare, CKPT_SHRINK=on: rank 1 lost, 2 replicas went on in place from step $resumed and finished"

# Both: a survivor a step behind (as above) and no spare, CKPT_SHRINK=on. Rank 2 dies, the survivors go on as 2
# replicas and rank 1 takes step 12 from rank 0's memory, reading only the small blobs; the same run with
# CKPT_INPLACE_STATE=files (every rank reads its shard) ends with the same weights.
for state in memory files; do
  CKPT_INPLACE_STATE=$state CKPT_SHRINK=on CKPT_TEST_BEHIND_AT=12 PROGRAM=$CKPT_SOURCE_DIR/tests/hooks/behind_ddp.py \
    launch "behind_shrink_$state" 0
  [ "${status[0]}" = 0 ] && [ "${status[1]}" = 0 ] ||
    { tail -n 20 "$W/behind_shrink_$state"/log* >&2; fail "behind, shrink ($state): exits ${status[*]}, not 0 0"; }
done
grep -q '"behind": *\[1\]' "$W/behind_shrink_memory"/ckpt/.control/inplace-*/gen-1.plan ||
  { cat "$W/behind_shrink_memory"/ckpt/.control/inplace-*/gen-1.plan >&2; fail "behind, shrink: rank 1 not behind"; }
line=$(grep -h "ckpt: rank 1: restored step 12 from" "$W/behind_shrink_memory/log1" | tail -1)
restore_figures "$line"
[ -n "$read_b" ] && [ "$read_b" -lt 65536 ] && [ "${live_b:-0}" -gt 100000 ] ||
  { tail -n 20 "$W/behind_shrink_memory/log1" >&2; fail "behind, shrink: rank 1 did not take step 12 from rank 0: $line"; }
[ -s "$W/behind_shrink_memory/final" ] && cmp -s "$W/behind_shrink_files/final" "$W/behind_shrink_memory/final" ||
  fail "behind, shrink: the final weights differ from the run that read every shard"
echo "ok: a survivor a step behind, no spare, CKPT_SHRINK=on: it took step 12 from rank 0 ($read_b bytes read) as 2 replicas went on; bitwise identical to reading the shards"

launch nospare 0 2 KILL 10
[ "${status[0]}" = 75 ] && [ "${status[1]}" = 75 ] || fail "no spare: survivors exited ${status[0]} and ${status[1]}, not 75"
grep -q "cannot recover in place (1 ranks lost, 0 spares ready); handing over to ckpt-run" "$W/nospare"/log* ||
  fail "no spare: no hand-over line"
grep -q '"lost":\[2\]' "$W/nospare"/ckpt/.control/inplace-*/abandoned ||
  { cat "$W/nospare"/ckpt/.control/inplace-*/abandoned >&2; fail "no spare: the abandoned marker does not name rank 2 lost"; }
echo "ok: no spare: the survivors exit 75 for ckpt-run (a relaunch inside the allocation, or a requeue), naming rank 2 lost"
rm -rf "$W"
echo "PASS: test_inplace_local"
