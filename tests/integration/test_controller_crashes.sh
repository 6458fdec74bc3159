#!/usr/bin/env bash
# The controller killed with SIGKILL at every point of a recovery, then restarted: the job is requeued exactly
# once and runs again, and nothing recorded before the kill is lost (libslurm backend, a real node crash).
source "$(dirname "$0")/lib.sh"
BACKEND=libslurm
source "$CKPT_SOURCE_DIR/tests/integration/controller_harness.sh"
source "$CKPT_SOURCE_DIR/tests/integration/controller_scenarios.sh"

use_controller_in_plugstack
write_config

# Points in the order a recovery reaches them (see CKPT_CONTROLLER_CRASH_AT in controller/engine.cpp).
POINTS=${CKPT_CRASH_POINTS:-"failing decided intent marked-down requeued updated pending"}
for point in $POINTS; do
  wait_idle_nodes 4
  start_controller CKPT_CONTROLLER_CRASH_AT="$point"
  job=$(submit_job -N3 -- --step-ms 100 --every 10)
  wait_output "$SCRATCH/out.$job" "committed step 10" 60
  victim=$(second_node "$job")
  crash_node "$victim"
  # The controller must die at the point (SIGKILL: no cleanup, no flush beyond what it did itself).
  for _ in $(seq 300); do kill -0 "$CTL_PID" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$CTL_PID" 2>/dev/null && fail "the controller did not reach crash point '$point'"
  rc=0; wait "$CTL_PID" 2>/dev/null || rc=$?
  [ "$rc" -eq 137 ] || fail "the controller exited $rc at '$point', expected SIGKILL (137)"
  grep -q "crash point '$point' reached" "$SCRATCH/controller.log" || fail "no crash-point line for '$point'"
  CTL_PID=""
  sleep 1
  start_controller
  wait_output "$SCRATCH/out.$job" "run=1 step_id=0" 60
  wait_ctl_state "$job" '^running$' 20
  sleep 4  # a second requeue would show by now
  restarts=$(slurm_field "$job" Restarts)
  [ "$restarts" = 1 ] || { ctl history "$job" >&2; fail "after a crash at '$point' Slurm restarted job $job $restarts times"; }
  [ "$(grep -c "run=1 step_id=0" "$SCRATCH/out.$job")" -eq 3 ] || fail "run 1 does not have 3 ranks"
  grep -q "run=2" "$SCRATCH/out.$job" && fail "job $job ran a third time"
  ctl history "$job" > "$SCRATCH/history.$point"
  # Nothing lost: the failure and the decision made before the kill are in the history, once.
  assert_contains "$SCRATCH/history.$point" "running -> failing: failure reported"
  [ "$(grep -c "transition requeueing -> pending\|pending -> running\|requeueing -> running" "$SCRATCH/history.$point")" -ge 1 ] ||
    fail "history of job $job lacks the end of the recovery"
  [ "$(grep -c "running -> failing" "$SCRATCH/history.$point")" -eq 1 ] || fail "the failure was handled twice"
  job_json "$job" | json_get 'j["budget"]["restarts"]' | grep -x 1 > /dev/null || fail "the budget counts $(job_json "$job" | json_get 'j["budget"]["restarts"]') restarts"
  revive_node "$victim"
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  stop_controller
  pass "killed at '$point': one requeue, job $job runs again, history complete"
done
finish
