#!/usr/bin/env bash
# The controller against hostile users, the real binary on real sockets.
#   test_security_controller.sh flood   (no Slurm; MUNGE when the cluster's munged runs): chunked, oversized and
#       slow requests and endless header lines keep the controller's peak RSS under 100 MiB while /healthz and a
#       valid event are answered within 1 s.
#   test_security_controller.sh slurm   (the local cluster): a second user cannot read another user's jobs or
#       history; a ckpt_dir in an event signed by the job's user is ignored; another user's slow-node report, and
#       ckpt-run's words on a recovery (relaunch, in-place, handover) for another user's job, are refused; an owner's
#       relaunch leaves out only nodes of the owner's job and marks none DOWN; a reused job id starts a fresh record.
source "$(dirname "$0")/lib.sh"
CTL=$CKPT_BUILD_DIR/controller/ckpt-controller
[ -x "$CTL" ] || { echo "SKIP: controller not built" >&2; exit 77; }
MUNGE_SOCKET=$CKPT_CLUSTER_DIR/munge/munge.socket
PORT=$(free_port)
URL=http://127.0.0.1:$PORT
CTL_PID=""
JOBS=()
cleanup() {
  [ -n "$CTL_PID" ] && kill "$CTL_PID" 2>/dev/null || true
  for j in "${JOBS[@]}"; do scancel "$j" 2>/dev/null || true; done
}
trap cleanup EXIT

start_controller() {
  setsid "$CTL" run -c "$SCRATCH/controller.conf" >> "$SCRATCH/controller.log" 2>&1 &
  CTL_PID=$!
  for _ in $(seq 100); do
    curl -sf "$URL/healthz" > /dev/null 2>&1 && return 0
    kill -0 "$CTL_PID" 2>/dev/null || { cat "$SCRATCH/controller.log" >&2; fail "the controller exited at start"; }
    sleep 0.1
  done
  fail "the controller did not answer /healthz"
}
stop_controller() { kill "$CTL_PID"; wait "$CTL_PID" 2>/dev/null || true; CTL_PID=""; }

have_munge() { [ -S "$MUNGE_SOCKET" ] && munge -S "$MUNGE_SOCKET" -n > /dev/null 2>&1; }
cred() {  # cred USER PAYLOAD: a MUNGE credential made as USER
  if [ "$1" = root ]; then munge -S "$MUNGE_SOCKET" -s "$2"; else runuser -u "$1" -- munge -S "$MUNGE_SOCKET" -s "$2"; fi
}
get_as() {  # get_as USER PATH: the page as USER sees it; prints the HTTP status on the last line
  curl -s -w '\n%{http_code}\n' -H "X-Ckpt-Credential: $(cred "$1" "GET $2")" "$URL$2"
}
post_event() {  # post_event USER JSON: prints the HTTP status
  curl -s -o "$SCRATCH/answer" -w '%{http_code}' --data-binary "$(cred "$1" "$2")" -H 'Content-Type: text/plain' \
    "$URL/v1/events"
}
job_start() {  # job_start JOB DIR: a job-start event as the plugin sends it
  echo "{\"v\":1,\"type\":\"job_start\",\"job_id\":$1,\"step_id\":0,\"restart_count\":0,\"node\":\"n1\",\"uid\":0,\"time\":0,\"ckpt_dir\":\"$2\"}"
}

slow_node() {  # slow_node JOB NODE: a slow-node report that would exclude NODE from JOB's next runs
  echo "{\"v\":1,\"type\":\"slow_node\",\"job_id\":$1,\"step_id\":0,\"restart_count\":0,\"node\":\"$2\",\"uid\":0,\"time\":0,\"slow_node\":\"$2\",\"score\":0.1,\"action\":\"exclude\",\"detail\":\"forged\"}"
}
record_when() {  # record_when JOB FILE PATTERN: the job's record as root in FILE, once it holds PATTERN (10 s at most)
  for _ in $(seq 50); do
    get_as root "/v1/jobs/$1" > "$2"
    grep -q "$3" "$2" && return 0
    sleep 0.2
  done
}
owner_word() {  # owner_word TYPE JOB NODES: ckpt-run's word on a recovery (relaunch, in-place, handover) naming NODES failed
  local now; now=$(date +%s)
  echo "{\"v\":1,\"type\":\"$1\",\"job_id\":$2,\"step_id\":0,\"restart_count\":0,\"node\":\"n1\",\"uid\":0,\"time\":0,\"failed_nodes\":\"$3\",\"generation\":1,\"detected\":$now,\"resumed\":$((now + 1))}"
}

