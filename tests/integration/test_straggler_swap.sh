#!/usr/bin/env bash
# A straggler with a spare: slurm-examples/train_ddp.py on 3 nodes and one spare under `ckpt-run --spares 1` and
# the recovery controller, with --ckpt-straggler=0.5,swap. One training node is held to a quarter of the CPU its
# task used (cluster.sh slow-node), its daemons not.
#  - The root names it within 24 steps and, a spare being free, floods the swap; the slow node's rank ends at its
#    next step boundary (exit 76), the survivors' last words hold that very step, and the spare takes the rank
#    over in place: no step lost, no requeue.
#  - The step rate after the swap is clearly above the slow one (1.5 times or more; 2.9 measured under CI's load) and
#    not far below the rate before the slowdown (0.98 of it on a quiet host, 0.71 to 0.88 under CI's load, where the
#    tests beside it come and go: bounded loosely at 0.5), and the final weights equal an uninterrupted run's bit for
#    bit.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/controller_lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
[ -x "$CKPT_BUILD_DIR/ckpt-run/ckpt-run" ] || fail "ckpt-run is not built"
STEPS=100
DETECT_BOUND_STEPS=24
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 70 ))
job="" slow=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  [ -n "$slow" ] && "$CLUSTER" unslow-node "$slow" > /dev/null 2>&1 || true
  controller_down
}
trap cleanup EXIT
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"

inplace_job "$SCRATCH/job.sbatch" "--ckpt-straggler=0.5,swap" \
  "--steps $STEPS --ckpt-interval-steps 1000 --step-sleep 0.05 --log-every 1 --log-time --d-model 96"
# submit NAME: the job on 4 nodes (3 train, 1 spare), into $SCRATCH/NAME; sets `job`.
submit() {
  mkdir -p "$SCRATCH/$1"
  job=$(sbatch --parsable -N4 -J "swap-$1" -o "$SCRATCH/$1/log" --ckpt-dir="$SCRATCH/$1/ckpt" \
    "$SCRATCH/job.sbatch" --out "$SCRATCH/$1/final")
}
wait_gone() {
  for _ in $(seq 900); do squeue -h -j "$job" 2>/dev/null | grep -q . || return 0; sleep 0.2; done
  fail "job $job did not end: $(tail -5 "$SCRATCH/$1/log")"
}
# rate LOG FROM TO: steps per second between the steps FROM and TO as the log's t= stamps say.
rate() {
  awk -v a="$2" -v b="$3" '/^train_ddp: step [0-9]+ .* t=/ { n = $3; t = $NF; sub("t=", "", t); T[n] = t }
    END { if (!(a in T) || !(b in T) || T[b] <= T[a]) exit 1; printf "%.2f", (b - a) / (T[b] - T[a]) }' "$1"
}

submit reference
wait_gone reference
[ -s "$SCRATCH/reference/final" ] || { cat "$SCRATCH/reference/log" >&2; fail "the uninterrupted run failed"; }
pass "uninterrupted run: 3 nodes train, one waits as the spare"

submit swap
log=$SCRATCH/swap/log
wait_logged_step "$log" 20 || { cat "$log" >&2; fail "the job did not reach step 20"; }
slow=n2
share=$("$CLUSTER" task-cpu "$slow" 2) || fail "cannot measure the CPU of $slow's task"
"$CLUSTER" slow-node "$slow" "$(awk -v s="$share" 'BEGIN { f = s / 4; if (f < 0.05) f = 0.05; printf "%.3f", f }')" \
  > /dev/null || fail "slow-node failed"
slowed_at=$(logged_step "$log")
before=$(rate "$log" 5 "$slowed_at") || fail "no step rate before the slowdown"
echo "$slow's task used $share of a CPU; held to a quarter of it from step ~$slowed_at; $before steps/s before"

for _ in $(seq 1200); do grep -q "^train_ddp: resumed from step" "$log" && break; sleep 0.05; done
line=$(grep -m1 "ckpt: .*straggler: node " "$log") || { tail -30 "$log" >&2; fail "no straggler was reported"; }
echo "$line"
case $line in *"node $slow runs at "*"hand over to a warm spare"*) ;; *) fail "not a swap of $slow: $line" ;; esac
last=$(sed -n 's/.*, steps [0-9]*-\([0-9]*\) (rank.*/\1/p' <<< "$line")
took=$((last + 1 - slowed_at))
[ "$took" -le "$DETECT_BOUND_STEPS" ] || fail "detected $took steps after the slowdown (bound $DETECT_BOUND_STEPS)"
left=$(sed -n 's/.*warm spare takes it over (after step \([0-9]*\); exit 76).*/\1/p' "$log" | head -1)
[ -n "$left" ] || { tail -30 "$log" >&2; fail "the slow node's rank did not end at a step boundary"; }
grep -q "in-place recovery 1: ranks \[1\] lost; spares \['n4.0'\] take them over" "$log" ||
  { tail -30 "$log" >&2; fail "the spare did not take the slow node's rank over in place"; }
resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\).*/\1/p' "$log" | tail -1)
[ "$resumed" = "$left" ] || fail "resumed from step ${resumed:-?}; the slow rank ended after step $left (a step lost)"
pass "$slow named $took steps after the slowdown; its rank ended after step $left and the spare took it over from step $resumed"

wait_gone swap
"$CLUSTER" unslow-node "$slow" > /dev/null 2>&1 || true
slow=""
assert_not_contains "$log" "run 1 on"
cmp -s "$SCRATCH/reference/final" "$SCRATCH/swap/final" || fail "the final weights differ from the uninterrupted run's"
after=$(rate "$log" $((resumed + 5)) "$STEPS") || fail "no step rate after the swap"
during=$(rate "$log" "$slowed_at" "$left") || fail "no step rate while the node was slow"
ratio=$(awk -v a="$after" -v b="$before" 'BEGIN { printf "%.2f", a / b }')
gain=$(awk -v a="$after" -v d="$during" 'BEGIN { printf "%.2f", a / d }')
# A timed test on a loaded CI host bounds loosely (bench/straggler measures the rate): the swap must take the job
# well out of the slow node's pace (the slow node ran at a quarter), and not leave it far below the rate before.
awk -v g="$gain" -v r="$ratio" 'BEGIN { exit !(g >= 1.5 && r >= 0.5) }' ||
  fail "after the swap $after steps/s: $gain times the $during while slow, $ratio of the $before before the slowdown"
for _ in $(seq 50); do ctl history "$job" 2>/dev/null | grep -q "slow node $slow" && break; sleep 0.2; done
ctl history "$job" > "$SCRATCH/history" 2>&1 || true
assert_contains "$SCRATCH/history" "slow node $slow"
assert_contains "$SCRATCH/history" "(in-place)"
pass "after the swap $after steps/s, $gain times the $during while slow and $ratio of the $before before the slowdown; bitwise identical; the controller recorded the slow node and the in-place recovery"
finish
