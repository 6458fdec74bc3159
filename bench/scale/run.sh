#!/usr/bin/env bash
# The in-job protocol's per-rank costs against the world size (issue 11), on the local 4-node cluster; a
# benchmark, not a test. For each N it runs bench_scale_rank (STATE_BYTES of host state per rank, 4 KiB unless
# -b; layout dp=N; steps of STEP_MS, a checkpoint every K steps) twice with the same checkpoint dir:
#   train:  srun -N4 -n N -O --ckpt-last-words=on --ckpt-dir=DIR --ckpt-interval=Ksteps, STEPS steps from scratch;
#   resume: the same command, which resumes from the newest checkpoint; once rank 0 is 10 steps past the resume
#           step, one rank (N/2, on the third node) is SIGKILLed and the survivors' last words are timed;
#   freeze: the same again, but rank N/2 is SIGSTOPped: only silence tells (a frozen process; freezing a whole node
#           of the shared cluster would stop other jobs), then SIGKILLed once the others are done or after 20 s.
# With -V node, every rank of the third node (N/2 to 3N/4-1) is killed or stopped at once instead of rank N/2: a
# crashed or frozen node as the job sees it. With -V nodes, every rank of the third and fourth nodes (N/2 to N-1,
# half the job): two nodes at once, as a switch or a rack takes them. Every run checks each rank's restored state bitwise against a replay.
# A few ranks of each run (0, 1 and N-1; TRACE) run under strace to count their file-system operations on the
# checkpoint dir. bench/scale/report.py turns the results into the table and the fits against N.
#
# With -R pmix the steps run under srun --mpi=pmix and the network's rendezvous goes through PMIx (one fence);
# with -R files (the default) through one address file per rank (CKPT_RENDEZVOUS).
#
# With -M SIZE the memory tier is on (--ckpt-memory=SIZE, a memory checkpoint every step): each rank's copy goes to
# the rank one node on, over one more link each way, and the connection and message counts include them.
#
#   bench/scale/run.sh [-n "16 32 64 96 128 256"] [-s STEPS] [-r RESUME_STEPS] [-k K] [-m STEP_MS] [-w on|off]
#                      [-T TIMEOUT_S] [-o OUT] [-V rank|node|nodes] [-b STATE_BYTES] [-R files|pmix] [-M SIZE] [-F]
#                      (-F: no freeze)
# Needs the cluster up (tests/cluster.sh up) and bench_scale_rank built in $CKPT_BUILD_DIR (default build/).
# Each run holds the cluster lock ($CKPT_CLUSTER_LOCK, /tmp/ckpt-cluster.lock) while it runs.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${CKPT_BUILD_DIR:-$SRC/build}
PROG=$BUILD/bench/bench_scale_rank
D=${CKPT_CLUSTER_DIR:-/tmp/slurm-ckpt-cluster}
export SLURM_CONF=${SLURM_CONF:-$D/etc/slurm.conf}
LOCK=${CKPT_CLUSTER_LOCK:-/tmp/ckpt-cluster.lock}

SIZES="16 32 64 96 128 256"
STEPS=100
RESUME_STEPS=40
K=20
STEP_MS=50
STATE_BYTES=4096
WARMUP=5
LAST_WORDS=on
TIMEOUT=240
OUT=""
FREEZE=1
VICTIM=rank
RENDEZVOUS=files
MEMORY=off
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while getopts "n:s:r:k:m:w:T:o:V:b:R:M:Fh" opt; do
  case $opt in
    n) SIZES=$OPTARG ;;
    s) STEPS=$OPTARG ;;
    r) RESUME_STEPS=$OPTARG ;;
    k) K=$OPTARG ;;
    m) STEP_MS=$OPTARG ;;
    b) STATE_BYTES=$OPTARG ;;
    w) LAST_WORDS=$OPTARG ;;
    T) TIMEOUT=$OPTARG ;;
    o) OUT=$OPTARG ;;
    F) FREEZE=0 ;;
    V) VICTIM=$OPTARG ;;
    R) RENDEZVOUS=$OPTARG ;;
    M) MEMORY=$OPTARG ;;
    *) usage ;;
  esac
