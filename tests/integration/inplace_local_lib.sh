# Restart in place without Slurm, on this host: train_ddp.py as 3 ranks and spares started with the variables
# `ckpt-run --spares` gives each step, a rank killed or frozen mid-run, and a second death while the job recovers.
# Sourced by test_inplace_local.sh and bench/inplace/second_death.sh (after torch_lib.sh; needs W).

# launch NAME SPARES [VICTIM SIGNAL AT_STEP]: 3 ranks (one "node" each) and SPARES spares in $W/NAME; their
# exit statuses in `status`. Settings in front of the call: PROGRAM, STEP_SLEEP, JOIN_TIMEOUT (5 s), STRANGER (the
# caller's `attack DIR` first), KILL_REPLACEMENT=SECONDS, KILL_SURVIVOR=RANK. The caller defines `fail`.
launch() {
  local name=$1 spares=$2 victim=${3:-} sig=${4:-} at=${5:-} i s
  local d=$W/$name
  mkdir -p "$d/ckpt"
  pids=()
  for i in 0 1 2 $(seq 3 $((2 + spares))); do
    local role=(CKPT_INPLACE_RANK_BASE=$i)
    [ "$i" -ge 3 ] && role=(CKPT_INPLACE_SPARE=1)
    env -u SLURM_JOB_ID -u SLURM_STEP_ID -u SLURM_PROCID CKPT_DIR="$d/ckpt" CKPT_LAST_WORDS=on CKPT_HEARTBEAT_TIMEOUT=1s \
      CKPT_INPLACE_ID="local.$name" CKPT_INPLACE_WORLD=3 SLURM_PROCID=0 SLURM_LOCALID=0 SLURMD_NODENAME="h$i" \
      CKPT_INPLACE_JOIN_TIMEOUT="${JOIN_TIMEOUT:-5}" "${role[@]}" \
      "$PY" "${PROGRAM:-$CKPT_SOURCE_DIR/slurm-examples/train_ddp.py}" --steps 30 --ckpt-interval-steps 5 --step-sleep "${STEP_SLEEP:-0.05}" \
      --log-every 1 --out "$d/final" > "$d/log$i" 2>&1 &
    pids+=($!)
  done
  if [ -n "$victim" ]; then
    for _ in $(seq 600); do
      # (log0 may not exist yet: its rank's redirection happens in the background job)
      s=$({ sed -n 's/^train_ddp: step \([0-9]*\) .*/\1/p' "$d/log0" 2>/dev/null || true; } | tail -1)
      [ -n "$s" ] && [ "$s" -ge "$at" ] && break
      sleep 0.02
    done
    [ -n "${STRANGER:-}" ] && attack "$d"
    kill "-$sig" "${pids[$victim]}"
    if [ -n "${KILL_REPLACEMENT:-}" ]; then  # the first spare dies as soon as it takes the rank over
      for _ in $(seq 4000); do grep -q "takes rank" "$d/log3" && break; sleep 0.005; done
      sleep "$KILL_REPLACEMENT"
      kill -KILL "${pids[3]}"
    fi
    if [ -n "${KILL_SURVIVOR:-}" ]; then  # a survivor dies once the last words committed, before it joins again
      for _ in $(seq 4000); do grep -q "committed the terminal checkpoint" "$d"/log* && break; sleep 0.005; done
      kill -KILL "${pids[$KILL_SURVIVOR]}" || fail "$name: rank $KILL_SURVIVOR was gone before the last words ended"
    fi
  fi
  status=()
  for i in "${!pids[@]}"; do
    if [ "$i" = "$victim" ] && [ "$sig" = STOP ]; then
      # The frozen rank thaws once the others went on without it: it must leave without touching the dir.
      for _ in $(seq 600); do grep -q "in-place recovery {" "$d/log0" && break; sleep 0.1; done
      sleep 0.5
      kill -CONT "${pids[$i]}"
    fi
    wait "${pids[$i]}" && status+=(0) || status+=($?)
  done
  if [ -n "${stranger:-}" ]; then
    kill "$stranger" 2>/dev/null || true
    pkill -f "tests/hooks/store_stranger.py" 2>/dev/null || true
    wait "$stranger" 2>/dev/null || true
    stranger=""
  fi
}
