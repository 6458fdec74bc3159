#!/usr/bin/env bash
# Goodput under injected failures, on the real local cluster (a benchmark, not a test).
#
# Runs slurm-examples/train_dp_tp.py (DP2 x TP2: 2 nodes, 2 ranks each) as a requeueable batch job under the
# recovery controller once per policy: fixed intervals, --ckpt-interval=auto (Daly, from live measurements), auto
# with last words, and auto with last words and restart in place: `ckpt-run --spares 1` in a 3-node allocation,
# whose third node holds 2 warm spare processes; a failure while one is left is recovered in the same processes,
# the next one takes the requeue (a new allocation, with its spares again), and in place with the memory tier
# (--ckpt-memory, a memory checkpoint every step or every --memory-interval, its copy on the other node): the last
# words then also catch the failures whose surviving replica was torn mid-update, from the step before in staging.
# With --zero1 the job is slurm-examples/train_ddp.py --zero1 instead (ZeRO-1 over the 4 ranks: each rank alone
# holds AdamW's state of its partition, whole parameters), so that no live replica holds a dead rank's optimizer
# shard: last words can write a terminal checkpoint only from the memory tier's partner copies.
# Failures are injected at a scaled MTBF: one schedule, drawn once from an exponential distribution, is replayed in
# every run (common random numbers, so the policies are compared on the same failures). A failure SIGKILLs one
# random training rank (never an idle spare); one that falls due while the job is restarting strikes as soon as
# training has run a step again.
#
# Per run (bench/goodput_measure.py) it measures goodput = useful work / wall time, where the useful work is the
# job's steps times the step time of a run without checkpoints or failures, and the wall time runs from the first
# step to the last. It then asks `ckpt simulate` for its prediction of the same run: the same failure times
# (--failure-times), with the checkpoint cost δ and the restart cost R measured across all runs (medians; the
# in-place restart R_in from the in-place recoveries, the spares counted in ranks; the fraction of failures the
# last words caught, pooled over the runs with them on; for the memory tier, its run's own R_in, the stall of its
# memory checkpoints and the fractions caught from live state and from the memory tier), and for the expected
# goodput over many failures (Monte Carlo). The table and the acceptance checks go to stdout and to <work dir>/report.
#
#   bench/goodput.sh [--mtbf SECONDS] [--work SECONDS] [--fixed LIST] [--seed N] [--step-sleep S] [--report DIR]
#     --mtbf        scaled MTBF of the job (default 60)
#     --work        useful compute the job needs, in seconds (default 200)
#     --fixed       fixed intervals to compare, comma-separated seconds (default 1,3,10,30)
#     --seed        seed of the failure schedule (default 7)
#     --step-sleep  seconds each step sleeps (default 0.2; sets the step time)
#     --hidden      hidden width of the MLP (default 16384: with 256 inputs, 17 MB of weights and momentum per rank)
#     --memory      the memory tier's budget per rank, --ckpt-memory (default 256M)
#     --memory-interval  steps between memory checkpoints, --ckpt-memory-interval: N or auto (default 1); other
#                   than 1 needs --zero1 (train_ddp.py counts the memory checkpoints it took, --log-stall)
#     --zero1       train slurm-examples/train_ddp.py --zero1 (pure data parallelism, the optimizer state sharded)
#     --extra-mib   with --zero1: MiB of extra parameters per rank, train_ddp.py --extra-mib (default 16)
#     --only        run only these policies, comma-separated names (a quick look; the acceptance needs them all)
#     --report      measure and report the runs kept in DIR again (give the options of the run that made them)
# Needs a built tree (CKPT_BUILD_DIR, default build/), root, and the packages of scripts/install-deps.sh. It
# starts the local cluster (tests/cluster.sh up, whose site policy allows intervals down to 1 s) with the plugin
# reporting to its own controller; `tests/cluster.sh down` stops it.
set -euo pipefail
MTBF=60 WORK=200 FIXED=1,3,10,30 SEED=7 SLEEP=0.2 HIDDEN=16384 REPORT= ONLY= MEMORY=256M ZERO1= EXTRA=16
MEMORY_INTERVAL=1
while [ $# -gt 0 ]; do
  case $1 in
    --mtbf) MTBF=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --fixed) FIXED=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --step-sleep) SLEEP=$2; shift 2 ;;
    --hidden) HIDDEN=$2; shift 2 ;;
    --report) REPORT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --memory) MEMORY=$2; shift 2 ;;
    --memory-interval) MEMORY_INTERVAL=$2; shift 2 ;;
    --zero1) ZERO1=1; shift ;;
    --extra-mib) EXTRA=$2; shift 2 ;;
    *) echo "goodput: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ "$MEMORY_INTERVAL" != 1 ] && [ -z "$ZERO1" ]; then
  echo "goodput: --memory-interval $MEMORY_INTERVAL needs --zero1 (train_ddp.py counts its memory checkpoints)" >&2
  exit 2
