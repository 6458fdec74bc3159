# PyTorch for the tests and benchmarks that train (sourced; needs CKPT_BUILD_DIR): Debian's python3, which
# python3-torch serves, with this build's slurm_ckpt module on its path, and the helpers they share.
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"
export PYTHONPATH=$CKPT_BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}

# The figures of a restore's line ("ckpt: rank R: restored step S from DIR in T s (N bytes read, M found in
# memory)"): sets read_b to N and live_b to M, both empty where LINE is not such a line.
restore_figures() {
  read_b=$(sed -n 's/.*(\([0-9]*\) bytes read, \([0-9]*\) found in memory)$/\1/p' <<< "$1")
  live_b=$(sed -n 's/.*(\([0-9]*\) bytes read, \([0-9]*\) found in memory)$/\2/p' <<< "$1")
}

# A test that starts local ranks: a scratch dir in $work, removed at exit, and every rank still listed in `pids`
# killed first (a failed check must not leave training processes behind).
ranks_scratch() {
  work=$(mktemp -d)
  pids=()
  trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$work"' EXIT
}

# start_local_ranks WORLD LOG PROGRAM [args...]: ranks 0..WORLD-1 of PROGRAM in the background, torchrun-style on
# 127.0.0.1 and a free port, rank r logging to LOG<r>.log; their pids in `pids`. No wrapper process: each pid is the
# rank itself (a test may SIGKILL it). Settings for the ranks go in front of the call (`CKPT_X=y start_local_ranks`).
start_local_ranks() {
  local world=$1 log=$2 prog=$3 port r
  shift 3
  port=$(free_port)
  pids=()
  for r in $(seq 0 $((world - 1))); do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r \
      "$PY" "$prog" "$@" >"$log$r.log" 2>&1 &
    pids+=($!)
  done
}

# wait_local_ranks LOG: waits for the ranks start_local_ranks started. When one does not exit 0: the tail of its
# log on stderr, its rank in `failed_rank`, and status 1 (the others are left to the caller's exit trap).
wait_local_ranks() {
  local log=$1 r=0 p
  for p in "${pids[@]}"; do
    if ! wait "$p"; then
      failed_rank=$r
      tail -20 "$log$r.log" >&2
      return 1
    fi
    r=$((r + 1))
  done
  pids=()
}

# True when torch and the built slurm_ckpt import.
have_torch() { "$PY" -c 'import torch, slurm_ckpt.torch'; }

# MASTER_ADDR for a step on the local cluster: empty where each node is a host of its own (the training program
# then takes its step's first host, slurm_ckpt.torch.init_process_group), 127.0.0.1 where the nodes share this one.
rendezvous_addr() {
  local here; here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  [ "$("$here/tests/cluster.sh" addr)" != 127.0.0.1 ] || echo 127.0.0.1
}

source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"

# write_train_sbatch FILE "SBATCH OPTIONS" SCRIPT [ARGS...]: a requeueable batch job (appending to its output)
# that runs slurm-examples/SCRIPT with ARGS and the job's own arguments on every task. Each run takes a fresh
# rendezvous port, so a requeued job never meets the previous run's sockets, and logs
# "run <restart count> on <nodes>, resuming from step <step|none>".
write_train_sbatch() {
  local file=$1 options=$2 script=$3
  shift 3
  cat > "$file" <<JOB
#!/bin/bash
#SBATCH $options --requeue --open-mode=append
export MASTER_ADDR=$(rendezvous_addr)
export MASTER_PORT=\$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "run \${SLURM_RESTART_COUNT:-0} on \$SLURM_JOB_NODELIST, resuming from step \${CKPT_RESUME_STEP:-none}"
srun $PY ${CKPT_SOURCE_DIR:?}/slurm-examples/$script $* "\$@"
JOB
}

# The step a checkpoint dir's `latest` names; 0 when it has none.
latest_step() { [ -f "$1/latest" ] && sed 's/^0*//; s/^$/0/' "$1/latest" || echo 0; }

# The last step train_dp_tp.py or train_ddp.py logged in LOG; empty before its first step.
logged_step() { { sed -n 's/^train_\(dp_tp\|ddp\): step \([0-9]*\) .*/\2/p' "$1" 2>/dev/null || true; } | tail -1; }

# wait_logged_step LOG STEP: waits (60 s at most) until the training logged STEP or a later one in LOG; 1 if not.
wait_logged_step() {
  local s
  for _ in $(seq 1200); do
    s=$(logged_step "$1")
    [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0
    sleep 0.05
  done
  return 1
}