done
die() { echo "bench/scale: $*" >&2; exit 1; }
case $VICTIM in rank | node | nodes) ;; *) die "-V takes rank, node or nodes, not '$VICTIM'" ;; esac
case $RENDEZVOUS in
  files) MPI=() ;;
  pmix) MPI=(--mpi=pmix) ;;
  *) die "-R takes files or pmix, not '$RENDEZVOUS'" ;;
esac
export CKPT_RENDEZVOUS=$RENDEZVOUS
[ -x "$PROG" ] || die "$PROG is not built (cmake --build $BUILD --target bench_scale_rank)"
"$SRC/tests/cluster.sh" status > /dev/null 2>&1 || die "the cluster is not up (tests/cluster.sh up)"
OUT=${OUT:-/tmp/bench-scale.$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$OUT"
# The checkpoint dirs live under the cluster's allowed dir, the job user's own (root here), mode 0700.
CKROOT=$(mktemp -d "$D/ckpt/bench-scale.XXXXXX")
chmod 700 "$CKROOT"
{
  echo "command: $0 $*"
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  changes=$(git -C "$SRC" diff --quiet HEAD -- hooks core 2> /dev/null ||
    echo " + uncommitted changes under hooks/ or core/")
  echo "source: $(git -C "$SRC" rev-parse --short HEAD)$changes," \
    "library $(readlink -f "$BUILD/hooks/libckpt.so") built $(date -u -r "$BUILD/hooks/libckpt.so" '+%H:%M UTC')"
  echo "host: $(hostname) $(nproc) CPUs," \
    "$(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -r)"
  echo "settings: sizes=$SIZES steps=$STEPS resume_steps=$RESUME_STEPS interval=${K}steps step_ms=$STEP_MS state_bytes=$STATE_BYTES" \
    "warmup=$WARMUP last_words=$LAST_WORDS victim=$VICTIM rendezvous=$RENDEZVOUS memory=$MEMORY"
  echo "ckpt_root: $CKROOT"
} > "$OUT/meta"
cat "$OUT/meta"

job=""
cleanup() { [ -n "$job" ] && scancel --name="$job" > /dev/null 2>&1 || true; }
trap cleanup EXIT

# run_phase N PHASE STEPS [KILL_AT_STEP [SIGNAL]]: one srun; waits for it (at most TIMEOUT s); once rank 0 reaches
# KILL_AT_STEP, sends SIGNAL (KILL, or STOP: then KILL once every other rank is done, or 20 s later) to rank N/2.
run_phase() {
  local n=$1 phase=$2 steps=$3 kill_at=${4:-} signal=${5:-KILL} dir=$OUT/n$1/$2 ckdir=$CKROOT/n$1 pid t0 t_kill=""
  local victim="" rc load0 victim_pid="" done_ranks
  mkdir -p "$dir/pids" "$dir/strace"
  job=bench-scale-$$-n$n-$phase
  local extra=()
  [ -n "$kill_at" ] && extra=(--marker-step "$kill_at")
  load0=$(cut -d' ' -f1-3 /proc/loadavg)
  t0=$(date +%s.%N)
  BENCH_SCALE_TRACE="0,1,$((n - 1))" BENCH_SCALE_STRACE=$dir/strace \
    srun -N4 -n"$n" -O "${MPI[@]}" -J "$job" --ckpt-last-words="$LAST_WORDS" --ckpt-dir="$ckdir" --ckpt-interval="${K}steps" --ckpt-memory="$MEMORY" \
    "$SRC/bench/scale/wrap.sh" "$PROG" --out "$dir" --steps "$steps" --step-ms "$STEP_MS" --state-bytes "$STATE_BYTES" --warmup "$WARMUP" \
    "${extra[@]}" > "$dir/log" 2>&1 {lock}>&- &
  pid=$!
  local deadline=$(( $(date +%s) + TIMEOUT ))
  while kill -0 "$pid" 2>/dev/null; do
    if [ -n "$kill_at" ] && [ -z "$t_kill" ] && [ -f "$dir/marker" ]; then
      # rank: rank N/2. node: every rank of the third node (ranks N/2 to 3N/4-1 under srun's block distribution),
      # all at once: a crashed or frozen node as its peers see it. nodes: the third and fourth (N/2 to N-1).
      victim=$((n / 2))
      last=$victim
      [ "$VICTIM" = node ] && last=$((3 * n / 4 - 1))
      [ "$VICTIM" = nodes ] && last=$((n - 1))
      victim_pid=""
      for r in $(seq "$victim" "$last"); do
        [ -f "$dir/pids/rank-$r" ] && victim_pid="$victim_pid $(cat "$dir/pids/rank-$r")"
      done
      if [ -n "$victim_pid" ]; then
        t_kill=$(date +%s.%N)
        # shellcheck disable=SC2086
        kill -"$signal" $victim_pid 2>/dev/null || t_kill=""
      fi
      [ "$VICTIM" = rank ] || victim="$victim-$last"
    fi
    if [ "$signal" = STOP ] && [ -n "$t_kill" ] && [ -n "$victim_pid" ]; then
      done_ranks=$(find "$dir" -maxdepth 1 -name 'rank-*.txt' | wc -l)
      if [ "$done_ranks" -ge $((n - $(wc -w <<< "$victim_pid"))) ] || \
         [ "$(awk -v a="$(date +%s.%N)" -v b="$t_kill" 'BEGIN { print (a - b > 20) }')" = 1 ]; then
        # shellcheck disable=SC2086
        kill -KILL $victim_pid 2>/dev/null || true
        victim_pid=""
      fi
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "bench/scale: N=$n $phase: still running after ${TIMEOUT}s; cancelling it" >&2
      scancel --name="$job" > /dev/null 2>&1 || true
      echo "timeout=$TIMEOUT" >> "$dir/phase"
      deadline=$(( $(date +%s) + 60 ))
    fi
    sleep 0.05
  done
  rc=0
  wait "$pid" || rc=$?
  job=""
  {
    echo "n=$n"
    echo "rc=$rc"
    echo "t_start=$t0"
    echo "t_done=$(date +%s.%N)"
    echo "victim=$victim"
    echo "t_kill=$t_kill"
    echo "signal=$signal"
    echo "ckpt_dir=$ckdir"
    echo "loadavg_start=$load0"
    echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
  } >> "$dir/phase"
  printf 'N=%-5s %-6s srun rc %-3s %5.1f s, %s rank results\n' "$n" "$phase" "$rc" \
    "$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { print a - b }')" "$(ls "$dir" | grep -c '^rank-.*\.txt$' || true)"
}

for n in $SIZES; do
  exec {lock}> "$LOCK"
  flock "$lock"
  run_phase "$n" train "$STEPS"
  # A copy of the checkpoint dir's listing (sizes, files per step) before the resume run adds to it.
  (cd "$CKROOT/n$n" && find . -printf '%y %s %p\n' | sort -k3) > "$OUT/n$n/train/ckpt-listing" 2>/dev/null || true
  kill_at=""
  [ "$LAST_WORDS" = on ] && kill_at=$((STEPS + WARMUP + 5))
  run_phase "$n" resume $((STEPS + RESUME_STEPS)) $kill_at
  (cd "$CKROOT/n$n" && find . -printf '%y %s %p\n' | sort -k3) > "$OUT/n$n/resume/ckpt-listing" 2>/dev/null || true
  if [ -n "$kill_at" ] && [ "$FREEZE" = 1 ]; then
    # From whatever the resume run left (its terminal checkpoint, else the newest periodic one).
    resumed=$(sed -n 's/^0*\([0-9]\)/\1/p' "$CKROOT/n$n/latest" 2>/dev/null || true)
    resumed=${resumed:-$STEPS}
    # Silence takes 1.5 s (30 steps of 50 ms) to tell: the run goes on 4 s past the freeze at least.
    run_phase "$n" freeze $((resumed + WARMUP + 5 + RESUME_STEPS + 4000 / STEP_MS)) $((resumed + WARMUP + 5)) STOP
  fi
  flock -u "$lock"
  exec {lock}>&-
done
python3 "$SRC/bench/scale/report.py" "$OUT" | tee "$OUT/report.md"
echo "(results in $OUT; checkpoints in $CKROOT)"