fi
SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${CKPT_BUILD_DIR:-$SRC/build}
D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
PORT=${CKPT_BENCH_CONTROLLER_PORT:-16860}
CKPT=$BUILD/cli/ckpt
CLUSTER=$SRC/tests/cluster.sh
export SLURM_CONF=$D/etc/slurm.conf
CKPT_BUILD_DIR=$BUILD source "$SRC/tests/integration/torch_lib.sh"
for f in "$CKPT" "$BUILD/controller/ckpt-controller"; do
  [ -x "$f" ] || { echo "goodput: $f is not built" >&2; exit 2; }
done
have_torch || { echo "goodput: needs python3-torch and a built slurm_ckpt" >&2; exit 2; }

# The job: DP2 x TP2, or (--zero1) ZeRO-1 over 4 data-parallel ranks; its log lines start with "$PROG:".
if [ -n "$ZERO1" ]; then
  PROG=train_ddp SHAPE="ZeRO-1 (AdamW sharded over 4 data-parallel ranks, $EXTRA MiB of extra weights each)"
  TRAIN_ARGS=(--step-sleep "$SLEEP" --zero1 --extra-mib "$EXTRA" --log-every 1 --log-time)
else
  PROG=train_dp_tp SHAPE="DP2 x TP2"
  TRAIN_ARGS=(--step-sleep "$SLEEP" --d-in 256 --hidden "$HIDDEN" --lr 0.0005 --log-time)
