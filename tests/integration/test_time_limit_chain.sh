#!/usr/bin/env bash
# A training longer than its time limit runs as a chain of allocations: at the limit the ranks take a terminal
# checkpoint and the next allocation resumes from it. With the recovery controller, the controller requeues the job
# at once and records each stop; without one, the job requeues itself (CKPT_REQUEUE=self). Both chains' final
# weights must be bitwise identical to an uninterrupted run's. A job that finishes is not requeued, and neither is
# one the user cancels.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
source "$(dirname "$0")/controller_lib.sh"
trap controller_down EXIT
have_torch || fail "needs python3-torch and a built slurm_ckpt"
"$CLUSTER" up > /dev/null
# The same training everywhere. The chains sleep 0.15 s a step: 45 s of sleep alone outlast a one-minute allocation
# less its 20 s grace, so each needs a second allocation even on a fast host, and rarely a third on a loaded one.
STEPS=300
ARGS="--steps $STEPS --log-every 50"
CHAIN_SLEEP=0.15

job_field() { scontrol show job "$1" 2>/dev/null | sed -n "s/.*[[:space:]]$2=\([^ ]*\).*/\1/p" | sed -n 1p; }
wait_state() {  # JOB REGEX TIMEOUT
  local state=""
  for _ in $(seq $(($3 * 4))); do
    state=$(job_field "$1" JobState)
    [[ $state =~ $2 ]] && return 0
    sleep 0.25
  done
  fail "job $1 is '$state' after $3 s, expected $2"
}

# Two phases of two jobs side by side, on two nodes each: first without the recovery controller (the reference
# and the self-requeued chain), then under it (the controller's chain and a cancelled job). Each job's checks are
# its own; running them in pairs halves the time the four one-minute allocations and Slurm's waits take.

# The uninterrupted reference: the same training with room to finish. It ends COMPLETED and is never requeued.
# (-t 10: the loaded 2-core CI host once took over 3 minutes for 1000 steps.)
write_train_sbatch "$SCRATCH/ref.sh" "-N2 -n2 -t 10 -o $SCRATCH/ref.out --ckpt-dir=$SCRATCH/ref/ckpt --ckpt-interval=1h" \
  train_ddp.py $ARGS --step-sleep 0.01 --out "$SCRATCH/ref/final.bin"
mkdir -p "$SCRATCH/ref"
ref=$(sbatch --parsable "$SCRATCH/ref.sh")

# Without the controller the job requeues itself. Slurm then holds it for its credential lifetime (about 2
# minutes) before it may run again; that wait is Slurm's, so once the job is pending again the test starts it at
# once, as the controller would, and checks that the new run resumes from the terminal checkpoint and finishes.
write_train_sbatch "$SCRATCH/chain.sh" \
  "-N2 -n2 -t 1 -o $SCRATCH/chain.out --ckpt-dir=$SCRATCH/chain/ckpt --ckpt-interval=1h --ckpt-grace=20s" \
  train_ddp.py $ARGS --step-sleep "$CHAIN_SLEEP" --out "$SCRATCH/chain/final.bin"
mkdir -p "$SCRATCH/chain"
chain=$(sbatch --parsable "$SCRATCH/chain.sh")

wait_state "$ref" 'COMPLETED|FAILED|CANCELLED|TIMEOUT' 540
[ "$(job_field "$ref" JobState)" = COMPLETED ] || { cat "$SCRATCH/ref.out" >&2; fail "the reference run did not complete"; }
[ -s "$SCRATCH/ref/final.bin" ] || fail "the reference run wrote no weights"
sleep 3
[ "$(job_field "$ref" JobState)" = COMPLETED ] && [ "$(job_field "$ref" Restarts)" = 0 ] ||
  fail "a finished job was requeued: $(job_field "$ref" JobState), restarts $(job_field "$ref" Restarts)"
assert_not_contains "$SCRATCH/ref.out" "time-limit stop"
pass "a job that finishes its training ends COMPLETED and is not requeued"

for _ in $(seq 480); do
  [ "$(job_field "$chain" Restarts)" = 1 ] && [ "$(job_field "$chain" JobState)" = PENDING ] && break
  sleep 0.25
done
[ "$(job_field "$chain" Restarts)" -ge 1 ] || { cat "$SCRATCH/chain.out" >&2; fail "the job did not requeue itself"; }
assert_contains "$SCRATCH/chain.out" "the job requeues itself (scontrol requeue $chain)"
# Each time it is pending again (a loaded host may need a third run), it starts at once rather than after Slurm's
# hold.
for _ in $(seq 1200); do
  state=$(job_field "$chain" JobState)
  [[ $state =~ COMPLETED|FAILED|CANCELLED|TIMEOUT ]] && break
  [ "$state" = PENDING ] && { scontrol update JobId="$chain" StartTime=now 2>/dev/null || true; }
  sleep 0.25
