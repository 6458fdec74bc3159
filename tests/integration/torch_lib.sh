# PyTorch for the tests and benchmarks that train (sourced; needs CKPT_BUILD_DIR): Debian's python3, which
# python3-torch serves, with this build's slurm_ckpt module on its path, and the helpers they share.
PY=${CKPT_PYTHON:-/usr/bin/python3}
export PYTHONPATH=$CKPT_BUILD_DIR/python${PYTHONPATH:+:$PYTHONPATH}

# True when torch and the built slurm_ckpt import.
have_torch() { "$PY" -c 'import torch, slurm_ckpt.torch'; }

# A TCP port free on 127.0.0.1 right now: a rendezvous port for MASTER_PORT.
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# The step a checkpoint dir's `latest` names; 0 when it has none.
latest_step() { [ -f "$1/latest" ] && sed 's/^0*//; s/^$/0/' "$1/latest" || echo 0; }

# The last step train_dp_tp.py logged in LOG; empty before its first step.
logged_step() { { sed -n 's/^train_dp_tp: step \([0-9]*\) .*/\1/p' "$1" 2>/dev/null || true; } | tail -1; }