fi
policies=()
for f in ${FIXED//,/ }; do policies+=("fixed-${f}s|${f}s|off"); done
policies+=("auto|auto|off" "last-words|auto|on" "in-place|auto|on" "memory-tier|auto|on")
NODES=2 PER_NODE=2 SPARE_NODES=1  # the job's shape; in place, SPARE_NODES more nodes hold PER_NODE spares each
WORLD=$((NODES * PER_NODE)) SPARE_RANKS=$((SPARE_NODES * PER_NODE))
if [ -n "$ONLY" ]; then
  kept=()
  for p in "${policies[@]}"; do [[ ",$ONLY," == *",${p%%|*},"* ]] && kept+=("$p"); done
  [ ${#kept[@]} -gt 0 ] || { echo "goodput: --only $ONLY names no policy" >&2; exit 2; }
  policies=("${kept[@]}")
fi
median() { sort -g | awk '{ v[++n] = $1 } END { if (n) printf "%.4f\n", (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }'; }
# "t=" of the lines of a log that match a pattern, one per line.
times_of() { sed -n "/^$PROG: $2/s/.* t=\([0-9.]*\)\$/\1/p" "$1" 2>/dev/null; }
step_time() {  # the median step time of the baseline run
  times_of "$W/baseline.out" "step [0-9]* loss" | awk 'NR > 5 { printf "%.4f\n", $1 - p } { p = $1 }' | median
}

if [ -n "$REPORT" ]; then
  W=$(cd "$REPORT" && pwd)
  STEP_S=$(step_time)
  STEPS=$(awk -v w="$WORK" -v s="$STEP_S" 'BEGIN { printf "%d", w / s + 0.5 }')
else
"$CLUSTER" up > /dev/null  # first, so that the run dir can live under the cluster's checkpoint area
mkdir -p "$D/ckpt"
W=$(mktemp -d "$D/ckpt/bench-goodput.XXXXXX")
job=""
cleanup() {
  [ -n "$job" ] && scancel "$job" 2>/dev/null || true
  controller_down
}
trap cleanup EXIT
CKPT_SOURCE_DIR=$SRC CKPT_BUILD_DIR=$BUILD CKPT_CLUSTER_DIR=$D
source "$SRC/tests/integration/controller_lib.sh"
controller_up "$W" "$PORT" || { echo "goodput: no controller" >&2; exit 1; }

# One batch script for every run but in place; the policy comes in as sbatch options.
write_train_sbatch "$W/train.sbatch" "-N$NODES --ntasks-per-node=$PER_NODE" $PROG.py "${TRAIN_ARGS[*]}"
# In place: one step per node under ckpt-run, the spare nodes beyond -N (what slurm-examples/
# train_ddp_inplace.sbatch shows users).
cat > "$W/train-inplace.sbatch" <<JOB
#!/bin/bash
#SBATCH -N$((NODES + SPARE_NODES)) --ntasks-per-node=$PER_NODE --no-kill --requeue --open-mode=append
export CKPT_CONTROLLER_URL=$CONTROLLER_URL
echo "run \${SLURM_RESTART_COUNT:-0} on \$SLURM_JOB_NODELIST, resuming from step \${CKPT_RESUME_STEP:-none}"
$BUILD/ckpt-run/ckpt-run --spares $SPARE_NODES srun -N$NODES --ntasks-per-node=$PER_NODE \
  $PY $SRC/slurm-examples/$PROG.py ${TRAIN_ARGS[*]} "\$@"
JOB

# The controller's view of a job: running, failing, requeueing, pending, completed, gave-up, ...
ctl_state() {
  controller_get "/v1/jobs/$1" 2>/dev/null | grep -oE '"state" *: *"[a-z-]+"' | sed -n 1p |
    sed 's/.*"\([a-z-]*\)"$/\1/' || true
}
# Over for good: the controller will not restart it (between a failed run and its requeue, squeue shows nothing).
job_over() { case $(ctl_state "$1") in completed|cancelled|gave-up|gone) return 0 ;; esac; return 1; }
wait_done() {  # job id: waits until the job is over for good (a failed run is requeued), prints how it ended
  for _ in $(seq 12000); do
    job_over "$1" && break
    sleep 0.5
  done
  ctl_state "$1"
}

# ---- the step time without checkpoints or failures ------------------------------------------------------------
echo "== baseline: 60 steps without checkpoints or failures"
job=$(sbatch --parsable -o "$W/baseline.out" --ckpt-interval=1000000steps --ckpt-last-words=off "$W/train.sbatch" \
  --steps 60 --out "$W/baseline.final")
[ "$(wait_done "$job")" = completed ] || { echo "goodput: the baseline run failed: $(tail -5 "$W/baseline.out")" >&2; exit 1; }
job=""
STEP_S=$(step_time)
STEPS=$(awk -v w="$WORK" -v s="$STEP_S" 'BEGIN { printf "%d", w / s + 0.5 }')
echo "step time ${STEP_S}s (median); $STEPS steps make ${WORK}s of work"

# ---- the failure schedule: exponential gaps, mean MTBF, drawn once ----------------------------------------------
"$PY" -c "
import random
r, t = random.Random($SEED), 0.0
while t < 10 * $WORK:
    t += r.expovariate(1 / $MTBF)
    print(f'{t:.3f}')" > "$W/schedule"
echo "failure schedule (seconds after the first step, seed $SEED): $(head -8 "$W/schedule" | paste -sd' ')..."

# The training ranks of a run: its processes less the idle spares (a spare with no claim file in the checkpoint
# dir's in-place control area).
ranks_of() {  # run name
  local pid env node local
  for pid in $(pgrep -f "^$PY $SRC/slurm-examples/$PROG.py .*--out $W/$1.final" || true); do
    env=$(tr '\0' '\n' 2> /dev/null < "/proc/$pid/environ") || continue  # gone since pgrep
    if grep -qx "CKPT_INPLACE_SPARE=1" <<< "$env"; then
      node=$(sed -n 's/^SLURMD_NODENAME=//p' <<< "$env") local=$(sed -n 's/^SLURM_LOCALID=//p' <<< "$env")
      compgen -G "$W/$1.ckpt/.control/inplace-*/claim-$node.$local" > /dev/null || continue
    fi
    echo "$pid"
  done
}
# Whether a run trains: its last start or step line is a step, logged after the last kill.
trains() {  # log, kills file
  local last
  last=$(grep -E "^$PROG: (step [0-9]+ loss|resumed from step|starting at step)|^run [0-9]+ on" "$1" | tail -1)
  [[ $last == "$PROG: step "* ]] || return 1
  awk -v t="${last##* t=}" '{ if ($1 >= t) late = 1 } END { exit late }' "$2"
}

# Kills one rank per scheduled failure while the job runs; writes "<unix time> <rank pid>" per kill.
inject() {  # log, kills file, job id
  local log=$1 kills=$2 id=$3 name t0 due now pids pick n=0
  name=$(basename "$log" .out)
  set +e +o pipefail  # a log that does not exist yet is no reason to stop injecting
  : > "$kills"
  for _ in $(seq 3000); do t0=$(times_of "$log" "starting at step 0" | sed -n 1p); [ -n "$t0" ] && break; sleep 0.1; done
  [ -n "$t0" ] || return 0
  while read -r at; do
    n=$((n + 1))
    due=$(awk -v a="$t0" -v b="$at" 'BEGIN { printf "%.3f", a + b }')
    while :; do
      job_over "$id" && return 0
      now=$(date +%s.%N)
      if awk -v n="$now" -v d="$due" 'BEGIN { exit !(n >= d) }'; then
        # Due: strike once this run trains (a step since its start and the last kill, every rank up).
        mapfile -t pids < <(ranks_of "$name")
        if [ "${#pids[@]}" = "$WORLD" ] && trains "$log" "$kills"; then
          pick=${pids[$(( (SEED * 31 + n * 17) % WORLD ))]}
          kill -KILL "$pick" 2>/dev/null && echo "$(date +%s.%N) $pick" >> "$kills"
          break
        fi
      fi
      sleep 0.1
    done
  done < "$W/schedule"
}

# ---- one run per policy ------------------------------------------------------------------------------------------
for p in "${policies[@]}"; do
  IFS='|' read -r name interval words <<< "$p"
  echo "== $name: --ckpt-interval=$interval --ckpt-last-words=$words"
  log=$W/$name.out
  script=$W/train.sbatch tier=()
  [ "$name" = in-place ] && script=$W/train-inplace.sbatch
  extra=()
  if [ "$name" = memory-tier ]; then
    script=$W/train-inplace.sbatch tier=(--ckpt-memory="$MEMORY" --ckpt-memory-interval="$MEMORY_INTERVAL")
    [ -n "$ZERO1" ] && extra=(--log-stall)  # each rank's count of memory checkpoints, after every step
  fi
  job=$(sbatch --parsable -o "$log" --ckpt-dir="$W/$name.ckpt" --ckpt-interval="$interval" "${tier[@]}" \
    --ckpt-last-words="$words" --ckpt-mtbf="${MTBF}s" --ckpt-max-restarts=1000 --ckpt-keep=2 \
    "$script" --steps "$STEPS" --out "$W/$name.final" "${extra[@]}")
  inject "$log" "$W/$name.kills" "$job" &
  injector=$!
  state=$(wait_done "$job")
  wait "$injector" || true
  job=""
  echo "   $state after $(wc -l < "$W/$name.kills") injected failures"
  [ "$state" = completed ] || { echo "goodput: $name ended $state: $(tail -5 "$log")" >&2; exit 1; }
done
fi

# ---- measure ------------------------------------------------------------------------------------------------------
# bench/goodput_measure.py puts the runs in the simulator's terms: per run the wall time, failures (as times) and
# checkpoints; pooled, the step time with checkpointing on, the checkpoint cost δ and the restart cost R.
measure_args=()
for p in "${policies[@]}"; do
  name=${p%%|*}
  measure_args+=("$name" "$W/$name.out" "$W/$name.kills")
done
"$PY" "$SRC/bench/goodput_measure.py" --memory memory-tier "$STEP_S" "$STEPS" "${measure_args[@]}" > "$W/measured.json"
get() { "$PY" -c "import json, sys; d = json.load(open('$W/measured.json')); print($1)"; }
DELTA=$(get "f\"{max(d['cost_s'], 0.0001):.4f}\"")  # the simulator needs a cost > 0
RESTART=$(get "f\"{d['restart_s']:.3f}\"")
RESTART_IN=$(get "f\"{d['inplace_restart_s']:.3f}\"")
STEP_SEEN=$(get "f\"{d['step_seen_s']:.4f}\"")
# The fraction of failures the last words caught, pooled over the runs that had them on: a simulator input measured
# like δ and R. A failure can tear the state (DP x TP: one tensor-parallel rank past the update, its peer not).
CATCH=$(get "(lambda rs: f\"{sum(r['terminal_checkpoints'] for r in rs) / max(1, sum(r['failures'] for r in rs)):.3f}\")([r for r in d['runs'] if r['name'] in ('last-words', 'in-place')])")
# The memory tier's run, in its own terms: R_in, the stall per memory checkpoint, the steps between them, and the
# fractions of its failures caught from live state and (the rest of its terminal checkpoints) from the memory tier.
# Without that run (--only), the in-place R_in and zeros.
read -r MEM_RESTART_IN MEM_COST MEM_EVERY MEM_LIVE MEM_CATCH <<< "$(get "(lambda r: f\"{__import__('statistics').median(r['restarts_in_place_s']) if r['restarts_in_place_s'] else $RESTART_IN:.3f} {r['memory_cost_s']:.4f} {r['memory_every_steps']:.3f} {(r['terminal_checkpoints'] - r['terminal_from_memory']) / max(1, r['failures']):.3f} {r['terminal_checkpoints'] / max(1, r['failures']):.3f}\" if r else '$RESTART_IN 0 1 0 0')(next((r for r in d['runs'] if r['name'] == 'memory-tier'), None))")"
MEM_INTERVAL_S=$(awk -v k="$MEM_EVERY" -v s="$STEP_SEEN" 'BEGIN { printf "%.4f", k * s }')
SIM_WORK=$(awk -v n="$STEPS" -v s="$STEP_SEEN" 'BEGIN { printf "%.3f", n * s }')
AUTO_LINE=$({ grep -h "CKPT_INTERVAL=auto: interval" "$W/auto.out" 2>/dev/null || true; } | tail -1 | sed "s/.*CKPT_INTERVAL=auto: //")

# The simulator's goodput for one run, on its failure times and as an expectation, both counted in useful work
# (steps x the step time without checkpointing): "replay expected".
predict() {  # name interval failure-times
  local name=$1 interval=$2 trace=$3 row fixed=() replay expected
  case $name in
    fixed-*) fixed=(--interval "$interval"); row=fixed ;;
    auto) row=daly ;;
    in-place) fixed=(--in-place-restart "${RESTART_IN}s" --spares "$SPARE_RANKS"); row=in-place ;;
    memory-tier)
      fixed=(--in-place-restart "${MEM_RESTART_IN}s" --spares "$SPARE_RANKS" --memory-interval "${MEM_INTERVAL_S}s"
        --memory-cost "${MEM_COST}s" --memory-catchable "$MEM_CATCH")
      row=memory-tier ;;
    *) row=last-words ;;
  esac
  local catch=$CATCH
  [ "$name" = memory-tier ] && catch=$MEM_LIVE
  local args=(simulate --cost "${DELTA}s" --restart "${RESTART}s" --mtbf "${MTBF}s" --catchable "$catch" "${fixed[@]}" --json)
  local pick="import json, sys; print(next(p['goodput'] for p in json.load(sys.stdin)['policies'] if p['policy'] == '$row') * $STEP_S / $STEP_SEEN)"
  replay=$("$CKPT" "${args[@]}" --work "${SIM_WORK}s" --failure-times "${trace:-none}" | "$PY" -c "$pick")
  expected=$("$CKPT" "${args[@]}" | "$PY" -c "$pick")
  echo "$replay $expected"
}

