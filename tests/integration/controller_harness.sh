# Helpers for the controller's integration tests (sourced by tests/integration/test_controller_*.sh, after
# tests/integration/lib.sh). Everything runs against the real local cluster: the real plugin reports events
# to a real ckpt-controller, which drives Slurm through libslurm or slurmrestd.
D=$CKPT_CLUSTER_DIR
CTL=$CKPT_BUILD_DIR/controller/ckpt-controller
CKPT_RUN=$CKPT_BUILD_DIR/ckpt-run/ckpt-run
TEST_JOB=$CKPT_BUILD_DIR/tests/ckpt-test-job
CTL_PORT=${CKPT_CONTROLLER_TEST_PORT:-16840}
REST_PORT=$((CTL_PORT + 1))
HOOK_PORT=$((CTL_PORT + 2))
CTL_ADDR=$("$CLUSTER" addr)  # where the nodes reach this host
CTL_URL=http://$CTL_ADDR:$CTL_PORT
BACKEND=${BACKEND:-libslurm}
JOBS_STARTED=()
CRASHED_NODES=()
CTL_PID=""
HOOK_PID=""

for f in "$CTL" "$CKPT_RUN" "$TEST_JOB"; do
  [ -x "$f" ] || { echo "SKIP: $f is not built" >&2; exit 77; }
done
[ -x "$PY" ] || { echo "SKIP: $PY missing" >&2; exit 77; }

ctl_cleanup() {
  local rc=$?
  for j in "${JOBS_STARTED[@]}" $(cat "$SCRATCH/jobs" 2>/dev/null); do scancel "$j" 2>/dev/null || true; done
  for n in "${CRASHED_NODES[@]}"; do "$CLUSTER" revive-node "$n" >/dev/null 2>&1 || true; done
  stop_controller
  [ -n "$HOOK_PID" ] && kill "$HOOK_PID" 2>/dev/null || true
  stop_restd
  # Put the site's plugstack.conf back as the cluster script writes it (without controller=).
  "$CLUSTER" up >/dev/null 2>&1 || true
  if [ $rc -ne 0 ] && [ -f "$SCRATCH/controller.log" ]; then
    echo "--- controller log (last 60 lines):" >&2
    tail -n 60 "$SCRATCH/controller.log" >&2
  fi
  return $rc
}
trap ctl_cleanup EXIT

# The plugin in slurmstepd reports to the test controller: plugstack.conf gets controller=<our URL>.
# slurmstepd reads plugstack.conf at every step start, so no daemon restarts.
use_controller_in_plugstack() {
  CKPT_CLUSTER_PLUGIN_ARGS="controller=${1:-$CTL_URL}" "$CLUSTER" up >/dev/null || fail "cluster up"
  grep -q "controller=${1:-$CTL_URL}" "$D/etc/plugstack.conf" || fail "plugstack.conf has no controller="
}

json_get() {  # json_get 'python expression on j' < json
  "$PY" -c "import json,sys; j=json.load(sys.stdin); v=$1; print(v if not isinstance(v,(dict,list)) else json.dumps(v))"
}

start_restd() {
  [ -f "$D/run/slurmrestd.pid" ] && kill -0 "$(cat "$D/run/slurmrestd.pid")" 2>/dev/null && stop_restd
  SLURM_JWT=daemon setsid slurmrestd -s openapi/v0.0.38 -u nobody "127.0.0.1:$REST_PORT" \
    > "$SCRATCH/slurmrestd.log" 2>&1 &
  echo $! > "$D/run/slurmrestd.pid"
  scontrol token username=root lifespan=7200 > "$SCRATCH/jwt" || fail "scontrol token"
  chmod 600 "$SCRATCH/jwt"
  local token; token=$(sed 's/^SLURM_JWT=//' "$SCRATCH/jwt")
  for _ in $(seq 50); do
    curl -sf -H "X-SLURM-USER-NAME: root" -H "X-SLURM-USER-TOKEN: $token" \
      "http://127.0.0.1:$REST_PORT/slurm/v0.0.38/ping" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  cat "$SCRATCH/slurmrestd.log" >&2
  fail "slurmrestd did not come up"
}