done
[ "$(job_field "$chain" JobState)" = COMPLETED ] && [ -s "$SCRATCH/chain/final.bin" ] ||
  { cat "$SCRATCH/chain.out" >&2; fail "the self-requeued chain did not complete"; }
stop=$(sed -n 's/.*time-limit stop at step \([0-9]*\): the job requeues itself.*/\1/p' "$SCRATCH/chain.out" | head -1)
[ -n "$stop" ] || fail "no time-limit stop logged"
assert_contains "$SCRATCH/chain.out" "train_ddp: resumed from step $stop"
assert_contains "$SCRATCH/chain.out" "train_ddp: step $STEPS "
cmp "$SCRATCH/ref/final.bin" "$SCRATCH/chain/final.bin" || fail "the self-requeued chain ended with other weights"
pass "without a controller: the job requeued itself at step $stop, and its next run resumed there and finished with the uninterrupted run's weights"

# The chain under the recovery controller, a one-minute limit with 20 s of grace for the terminal checkpoint: the
# controller reads each run's record and requeues the job at once.
PORT=$(( ${CKPT_CONTROLLER_TEST_PORT:-16840} + 70 ))
controller_up "$SCRATCH" "$PORT" > /dev/null || fail "no controller"
write_train_sbatch "$SCRATCH/ctl.sh" \
  "-N2 -n2 -t 1 -o $SCRATCH/ctl.out --ckpt-dir=$SCRATCH/ctl/ckpt --ckpt-interval=1h --ckpt-grace=20s" \
  train_ddp.py $ARGS --step-sleep "$CHAIN_SLEEP" --out "$SCRATCH/ctl/final.bin"
mkdir -p "$SCRATCH/ctl"
ctl=$(sbatch --parsable "$SCRATCH/ctl.sh")

# A user's scancel, with the controller watching: the ranks take their terminal checkpoint on SIGTERM, and the job
# stays cancelled.
write_train_sbatch "$SCRATCH/cancel.sh" "-N2 -n2 -t 5 -o $SCRATCH/cancel.out --ckpt-dir=$SCRATCH/cancel/ckpt --ckpt-interval=1h" \
  train_ddp.py $ARGS --step-sleep "$CHAIN_SLEEP" --out "$SCRATCH/cancel/final.bin"
cancel=$(sbatch --parsable "$SCRATCH/cancel.sh")

for _ in $(seq 480); do grep -q "train_ddp: step 100" "$SCRATCH/cancel.out" 2>/dev/null && break; sleep 0.25; done
assert_contains "$SCRATCH/cancel.out" "train_ddp: step 100"
scancel "$cancel"
wait_state "$cancel" 'CANCELLED|COMPLETED|FAILED' 60
sleep 5
[ "$(job_field "$cancel" JobState)" = CANCELLED ] && [ "$(job_field "$cancel" Restarts)" = 0 ] ||
  fail "a cancelled job came back: $(job_field "$cancel" JobState), restarts $(job_field "$cancel" Restarts)"
assert_not_contains "$SCRATCH/cancel.out" "time-limit stop"
pass "scancel ends the job for good"

# Between two runs the job is briefly COMPLETED (the run ended; the controller has not requeued it yet): wait for
# the training's end, then for the job's.
for _ in $(seq 1200); do [ -s "$SCRATCH/ctl/final.bin" ] && break; sleep 0.25; done
wait_state "$ctl" 'COMPLETED|FAILED|CANCELLED|TIMEOUT' 60
[ "$(job_field "$ctl" JobState)" = COMPLETED ] && [ -s "$SCRATCH/ctl/final.bin" ] ||
  { cat "$SCRATCH/ctl.out" "$SCRATCH/controller.log" >&2; fail "the controller's chain did not complete"; }
ctl_runs=$(job_field "$ctl" Restarts)
[ "${ctl_runs:-0}" -ge 1 ] || fail "the job finished in one allocation under the controller; nothing was tested"
assert_contains "$SCRATCH/ctl.out" "the recovery controller continues the job in a new allocation"
assert_not_contains "$SCRATCH/ctl.out" "the job requeues itself"
"$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$SCRATCH/controller.conf" history "$ctl" > "$SCRATCH/ctl.history"
[ "$(grep -c "stopped for its time limit after a terminal checkpoint" "$SCRATCH/ctl.history")" -eq "$ctl_runs" ] ||
  { cat "$SCRATCH/ctl.history" >&2; fail "the controller's history does not show each of the $ctl_runs time-limit stops"; }
cmp "$SCRATCH/ref/final.bin" "$SCRATCH/ctl/final.bin" || fail "the controller's chain ended with other weights"
pass "under the controller: $((ctl_runs + 1)) allocations, each stop in its history; weights bitwise identical"

controller_down
finish