{
  echo "goodput on the local cluster: $SHAPE on $NODES nodes x $PER_NODE ranks, MTBF ${MTBF}s (failure schedule seed $SEED);"
  echo "$STEPS steps of ${STEP_S}s without checkpointing, ${STEP_SEEN}s with it (median); a failure SIGKILLs one random rank;"
  echo "the controller requeues; in place, $SPARE_RANKS spare ranks on $SPARE_NODES more node(s) take the first failures of an allocation over"
  echo "measured across the runs: checkpoint cost δ ${DELTA}s (median per run), restart R ${RESTART}s (median), in place"
  echo "R_in ${RESTART_IN}s (median), last words caught a fraction $CATCH of the failures; simulator inputs"
  echo "memory tier (--ckpt-memory=$MEMORY --ckpt-memory-interval=$MEMORY_INTERVAL: one every $MEM_EVERY steps): R_in ${MEM_RESTART_IN}s,"
  echo "stall ${MEM_COST}s per memory checkpoint, caught $MEM_LIVE"
  echo "of its failures from live state and $MEM_CATCH in all"
  echo "auto's last choice: $AUTO_LINE"
  printf '%-16s %8s %8s %6s %6s %9s %9s %9s %7s\n' policy wall_s failures ckpts words measured predicted expected diff
  n=0
  for p in "${policies[@]}"; do
    IFS='|' read -r name interval words <<< "$p"
    read -r wall fails ckpts lw g trace <<< "$(get "(lambda r: f\"{r['wall_s']:.1f} {r['failures']} {r['checkpoints']} {r['terminal_checkpoints']} {r['goodput']:.4f} {','.join(str(t) for t in r['failure_times']) or 'none'}\")(d['runs'][$n])")"
    n=$((n + 1))
    [ "$trace" = none ] && trace=""
    read -r replay expected <<< "$(predict "$name" "$interval" "$trace")"
    awk -v n="$name" -v w="$wall" -v f="$fails" -v c="$ckpts" -v lw="$lw" -v g="$g" -v r="$replay" -v e="$expected" \
      'BEGIN { printf "%-16s %8.1f %8d %6d %6d %9.4f %9.4f %9.4f %+7.4f\n", n, w, f, c, lw, g, r, e, g - r }'
  done
} | tee "$W/report"