stop_restd() {
  local pid
  pid=$(cat "$D/run/slurmrestd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; sleep 0.3; fi
  rm -f "$D/run/slurmrestd.pid"
}

# write_config [extra lines...]: the controller's config for $BACKEND.
write_config() {
  {
    echo "listen = $CTL_ADDR:$CTL_PORT"
    echo "database = $SCRATCH/controller.db"
    echo "munge_socket = $D/munge/munge.socket"
    echo "backend = $BACKEND"
    if [ "$BACKEND" = rest ]; then
      echo "rest_url = http://127.0.0.1:$REST_PORT"
      echo "rest_token_file = $SCRATCH/jwt"
    fi
    echo "settle = 200ms"
    echo "reconcile_interval = 1s"
    echo "log_level = debug"
    # The scenarios time requeues through the DOWN path: a node crashed while its slurmd restarted can leave its
    # port accepting with no slurmd behind it (RPC silence), which only the site's opt-in marks DOWN; the default
    # (exclude only, security_slurmd_flood) leaves it to SlurmdTimeout.
    echo "down_hung_nodes = yes"
    for line in "$@"; do echo "$line"; done
  } > "$SCRATCH/controller.conf"
}

start_controller() {  # start_controller [env assignments for fault injection]
  [ "$BACKEND" = rest ] && { [ -f "$D/run/slurmrestd.pid" ] || start_restd; }
  env "$@" setsid "$CTL" -c "$SCRATCH/controller.conf" run >> "$SCRATCH/controller.log" 2>&1 &
  CTL_PID=$!
  for _ in $(seq 100); do
    curl -sf "$CTL_URL/healthz" >/dev/null 2>&1 && return 0
    kill -0 "$CTL_PID" 2>/dev/null || { tail -20 "$SCRATCH/controller.log" >&2; fail "the controller exited at start"; }
    sleep 0.1
  done
  fail "the controller did not come up"
}

stop_controller() {
  if [ -n "$CTL_PID" ] && kill -0 "$CTL_PID" 2>/dev/null; then
    kill -TERM "$CTL_PID"
    for _ in $(seq 50); do kill -0 "$CTL_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$CTL_PID" 2>/dev/null || true
  fi
  CTL_PID=""
}

ctl() { "$CTL" -c "$SCRATCH/controller.conf" "$@"; }
# Reads carry a MUNGE credential naming the page (the controller shows each user only their own jobs).
ctl_get() { curl -sf -H "X-Ckpt-Credential: $(munge -S "$D/munge/munge.socket" -s "GET $1")" "$CTL_URL$1"; }
job_json() { ctl_get "/v1/jobs/$1"; }
ctl_state() { job_json "$1" 2>/dev/null | json_get 'j["state"]' 2>/dev/null || echo none; }

# wait_ctl_state JOB REGEX [TIMEOUT]
wait_ctl_state() {
  local job=$1 want=$2 timeout=${3:-60} state=""
  for _ in $(seq $((timeout * 5))); do
    state=$(ctl_state "$job")
    [[ $state =~ $want ]] && return 0
    sleep 0.2
  done
  ctl history "$job" >&2 || true
  fail "controller state of job $job is '$state', expected $want"
}

slurm_field() { scontrol show job "$1" 2>/dev/null | grep -oE "(^| )$2=[^ ]*" | sed -n 1p | cut -d= -f2; }

# submit_job [sbatch options] -- [test-job options]: a 3-task test job, one task per node.
submit_job() {
  local sb=() tj=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do sb+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  tj=("$@")
  local job
  job=$(sbatch --parsable -o "$SCRATCH/out.%j" --ckpt-dir="$SCRATCH/ckpt-%j" --ckpt-interval=1m "${sb[@]}" \
    --wrap "srun --ntasks-per-node=1 -n \$SLURM_JOB_NUM_NODES $TEST_JOB ${tj[*]}") || fail "sbatch failed"
  echo "$job" >> "$SCRATCH/jobs"  # called in $(...): the cleanup reads the file
  echo "$job"
}

wait_output() {  # wait_output FILE TEXT [TIMEOUT]
  local file=$1 text=$2 timeout=${3:-60}
  for _ in $(seq $((timeout * 10))); do
    grep -qF -- "$text" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$file" >&2 2>/dev/null || true
  fail "no '$text' in $file after ${timeout}s"
}

crash_node() {
  CRASHED_NODES+=("$1")
  "$CLUSTER" crash-node "$1" >/dev/null 2>&1 || fail "crash-node $1"
}
revive_node() { "$CLUSTER" revive-node "$1" >/dev/null 2>&1 || fail "revive-node $1"; }

# A local webhook receiver: appends each POSTed body as one line to $SCRATCH/alerts.
start_webhook() {
  "$PY" - "$HOOK_PORT" "$SCRATCH/alerts" > "$SCRATCH/webhook.log" 2>&1 <<'PY' &
import http.server, sys
port, out = int(sys.argv[1]), sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(out, "ab") as f:
            f.write(body.replace(b"\n", b" ") + b"\n")
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
PY
  HOOK_PID=$!
  touch "$SCRATCH/alerts"
  sleep 0.5
}

# The node (not the batch host) of a running job to crash: its second node.
second_node() { scontrol show job "$1" | grep -oE " NodeList=[^ ]+" | sed -n 1p | cut -d= -f2 | xargs -I{} scontrol show hostnames {} | sed -n 2p; }
