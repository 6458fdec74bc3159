# The recovery controller for a test or a benchmark on the local cluster (sourced; needs CKPT_SOURCE_DIR and
# CKPT_BUILD_DIR). controller_up DIR PORT brings the cluster up with the plugin reporting to a controller on
# this host's address on the cluster's network, port PORT (libslurm backend, quick settle and reconcile) whose config, database and log live in DIR;
# ctl runs its client commands; controller_down stops it and puts plugstack.conf back as tests/cluster.sh writes it. CKPT_CONTROLLER_CONF_EXTRA
# holds more lines for its config (a site's opt-ins); CKPT_CLUSTER_PLUGIN_ARGS more plugstack.conf options.
controller_up() {
  local dir=$1 port=$2 addr
  addr=$("$CKPT_SOURCE_DIR/tests/cluster.sh" addr)  # where the nodes reach this host
  CKPT_CLUSTER_PLUGIN_ARGS="controller=http://$addr:$port ${CKPT_CLUSTER_PLUGIN_ARGS:-}" "$CKPT_SOURCE_DIR/tests/cluster.sh" up
  CONTROLLER_CONF=$dir/controller.conf
  cat > "$CONTROLLER_CONF" <<CONF
listen = $addr:$port
database = $dir/controller.db
munge_socket = ${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}/munge/munge.socket
backend = libslurm
settle = 200ms
reconcile_interval = 1s
${CKPT_CONTROLLER_CONF_EXTRA:-}
CONF
  setsid "$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$dir/controller.conf" run > "$dir/controller.log" 2>&1 &
  CONTROLLER_PID=$!
  CONTROLLER_URL=http://$addr:$port
  for _ in $(seq 100); do
    curl -sf "$CONTROLLER_URL/healthz" > /dev/null && return 0
    sleep 0.1
  done
  echo "the controller did not start: $(tail -5 "$dir/controller.log")" >&2
  return 1
}

# ctl ARGS...: the controller's client commands against the controller controller_up started.
ctl() { "$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$CONTROLLER_CONF" "$@"; }

# controller_get PATH: a read with a MUNGE credential naming the page (the controller shows each user their jobs).
controller_get() {
  local socket=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}/munge/munge.socket
  curl -sf -H "X-Ckpt-Credential: $(munge -S "$socket" -s "GET $1")" "$CONTROLLER_URL$1"
}

controller_down() {
  [ -n "${CONTROLLER_PID:-}" ] || return 0
  kill "$CONTROLLER_PID" 2>/dev/null || true
  CONTROLLER_PID=""
  "$CKPT_SOURCE_DIR/tests/cluster.sh" up > /dev/null 2>&1 || true
}

# inplace_job FILE "SBATCH OPTIONS" "TRAIN_DDP ARGS" [RANKS_PER_NODE]: the batch script of the restart-in-place tests:
# train_ddp.py on 3 nodes, RANKS_PER_NODE ranks each (1 unless given), under `ckpt-run --spares 1` ($RUN_SPARES at
# submit time replaces it) with last words on, a 1 s heartbeat timeout and the test's controller (controller_up
# first). Arguments given to sbatch after the script go to train_ddp.py.
inplace_job() {
  cat > "$1" <<JOB
#!/bin/bash
#SBATCH --no-kill --requeue --open-mode=append --ckpt-last-words=on${2:+ $2}
export PYTHONPATH=$PYTHONPATH CKPT_HEARTBEAT_TIMEOUT=1s CKPT_CONTROLLER_URL=$CONTROLLER_URL
echo "run \${SLURM_RESTART_COUNT:-0} on \$SLURM_JOB_NODELIST"
$CKPT_BUILD_DIR/ckpt-run/ckpt-run \${RUN_SPARES---spares 1} srun -N3 --ntasks-per-node=${4:-1} $PY $CKPT_SOURCE_DIR/slurm-examples/train_ddp.py \\
  $3 "\$@"
JOB
}