flood() {
  cat > "$SCRATCH/controller.conf" <<CONF
listen = 127.0.0.1:$PORT
database = $SCRATCH/controller.db
backend = rest
rest_url = http://127.0.0.1:9
munge_socket = $MUNGE_SOCKET
CONF
  SLURM_JWT=not-a-real-token start_controller
  : > "$SCRATCH/creds"
  if have_munge; then
    for i in $(seq 60); do cred root "$(job_start $((3000000 + i)) /nonexistent)" >> "$SCRATCH/creds"; done
  else
    echo "note: no munged at $MUNGE_SOCKET: timing /healthz only"
  fi
  "$PY" "$CKPT_SOURCE_DIR/tests/integration/controller_flood.py" 127.0.0.1 "$PORT" "$CTL_PID" 10 "$SCRATCH/creds" \
    > "$SCRATCH/flood.json" || fail "the flood client failed"
  cat "$SCRATCH/flood.json"
  kill -0 "$CTL_PID" 2>/dev/null || { tail -20 "$SCRATCH/controller.log" >&2; fail "the controller died under the flood"; }
  "$PY" - "$SCRATCH/flood.json" <<'PY' || fail "the flood hurt the controller (see above)"
import json, sys
r = json.load(open(sys.argv[1]))
ok = True
if r["vm_hwm_kib"] >= 100 * 1024:
    print("peak RSS %d KiB (limit 100 MiB)" % r["vm_hwm_kib"]); ok = False
for what, took in r["worst_s"].items():
    if took >= 1.0:
        print("slowest %s answer took %.3f s (limit 1 s)" % (what, took)); ok = False
if r["wrong"]:
    print("wrong answers: %s" % r["wrong"][:5]); ok = False
sys.exit(0 if ok else 1)
PY
  # Complaints about the flood are logged at a bounded rate, each one line naming what was wrong.
  local lines; lines=$(grep -c "request refused" "$SCRATCH/controller.log" || true)
  [ "$lines" -le 60 ] || fail "$lines log lines about refused requests in 10 s (rate limit: 5 per kind per 10 s)"
  assert_contains "$SCRATCH/controller.log" "transfer codings (chunked bodies) are not accepted"
  assert_contains "$SCRATCH/controller.log" "request head is larger than 16384 bytes"
  stop_controller
  pass "flood: peak RSS $("$PY" -c "import json; print(json.load(open('$SCRATCH/flood.json'))['vm_hwm_kib'])") KiB; answers within 1 s"
}

