# The controller's scenario suite, run unchanged against both backends (BACKEND=libslurm|rest).
# Each scenario submits real jobs to the local cluster and checks what Slurm and the controller did.

wait_idle_nodes() {  # wait_idle_nodes N: N nodes up and idle (a crashed node from a test before is revived)
  for _ in $(seq 120); do
    [ "$(sinfo -h -N -o '%T' | grep -cE '^idle$')" -ge "$1" ] && return 0
    sleep 0.5
  done
  sinfo -N >&2
  fail "fewer than $1 idle nodes"
}

# Recovery times from the controller's clock and the crash time: prints one line, sets TOTAL.
report_times() {  # report_times JOB CRASH_TIME LABEL [SRUN_START]
  local job=$1 t0=$2 label=$3 srun_start=${4:-}
  local clock; clock=$(job_json "$job" | json_get 'j["clock"]')
  TOTAL=$("$PY" - "$clock" "$t0" "$label" "$srun_start" <<'PY'
import json, sys
c, t0, label, srun = json.loads(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
slurm_end = float(srun) if srun else c["slurm_done"]
parts = [("detection", c["failed"] - t0), ("decision", c["decided"] - c["failed"]),
         ("slurm", slurm_end - c["decided"]), ("launch", c["launched"] - slurm_end)]
total = c["launched"] - t0
print("%s: failure to running again %.2f s = " % (label, total) + ", ".join("%s %.2f s" % p for p in parts),
      file=sys.stderr)
print("%.3f" % total)
PY
)
  echo "TIMING $label total=$TOTAL" >> "$SCRATCH/timings"
}

# After a requeue off a crashed node: waits until the controller saw run 1 launched, reports the recovery times
# (sets TOTAL), and checks that run 1 stayed off the victim; sets RUN1_NODES to the nodes run 1 has ranks on.
check_requeued() {  # check_requeued JOB CRASH_TIME LABEL VICTIM
  local job=$1 t0=$2 label=$3 victim=$4
  wait_ctl_state "$job" '^running$' 10
  for _ in $(seq 30); do
    [ "$(job_json "$job" | json_get 'j["clock"]["launched"]')" != "0.0" ] && break
    sleep 0.2
  done
  report_times "$job" "$t0" "$label" >/dev/null
  RUN1_NODES=$(grep "run=1 step_id=0" "$SCRATCH/out.$job" | grep -oE "node=[^ ]+" | cut -d= -f2 | sort | tr '\n' ' ')
  [[ " $RUN1_NODES " != *" $victim "* ]] || fail "run 1 went back to the crashed node $victim: $RUN1_NODES"
}

# start_training STEP [sbatch options]: a test job on the idle cluster, running under the controller and past STEP;
# sets JOB, and VICTIM (its second node: never the batch host).
start_training() {
  local step=$1
  shift
  wait_idle_nodes 4
  JOB=$(submit_job "$@" -- --step-ms 100 --every 10)
  wait_output "$SCRATCH/out.$JOB" "committed step $step" 60
  wait_ctl_state "$JOB" '^running$' 10
  VICTIM=$(second_node "$JOB")
}

scenario_node_crash_requeue() {
  start_training 20 -N3
  local job=$JOB victim=$VICTIM
  local batch_host; batch_host=$(slurm_field "$job" BatchHost)
  [ "$victim" != "$batch_host" ] || fail "picked the batch host"
  local before; before=$(grep -c "committed step" "$SCRATCH/out.$job")
  local last_committed; last_committed=$(grep "committed step" "$SCRATCH/out.$job" | tail -1 | awk '{print $4}')
  local t0; t0=$(date +%s.%N)
  crash_node "$victim"
  wait_output "$SCRATCH/out.$job" "run=1 step_id=0" $([ "$BACKEND" = rest ] && echo 90 || echo 40)
  check_requeued "$job" "$t0" "$BACKEND requeue after a node crash" "$victim"
  local nodes=$RUN1_NODES
  [ "$(echo $nodes | wc -w)" -eq 3 ] || fail "run 1 has ranks on '$nodes'"
  # It resumed from the newest complete checkpoint the controller saw at the decision.
  local newest; newest=$(ctl history "$job" | grep -oE "newest complete checkpoint: step [0-9]+" | sed -n 1p | awk '{print $NF}')
  [ -n "$newest" ] || fail "no checkpoint in the decision"
  [ "$newest" -ge "$last_committed" ] || fail "decision saw step $newest, but step $last_committed was committed"
  grep "run=1 step_id=0" "$SCRATCH/out.$job" | grep "resume=$newest " > /dev/null || {
    cat "$SCRATCH/out.$job" >&2; fail "run 1 did not resume from step $newest"; }
  [ "$(slurm_field "$job" Restarts)" = 1 ] || fail "Slurm restart count is $(slurm_field "$job" Restarts), expected 1"
  [ "$(slurm_field "$job" ExcNodeList)" = "$victim" ] || fail "ExcNodeList is $(slurm_field "$job" ExcNodeList)"
  ctl status | grep -E "^  $victim \(jobs ([0-9]+,)*$job(,[0-9]+)*\)" > /dev/null || { ctl status >&2; fail "status does not show $victim excluded"; }
  curl -sf "$CTL_URL/metrics" > "$SCRATCH/metrics"
  assert_contains "$SCRATCH/metrics" 'ckpt_controller_restarts_total{ending="node failure",path="requeue"} 1'
  assert_contains "$SCRATCH/metrics" 'ckpt_controller_recovery_seconds_count{path="requeue"} 1'
  assert_contains "$SCRATCH/metrics" "ckpt_controller_node_excluded{node=\"$victim\"} 1"
  # How fast is a benchmark's to say (bench/inplace/run.sh, mode requeue), not a timed bound's on a loaded CI host:
  # the run above had 40 s to start, and check_requeued printed each phase. (15.03 s against a bound of 15 once,
  # 11.6 s of it Slurm's scheduling.)
  revive_node "$victim"
  # An admin takes the node back: the job no longer excludes it.
  ctl forget-node "$victim" > "$SCRATCH/forget" || fail "forget-node failed"
  assert_contains "$SCRATCH/forget" "node $victim forgotten by"
  ctl status | grep -E "^  $victim " > /dev/null && { ctl status >&2; fail "status still shows $victim excluded"; }
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  pass "$BACKEND: node crash: job $job runs again on $nodes from step $newest in $TOTAL s, $victim excluded"
}

# A job that excludes a node itself (--exclude=n4) loses another: the requeue's ExcNodeList holds both, so the user's
# own word survives the controller's update (which replaces Slurm's list), and the job never runs on n4.
scenario_own_exclusions_kept() {
  start_training 10 -N2 --exclude=n4
  local job=$JOB victim=$VICTIM
  crash_node "$victim"
  wait_output "$SCRATCH/out.$job" "run=1 step_id=0" 40
  local excluded; excluded=$(scontrol show hostnames "$(slurm_field "$job" ExcNodeList)" | sort | tr '\n' ' ')
  [ "$excluded" = "$(printf '%s\n' "$victim" n4 | sort | tr '\n' ' ')" ] || fail "ExcNodeList is '$excluded', not $victim and n4"
  scontrol show hostnames "$(slurm_field "$job" NodeList)" | grep -qx n4 && fail "run 1 went to n4, which the job excludes"
  ctl history "$job" > "$SCRATCH/history.$job" 2>&1
  assert_contains "$SCRATCH/history.$job" "the job excludes n4 itself"
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  revive_node "$victim"
  ctl forget-node "$victim" > /dev/null || fail "forget-node failed"
  pass "$BACKEND: a job that excludes n4 itself and lost $victim runs again without either (ExcNodeList $excluded)"
}

# A job that needs every node of the 4-node cluster (-N4, no spare) loses one: the requeue excludes it, and the job
# waits, as it must, while the node is away. Once an admin takes the node back (forget-node), the pending job's
# ExcNodeList must lose it too, or the job would wait for good (a job sized to its partition or reservation).
# wait_history JOB TEXT: until the controller's history of JOB holds TEXT (10 s).
wait_history() {
  for _ in $(seq 50); do ctl history "$1" 2>&1 | grep -qF -- "$2" && return 0; sleep 0.2; done
  ctl history "$1" >&2
  fail "the history of job $1 never said: $2"
}

scenario_forgotten_node_releases() {
  start_training 10 -N4
  local job=$JOB victim=$VICTIM
  crash_node "$victim"
  wait_ctl_state "$job" '^pending$' $([ "$BACKEND" = rest ] && echo 90 || echo 40)
  [ "$(slurm_field "$job" ExcNodeList)" = "$victim" ] || fail "ExcNodeList is $(slurm_field "$job" ExcNodeList), not $victim"
  revive_node "$victim"
  # Slurm's scheduler finds that the job can never start as it stands and holds it (BadConstraints): at its next
  # pass, within SchedulerParameters' sched_interval (60 s by default). The controller says why, once.
  local reason=""
  for _ in $(seq 350); do
    reason=$(slurm_field "$job" Reason)
    [ "$reason" = BadConstraints ] && break
    sleep 0.2
  done
  [ "$(slurm_field "$job" JobState)" = PENDING ] || fail "job $job is $(slurm_field "$job" JobState) while it excludes $victim"
  [ "$reason" = BadConstraints ] || fail "Slurm gave job $job the reason '$reason', not BadConstraints, in 70 s"
  local why="Slurm cannot start the job as it stands (BadConstraints) while it excludes $victim"
  wait_history "$job" "$why"
  local own=""
  if [ "$BACKEND" = libslurm ]; then
    # The job's user excludes one more node by hand (scontrol update): it is theirs, and the update that lets the
    # forgotten node go keeps it (the job then still cannot start: it needs all 4 nodes).
    for own in n1 n2 n3 n4; do [ "$own" != "$victim" ] && break; done
    scontrol update JobId="$job" ExcNodeList="$victim,$own" || fail "scontrol update ExcNodeList failed"
    wait_history "$job" "the job's own exclusions are now $own (its ExcNodeList changed in Slurm)"
  fi
  ctl forget-node "$victim" > "$SCRATCH/forget" || fail "forget-node failed"
  wait_history "$job" "($victim no longer excluded"
  if [ -n "$own" ]; then
    [ "$(slurm_field "$job" ExcNodeList)" = "$own" ] ||
      fail "ExcNodeList is $(slurm_field "$job" ExcNodeList) after forget-node $victim, not the user's $own"
    [ "$(slurm_field "$job" JobState)" = PENDING ] || fail "job $job is $(slurm_field "$job" JobState) while it excludes $own"
    # The user takes it out again; Slurm may have held the job once more meanwhile (BadConstraints): they release it.
    scontrol update JobId="$job" ExcNodeList= || fail "scontrol update ExcNodeList= failed"
    wait_history "$job" "the job's own exclusions are now (none)"
    scontrol release "$job" 2> /dev/null || true
  fi
  wait_output "$SCRATCH/out.$job" "run=1 step_id=0" 40
  local nodes; nodes=$(slurm_field "$job" NumNodes)
  [ "${nodes%%-*}" = 4 ] || { scontrol show job "$job" >&2; fail "run 1 has $nodes nodes, expected 4"; }
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  pass "$BACKEND: a job of 4 nodes that lost $victim waits while it is excluded and runs on all 4 once an admin forgets it"
}

# A job whose allocation held a spare (ckpt-run's steps say so: CKPT_RUN_SPARES) loses a node on the 4-node
# cluster: three nodes are left of the four it asked for, so the requeue lets it start without its spare
# (MinNodes=3) instead of waiting for a fourth node for good. Its allocation asked for 2 tasks a node (8): on 3
# nodes those fit only as 6: with 8, Slurm keeps it pending for good (NumTasks=6, requeue_min_tasks).
scenario_spares_requeue() {
  wait_idle_nodes 4
  export CKPT_RUN_SPARES=1  # what ckpt-run --spares 1 sets in every step it starts
  local job; job=$(submit_job -N4 --ntasks-per-node=2 -- --step-ms 100 --every 10)
  unset CKPT_RUN_SPARES
  wait_output "$SCRATCH/out.$job" "committed step 10" 60
  wait_ctl_state "$job" '^running$' 10
  local victim; victim=$(second_node "$job")
  crash_node "$victim"
  wait_output "$SCRATCH/out.$job" "run=1 step_id=0" 40
  ctl history "$job" > "$SCRATCH/history.$job" 2>&1
  assert_contains "$SCRATCH/history.$job" "ExcNodeList=$victim MinNodes=3 NumTasks=6"
  local nodes; nodes=$(slurm_field "$job" NumNodes)
  [ "${nodes%%-*}" = 3 ] || { scontrol show job "$job" >&2; fail "run 1 has $nodes nodes, expected 3 of 4"; }
  scontrol show hostnames "$(slurm_field "$job" NodeList)" | grep -qx "$victim" && fail "run 1 went back to $victim"
  revive_node "$victim"
  ctl forget-node "$victim" > /dev/null || fail "forget-node failed"
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  pass "$BACKEND: a job that held a spare lost $victim and ran again on 3 nodes (MinNodes=3 NumTasks=6), not waiting for a fourth"
}

scenario_crash_loop() {
  wait_idle_nodes 3
  : > "$SCRATCH/alerts"
  local job; job=$(submit_job -N3 --ckpt-max-restarts=2 -- --step-ms 50 --every 0 --fail-rank 1 --fail-step 5)
  wait_ctl_state "$job" '^gave-up$' 120
  wait_job_state "$job" '^(FAILED|COMPLETED)$' 30
  sleep 3  # nothing may requeue it after the give-up
  local restarts; restarts=$(slurm_field "$job" Restarts)
  ctl status > "$SCRATCH/status"
  for _ in $(seq 50); do grep -q "\"job_id\": *$job" "$SCRATCH/alerts" && break; sleep 0.1; done
  grep "\"job_id\": *$job" "$SCRATCH/alerts" | grep '"event": *"gave_up"' > /dev/null || {
    cat "$SCRATCH/alerts" >&2; fail "the webhook got no gave_up alert for job $job"; }
  if [ "$BACKEND" = libslurm ]; then
    [ "$restarts" = 2 ] || fail "Slurm restarted the job $restarts times, expected 2"
    assert_contains "$SCRATCH/status" "job $job: task crash after 2 restarts without progress (budget 2; newest complete checkpoint: none)"
    # Only an admin may release it; then it gets a fresh budget and stops again after 2 more restarts.
    expect_fail runuser -u "$TEST_USER" -- "$CTL" -c "$SCRATCH/controller.conf" release "$job"
    assert_contains "$SCRATCH/err" "ckpt-controller: uid $(id -u "$TEST_USER") may not release (admin_users)"
    ctl release "$job" > "$SCRATCH/release" || fail "release failed"
    assert_contains "$SCRATCH/release" "job $job released"
    wait_ctl_state "$job" '^gave-up$' 120
    wait_job_state "$job" '^(FAILED|COMPLETED)$' 30
    [ "$(slurm_field "$job" Restarts)" = 5 ] || fail "after release Slurm restarted job $job $(slurm_field "$job" Restarts) times, expected 5"
  else
    [ "$restarts" = 0 ] || fail "Slurm restarted the job $restarts times"
    assert_contains "$SCRATCH/status" "job $job: task crash: the rest backend cannot requeue a job"
  fi
  pass "$BACKEND: crash loop: job $job stopped after $restarts restarts; status and the webhook say why"
}

scenario_no_false_restarts() {
  wait_idle_nodes 3
  # A clean exit is done.
  local done_job; done_job=$(submit_job -N2 -- --steps 20 --step-ms 20 --every 10)
  wait_job_state "$done_job" '^COMPLETED$' 60
  wait_ctl_state "$done_job" '^completed$' 20
  # A user's scancel is never requeued, even though every rank dies of a signal.
  local job; job=$(submit_job -N2 -- --step-ms 100 --every 10)
  wait_output "$SCRATCH/out.$job" "committed step 10" 60
  # A forged event: ckptuser claims a rank of root's job failed on a dead node.
  local payload="{\"v\":1,\"type\":\"task_exit\",\"job_id\":$job,\"step_id\":0,\"restart_count\":0,\"node\":\"n1\",\"rank\":0,\"exit_code\":1,\"signal\":0,\"uid\":0,\"time\":0}"
  local cred; cred=$(runuser -u "$TEST_USER" -- munge -S "$D/munge/munge.socket" -s "$payload") || fail "munge as $TEST_USER"
  local code; code=$(curl -s -o "$SCRATCH/forged" -w '%{http_code}' --data-binary "$cred" -H 'Content-Type: text/plain' "$CTL_URL/v1/events")
  [ "$code" = 403 ] || { cat "$SCRATCH/forged" >&2; fail "a forged event got HTTP $code"; }
  assert_contains "$SCRATCH/forged" "is neither root, SlurmUser nor the owner (uid 0) of job $job"
  ctl history "$job" > "$SCRATCH/history"
  assert_contains "$SCRATCH/history" "rejected"
  [ "$(ctl_state "$job")" = running ] || fail "the forged event changed job $job to $(ctl_state "$job")"
  # The same credential again: MUNGE refuses a replay.
  code=$(curl -s -o "$SCRATCH/replay" -w '%{http_code}' --data-binary "$cred" -H 'Content-Type: text/plain' "$CTL_URL/v1/events")
  [ "$code" = 403 ] || fail "a replayed credential got HTTP $code"
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  sleep 3  # a wrong requeue would show by now
  [ "$(slurm_field "$job" Restarts)" = 0 ] || fail "a cancelled job was restarted"
  wait_job_state "$job" '^CANCELLED$' 30  # its nodes may still be cleaning up (COMPLETING)
  pass "$BACKEND: no false restarts: clean exit done, scancel never requeued, forged and replayed events refused"
}

scenario_needs_checkpoint() {
  wait_idle_nodes 2
  local job; job=$(CKPT_REQUIRE_CHECKPOINT=yes submit_job -N2 -- --step-ms 50 --every 0 --fail-rank 1 --fail-step 3)
  wait_ctl_state "$job" '^gave-up$' 60
  sleep 2
  [ "$(slurm_field "$job" Restarts)" = 0 ] || fail "a job without a checkpoint that needs one was requeued"
  ctl status | grep "job $job: task crash, and the job needs a checkpoint to restart but none is complete" > /dev/null || {
    ctl status >&2; fail "status does not say why"; }
  pass "$BACKEND: a job that needs a checkpoint is not restarted without one"
}

scenario_relaunch() {
  wait_idle_nodes 4
  # Four nodes, three used: one spare inside the allocation. --no-kill keeps the allocation when a node dies.
  local job
  job=$(sbatch --parsable -N4 --no-kill -o "$SCRATCH/out.%j" --ckpt-dir="$SCRATCH/ckpt-%j" --ckpt-interval=1m \
    --wrap "$CKPT_RUN --controller $CTL_URL srun -N3 --ntasks-per-node=1 $TEST_JOB --step-ms 100 --every 10") || fail sbatch
  JOBS_STARTED+=("$job")
  wait_output "$SCRATCH/out.$job" "committed step 20" 60
  local batch_host; batch_host=$(slurm_field "$job" BatchHost)
  local victim; victim=$(grep "step_id=0" "$SCRATCH/out.$job" | grep -oE "node=[^ ]+" | cut -d= -f2 | grep -vx "$batch_host" | sort | sed -n 1p)
  local last_committed; last_committed=$(grep "committed step" "$SCRATCH/out.$job" | tail -1 | awk '{print $4}')
  local t0; t0=$(date +%s.%N)
  crash_node "$victim"
  for _ in $(seq 200); do [ "$(grep -c "run=0 step_id=1" "$SCRATCH/out.$job")" -ge 3 ] && break; sleep 0.1; done
  [ "$(grep -c "run=0 step_id=1" "$SCRATCH/out.$job")" -ge 3 ] || { cat "$SCRATCH/out.$job" >&2; fail "no relaunched step"; }
  wait_ctl_state "$job" '^running$' 10
  for _ in $(seq 30); do
    [ "$(job_json "$job" | json_get 'j["clock"]["launched"]')" != "0.0" ] && break
    sleep 0.2
  done
  local srun_start; srun_start=$(grep -oE "relaunch 1: srun started at [0-9.]+" "$SCRATCH/out.$job" | awk '{print $NF}')
  report_times "$job" "$t0" "$BACKEND in-allocation relaunch after a node crash" "$srun_start" >/dev/null
  local nodes; nodes=$(grep "run=0 step_id=1" "$SCRATCH/out.$job" | grep -oE "node=[^ ]+" | cut -d= -f2 | sort | tr '\n' ' ')
  [[ " $nodes " != *" $victim "* ]] || fail "the relaunch used the crashed node $victim: $nodes"
  # Every rank stays on its node but the crashed node's, which goes to the spare (ckpt/placement.hpp): srun's own
  # placement would have shifted the ranks after it, away from what their nodes keep for them.
  local r before after moved=""
  for r in 0 1 2; do
    before=$(grep "rank=$r .*run=0 step_id=0 " "$SCRATCH/out.$job" | grep -oE "node=[^ ]+" | head -1 | cut -d= -f2)
    after=$(grep "rank=$r .*run=0 step_id=1 " "$SCRATCH/out.$job" | grep -oE "node=[^ ]+" | head -1 | cut -d= -f2)
    if [ "$before" = "$victim" ]; then
      moved="$victim -> $after"
    elif [ "$before" != "$after" ]; then
      cat "$SCRATCH/out.$job" >&2; fail "the relaunch moved rank $r from $before to $after"
    fi
  done
  [ -n "$moved" ] || fail "no rank ran on $victim"
  assert_contains "$SCRATCH/out.$job" "relaunch: every rank keeps its node but those moved: $moved"
  local newest; newest=$(ctl history "$job" | grep -oE "newest complete checkpoint: step [0-9]+" | sed -n 1p | awk '{print $NF}')
  [ "$newest" -ge "$last_committed" ] || fail "decision saw step $newest, but step $last_committed was committed"
  grep "run=0 step_id=1" "$SCRATCH/out.$job" | grep "resume=$newest " > /dev/null || { cat "$SCRATCH/out.$job" >&2; fail "the relaunch did not resume from step $newest"; }
  [ "$(slurm_field "$job" Restarts)" = 0 ] || fail "the job left its allocation (Restarts=$(slurm_field "$job" Restarts))"
  # Its speed, like the requeue's, is measured (report_times above), not bounded here.
  revive_node "$victim"
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  pass "$BACKEND: in-allocation relaunch: step 1 runs on $nodes from step $newest in $TOTAL s, no requeue"
}

scenario_spool_transport() {  # the plugin drops events into a spool dir instead of POSTing them
  wait_idle_nodes 2
  local job
  job=$(sbatch --parsable -N2 -o "$SCRATCH/out.%j" --ckpt-dir="$SCRATCH/ckpt-%j" --ckpt-interval=1m --ckpt-max-restarts=0 \
    --wrap "srun --ntasks-per-node=1 bash -c '[ \$SLURM_PROCID = 1 ] && exit 3; exit 0'") || fail sbatch
  echo "$job" >> "$SCRATCH/jobs"
  wait_ctl_state "$job" '^gave-up$' 60
  ctl history "$job" > "$SCRATCH/history"
  local second; second=$(scontrol show hostnames "$(slurm_field "$job" NodeList)" | sed -n 2p)
  assert_contains "$SCRATCH/history" "job_start from $(slurm_field "$job" BatchHost) (batch step)"
  assert_contains "$SCRATCH/history" "task_exit from $second (step 0): rank 1 exited 3"
  assert_contains "$SCRATCH/history" "task crash after 0 restarts without progress (budget 0"
  [ -z "$(ls -A "$1")" ] || { ls -la "$1" >&2; fail "event files were left in the spool dir"; }
  [ "$(stat -c %a "$1")" = 1733 ] || fail "spool dir mode is $(stat -c %a "$1")"
  pass "$BACKEND: events through the spool dir: start, rank failure on $second, decision"
}

scenario_relaunch_handover() {  # no spare node: ckpt-run cannot relaunch inside and hands over to a requeue
  wait_idle_nodes 4
  local job
  job=$(sbatch --parsable -N3 --no-kill --open-mode=append -o "$SCRATCH/out.%j" --ckpt-dir="$SCRATCH/ckpt-%j" --ckpt-interval=1m \
    --wrap "$CKPT_RUN --controller $CTL_URL srun -N3 --ntasks-per-node=1 $TEST_JOB --step-ms 100 --every 10") || fail sbatch
  echo "$job" >> "$SCRATCH/jobs"
  wait_output "$SCRATCH/out.$job" "committed step 20" 60
  local victim; victim=$(second_node "$job")
  local t0; t0=$(date +%s.%N)
  crash_node "$victim"
  wait_output "$SCRATCH/out.$job" "run=1 step_id=0" 60
  ctl history "$job" > "$SCRATCH/history"
  assert_contains "$SCRATCH/history" "ckpt-run hands over to a requeue (2 healthy nodes left in the allocation, 3 needed)"
  assert_contains "$SCRATCH/history" "relaunching -> failing: ckpt-run cannot relaunch inside the allocation"
  check_requeued "$job" "$t0" "$BACKEND hand-over to a requeue after a node crash (no spare node)" "$victim"
  local nodes=$RUN1_NODES
  [ "$(slurm_field "$job" Restarts)" = 1 ] || fail "Slurm restart count is $(slurm_field "$job" Restarts)"
  job_json "$job" | json_get 'j["budget"]["restarts"]' | grep -x 1 > /dev/null || fail "one failure spent the budget twice"
  revive_node "$victim"
  scancel "$job"
  wait_ctl_state "$job" '^cancelled$' 30
  pass "$BACKEND: ckpt-run without a spare node hands over: job $job requeued once, runs on $nodes in $TOTAL s"
}