# ---- acceptance ---------------------------------------------------------------------------------------------------
awk -v zero1="${ZERO1:-0}" '$1 == "policy" { table = 1; next }
  table { g[$1] = $6; diff[$1] = $9 < 0 ? -$9 : $9; if ($1 ~ /^fixed-/ && $6 > best) { best = $6; bestn = $1 }
          if (!($6 > 0 && $6 <= 1 && $7 > 0 && $7 <= 1)) bad = bad " " $1 }
  END {
    ok = 1
    if (bad != "") { print "unusable measurements or predictions for:" bad; ok = 0 }
    if (!("auto" in g) || !("last-words" in g) || !("in-place" in g) || bestn == "") { print "a policy run is missing"; ok = 0 }
    if (!("memory-tier" in g)) { print "a policy run is missing"; ok = 0 }
    split("auto in-place memory-tier", simulated, " ")
    for (i = 1; i <= 3; i++) {
      p = simulated[i]
      printf "%s vs the simulator: |%.4f| %s 0.03\n", p, diff[p], (diff[p] <= 0.03 ? "<=" : ">")
      if (diff[p] > 0.03) ok = 0
    }
    printf "auto %.4f vs the best fixed interval (%s) %.4f: %+.2f points (target >= -1)\n", g["auto"], bestn, best, 100 * (g["auto"] - best)
    if (g["auto"] < best - 0.01) ok = 0
    printf "auto + last words %.4f vs auto %.4f: %+.2f points (target >= 0)\n", g["last-words"], g["auto"], 100 * (g["last-words"] - g["auto"])
    if (g["last-words"] < g["auto"]) ok = 0
    printf "in place %.4f vs auto + last words %.4f: %+.2f points (target >= 0)\n", g["in-place"], g["last-words"], 100 * (g["in-place"] - g["last-words"])
    if (g["in-place"] < g["last-words"]) ok = 0
    # Under ZeRO-1 no live replica holds the optimizer shard of a dead rank: only the copies of the tier catch it.
    printf "memory tier %.4f vs in place %.4f: %+.2f points (%s)\n", g["memory-tier"], g["in-place"], 100 * (g["memory-tier"] - g["in-place"]),
      (zero1 ? "target >= 0 under ZeRO-1" : "no target: a live replica covers most failures here")
    if (zero1 && g["memory-tier"] < g["in-place"]) ok = 0
    print (ok ? "PASS" : "FAIL")
  }' "$W/report" | tee -a "$W/report"
echo "(runs, logs and the report kept in $W)"