slurm_part() {
  have_munge || fail "no munged at $MUNGE_SOCKET"
  id "$TEST_USER" > /dev/null 2>&1 || fail "no user $TEST_USER"
  local user_uid; user_uid=$(id -u "$TEST_USER")
  cat > "$SCRATCH/controller.conf" <<CONF
listen = 127.0.0.1:$PORT
database = $SCRATCH/controller.db
backend = libslurm
munge_socket = $MUNGE_SOCKET
settle = 200ms
reconcile_interval = 1s
log_level = debug
CONF
  chmod 644 "$SCRATCH/controller.conf"
  local theirs mine
  theirs=$(runuser -u "$TEST_USER" -- sbatch --parsable --chdir=/tmp -o /dev/null -J sec-user --wrap "sleep 300") ||
    fail "sbatch as $TEST_USER"
  JOBS+=("$theirs")
  mine=$(sbatch --parsable --chdir=/tmp -o /dev/null -J sec-root --wrap "sleep 300") || fail "sbatch as root"
  JOBS+=("$mine")
  start_controller

  # The plugin (root in slurmstepd) reports both jobs' checkpoint dirs.
  [ "$(post_event root "$(job_start "$theirs" "$SCRATCH/ckpt-$theirs")")" = 202 ] || fail "job start of $theirs refused"
  [ "$(post_event root "$(job_start "$mine" "$SCRATCH/ckpt-$mine")")" = 202 ] || fail "job start of $mine refused"

  # A ckpt_dir in an event the job's own user signed is ignored: the controller would read it as root.
  post_event "$TEST_USER" "$(job_start "$theirs" /root)" > /dev/null
  get_as root "/v1/jobs/$theirs" > "$SCRATCH/job"
  assert_contains "$SCRATCH/job" "\"ckpt_dir\":\"$SCRATCH/ckpt-$theirs\""
  assert_not_contains "$SCRATCH/job" '"ckpt_dir":"/root"'
  assert_contains "$SCRATCH/controller.log" "ckpt_dir '/root' from uid $user_uid ignored"
  pass "a ckpt_dir signed by the job's user is ignored"

  # Another user's slow-node report for root's job is refused and changes nothing: no slow node, no exclusion.
  local node; node=$(squeue -h -j "$mine" -o %N | cut -d, -f1)
  [ "$(post_event "$TEST_USER" "$(slow_node "$mine" "${node:-n1}")")" = 403 ] ||
    { cat "$SCRATCH/answer" >&2; fail "$TEST_USER's slow_node event for job $mine was not refused"; }
  get_as root "/v1/jobs/$mine" > "$SCRATCH/job-mine"
  assert_contains "$SCRATCH/job-mine" '"slow_nodes":[]'
  assert_contains "$SCRATCH/job-mine" '"bad_nodes":[]'
  assert_contains "$SCRATCH/controller.log" "rejected slow_node from ${node:-n1} (uid $user_uid) for job $mine"
  pass "another user's slow-node report for a job is refused and excludes nothing"

  # ckpt-run's word on a recovery is the job owner's: another user's relaunch, in-place report or hand-over for
  # root's job is refused and spends, excludes and marks nothing.
  local type
  for type in relaunch in-place handover; do
    [ "$(post_event "$TEST_USER" "$(owner_word "$type" "$mine" "${node:-n1}")")" = 403 ] ||
      { cat "$SCRATCH/answer" >&2; fail "$TEST_USER's $type event for job $mine was not refused"; }
    assert_contains "$SCRATCH/controller.log" "rejected $type from n1 (uid $user_uid) for job $mine"
  done
  get_as root "/v1/jobs/$mine" > "$SCRATCH/job-mine"
  assert_contains "$SCRATCH/job-mine" '"state":"running"'
  assert_contains "$SCRATCH/job-mine" '"bad_nodes":[]'
  assert_contains "$SCRATCH/job-mine" '"restarts":0'
  # The owner's own relaunch may leave out only nodes of the owner's allocation: not root's job's node (where the two
  # differ), not a made-up one; and it marks no node DOWN or DRAIN.
  local their_node=""
  for _ in $(seq 100); do
    their_node=$(squeue -h -t running -j "$theirs" -o %N)
    [ -n "$their_node" ] && break
    sleep 0.2
  done
  [ -n "$their_node" ] || fail "job $theirs does not run"
  for _ in $(seq 50); do  # the controller has the allocation from Slurm (its reconcile pass)
    get_as root "/v1/jobs/$theirs" | head -1 | "$PY" -c 'import json, sys; sys.exit(not json.load(sys.stdin)["nodes"])' && break
    sleep 0.1
  done
  [ "$(post_event "$TEST_USER" "$(owner_word relaunch "$theirs" "${node:-n1},n9,$their_node")")" = 202 ] ||
    { cat "$SCRATCH/answer" >&2; fail "$TEST_USER's relaunch event for their own job $theirs was refused"; }
  record_when "$theirs" "$SCRATCH/job-theirs" '"state":"relaunching"'
  assert_contains "$SCRATCH/job-theirs" '"state":"relaunching"'
  assert_contains "$SCRATCH/job-theirs" "\"exclude\":[\"$their_node\"]"
  assert_contains "$SCRATCH/job-theirs" '"restarts":1'
  local n state
  for n in ${node:-n1} $their_node; do
    state=$(sinfo -h -n "$n" -o %t | head -1)
    case "$state" in down* | drain* | drng*) fail "$n is $state after a user's relaunch event" ;; esac
  done
  get_as root "/v1/jobs/$mine" > "$SCRATCH/job-mine"
  assert_contains "$SCRATCH/job-mine" '"bad_nodes":[]'
  pass "another user's relaunch, in-place and hand-over words are refused; an owner's relaunch leaves out only their own job's node"

  # A second user reads neither another user's job nor its history; their own, yes; root sees all.
  get_as "$TEST_USER" "/v1/jobs/$mine/history" > "$SCRATCH/h"
  [ "$(tail -1 "$SCRATCH/h")" = 404 ] || { cat "$SCRATCH/h" >&2; fail "$TEST_USER read root's history"; }
  assert_not_contains "$SCRATCH/h" "tracking job"
  get_as "$TEST_USER" "/v1/jobs/$mine" > "$SCRATCH/j"
  [ "$(tail -1 "$SCRATCH/j")" = 404 ] || { cat "$SCRATCH/j" >&2; fail "$TEST_USER read root's job"; }
  get_as "$TEST_USER" /v1/jobs > "$SCRATCH/list"
  assert_contains "$SCRATCH/list" "\"job_id\":$theirs"
  assert_not_contains "$SCRATCH/list" "\"job_id\":$mine"
  expect_fail runuser -u "$TEST_USER" -- "$CTL" history "$mine" -c "$SCRATCH/controller.conf"
  assert_contains "$SCRATCH/err" "ckpt-controller: job $mine is not tracked, or not yours"
  runuser -u "$TEST_USER" -- "$CTL" history "$theirs" -c "$SCRATCH/controller.conf" > "$SCRATCH/own" ||
    fail "$TEST_USER cannot read their own job's history"
  assert_contains "$SCRATCH/own" "tracking job $theirs"
  "$CTL" -c "$SCRATCH/controller.conf" history "$theirs" > "$SCRATCH/root-reads" || fail "root cannot read $theirs"
  curl -s -o "$SCRATCH/anon" -w '%{http_code}' "$URL/v1/jobs/$mine/history" > "$SCRATCH/code"
  [ "$(cat "$SCRATCH/code")" = 401 ] || fail "an anonymous history read got HTTP $(cat "$SCRATCH/code")"
  pass "$TEST_USER sees only their own jobs; anonymous reads of a job are refused"

  # A reused job id: a record left from an older job with the same id (another submit time) is not carried on.
  stop_controller
  "$PY" - "$SCRATCH/controller.db" "$mine" <<'PY' || fail "cannot plant an old record"
import json, sqlite3, sys
db, job = sqlite3.connect(sys.argv[1]), int(sys.argv[2])
rec = json.loads(db.execute("SELECT record FROM jobs WHERE job_id = ?", (job,)).fetchone()[0])
rec.update({"state": "gave-up", "restart_count": 7, "submit_time": 1000.0, "uid": 4242, "reason": "OLD JOB"})
rec["budget"]["restarts"] = 9
db.execute("UPDATE jobs SET state = 'gave-up', record = ? WHERE job_id = ?", (json.dumps(rec), job))
db.execute("INSERT INTO history (job_id, time, restart_count, kind, text) VALUES (?, 1000, 7, 'note', 'OLD JOB LINE')", (job,))
db.commit()
PY
  start_controller
  local submit; submit=$(date -d "$(scontrol show job "$mine" | grep -oE 'SubmitTime=[^ ]+' | cut -d= -f2)" +%s)
  record_when "$mine" "$SCRATCH/reused" '"state":"running"'
  assert_contains "$SCRATCH/reused" '"state":"running"'
  assert_contains "$SCRATCH/reused" '"restart_count":0'
  assert_contains "$SCRATCH/reused" "\"submit_time\":$submit"
  assert_not_contains "$SCRATCH/reused" "OLD JOB"
  get_as root "/v1/jobs/$mine/history" > "$SCRATCH/reused-history"
  assert_not_contains "$SCRATCH/reused-history" "OLD JOB LINE"
  assert_contains "$SCRATCH/reused-history" "was dropped"
  stop_controller
  pass "a reused job id starts a fresh record"
}

case "${1:-}" in
  flood) flood ;;
  slurm) slurm_part ;;
  *) fail "usage: $0 flood|slurm" ;;
esac
finish
