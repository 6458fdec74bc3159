#!/usr/bin/env bash
# A relaunch's restore from the node tier (a benchmark, not a test): slurm-examples/train_ddp.py --zero1 as 2 local
# ranks (torchrun-style, each told it runs on a node of its own), MIB of extra parameters (each rank's shard: the
# weights and its half of AdamW's state), last words and the memory tier on, no periodic checkpoint, all launches
# one job (CKPT_JOB_ID). Rank 1 is killed (SIGKILL) at step 6; rank 0's last words write the terminal checkpoint,
# rank 1's shard from the partner copy rank 0 holds. Then both ranks are started again to the step it holds,
# ROUNDS times each way, in turn:
#   node  the node tier (/dev/shm, the default): every range from the staging files the killed processes left
#   fetch rank 1 as on a node that replaced its own (CKPT_NODE_DIR: an empty dir): it fetches its snapshot back
#         from the copy rank 0's killed process kept in rank 0's node tier; rank 0 as in `node`
#   cold  CKPT_NODE_DIR=off, the page cache dropped first: every byte from the disk, as from a parallel file system
#   warm  CKPT_NODE_DIR=off, the shards already in the page cache
# Prints each way's median restore time (the hooks' "restored step S from DIR in T s"), the bytes read from the
# checkpoint dir and found in memory, and the floor measured in the same run: one memcpy of a rank's shard (the
# weights and half of AdamW's two moments: twice MIB).
# Then the whole job killed at once (both ranks frozen, then killed: no survivor for last words), with a periodic
# checkpoint every K steps and a memory checkpoint every step, at a random step between K+5 and 2K-2. Both ranks
# are started again, ROUNDS times each way, to restore and stop:
#   dir   CKPT_NODE_DIR=off: the dir's newest periodic checkpoint, the page cache dropped first
#   node  the node tier: the newest memory step both ranks' staging files hold
#   fetch rank 1's node replaced, as above: the newest memory step, rank 1's from rank 0's node tier
# Prints the steps each way lost, each rank's median restore time and the bytes read from the checkpoint dir.
#   bench/memtier/relaunch.sh [MIB] [ROUNDS] [K]  (default 256 MiB, 3 rounds, K 20; root, for drop_caches)
set -euo pipefail
MIB=${1:-256}
ROUNDS=${2:-3}
K=${3:-20}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$SRC/bench/memtier/floor.sh"
export PYTHONPATH=${CKPT_BUILD_DIR:-$SRC/build}/python${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d /tmp/bench-relaunch.XXXXXX)
JOB=bench$$
trap '[ -n "${KEEP:-}" ] || rm -rf "$WORK" "/dev/shm/slurm-ckpt.$(id -u).$JOB"' EXIT

# launch NAME STEPS [VAR=VALUE...]: both ranks, into $WORK/NAME.r<rank>.log; rank 0's pid in $WORK/NAME.pid1 too.
# RANK1_ENV (VAR=VALUE words): rank 1's alone, after the rest.
RANK1_ENV=""
launch() {
  local name=$1 steps=$2 port=$((20000 + RANDOM % 10000)) r own
  shift 2
  for r in 0 1; do
    own=()
    [ "$r" = 1 ] && read -r -a own <<< "$RANK1_ENV"
    env MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$r WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      SLURMD_NODENAME=bench-node$r CKPT_JOB_ID=$JOB CKPT_RUN_ID="$JOB.$name" CKPT_DIR="$WORK/ckpt" \
      CKPT_INTERVAL=100000steps CKPT_LAST_WORDS=on CKPT_MEMORY=8G "$@" "${own[@]}" \
      /usr/bin/python3 "$SRC/slurm-examples/train_ddp.py" --zero1 --steps "$steps" --log-every 1 --extra-mib "$MIB" \
      --step-sleep 0.3 --out "$WORK/final" > "$WORK/$name.r$r.log" 2>&1 &
    echo $! > "$WORK/$name.pid$r"
  done
}

# replaced_node WAY: for `fetch`, rank 1's node dir is an empty one, as on a node that replaced its own.
replaced_node() {
  [ "$1" = fetch ] || return 0
  rm -rf "$WORK/replaced-node" && mkdir -p "$WORK/replaced-node"
  RANK1_ENV="CKPT_NODE_DIR=$WORK/replaced-node"
}

launch crash 1000
for _ in $(seq 600); do
  grep -q "^train_ddp: step 6 " "$WORK/crash.r0.log" 2> /dev/null && break
  sleep 0.1
done
kill -9 "$(cat "$WORK/crash.pid1")"
wait || true
term=$(sed 's/^0*//' "$WORK/ckpt/latest" 2> /dev/null || true)
[ -n "$term" ] || { tail -20 "$WORK/crash.r0.log" >&2; echo "relaunch: no terminal checkpoint after the kill" >&2; exit 1; }

for i in $(seq "$ROUNDS"); do
  for way in node fetch cold warm; do
    opts=()
    case $way in cold | warm) opts=(CKPT_NODE_DIR=off) ;; esac
    [ "$way" = cold ] && { sync; echo 3 > /proc/sys/vm/drop_caches; }
    replaced_node "$way"
    launch "$way$i" "$term" "${opts[@]}"
    wait
    RANK1_ENV=""
    for r in 0 1; do
      sed -n 's/.*restored step [0-9]* from .* in \([0-9.]*\) s (\([0-9]*\) bytes read, \([0-9]*\) found in memory).*/\1 \2 \3/p' \
        "$WORK/$way$i.r$r.log" >> "$WORK/$way.r$r.rows"
    done
  done
done
floor=$(memcpy_floor $((2 * MIB)))
echo "relaunch: ZeRO-1, ${MIB} MiB extra parameters, terminal checkpoint of step $term, $ROUNDS rounds per way"
for r in 0 1; do
  for way in node fetch cold warm; do
    [ -s "$WORK/$way.r$r.rows" ] || { echo "  rank $r, $way: no restore line" >&2; exit 1; }
    sort -n "$WORK/$way.r$r.rows" | awk -v way="$way" -v r="$r" '{ t[NR] = $1; rd += $2; m += $3 }
      END { printf "  rank %d (%s) %-5s median restore %.3f s, %.1f MiB read from the dir, %.1f MiB found in memory\n",
            r, r ? "killed" : "survivor", way, t[int((NR + 1) / 2)], rd / NR / 1048576, m / NR / 1048576 }'
  done
done
echo "  floor: one memcpy of a rank's state $floor s"

# ---- the whole job killed at once ----
# The first part's node tier goes first: its staging and copies (four snapshots per rank) would only crowd memory.
rm -rf "/dev/shm/slurm-ckpt.$(id -u).$JOB" "$WORK/replaced-node"
at=$((K + 5 + RANDOM % (K - 6)))
launch all 1000 CKPT_DIR="$WORK/all" CKPT_INTERVAL="${K}steps"
for _ in $(seq 3000); do
  grep -q "^train_ddp: step $at " "$WORK/all.r0.log" 2> /dev/null && break
  sleep 0.1
done
pids="$(cat "$WORK/all.pid0") $(cat "$WORK/all.pid1")"
# shellcheck disable=SC2086
kill -STOP $pids && kill -KILL $pids
wait || true
killed=$(sed -n 's/^train_ddp: step \([0-9]*\) .*/\1/p' "$WORK/all.r0.log" | tail -1)
periodic=$(sed 's/^0*//' "$WORK/all/latest" 2> /dev/null || true)
[ -n "$periodic" ] || { tail -20 "$WORK/all.r0.log" >&2; echo "relaunch: no periodic checkpoint before step $killed" >&2; exit 1; }
for i in $(seq "$ROUNDS"); do
  for way in dir node fetch; do
    opts=(CKPT_DIR="$WORK/all" CKPT_INTERVAL="${K}steps")
    [ "$way" = dir ] && { opts+=(CKPT_NODE_DIR=off); sync; echo 3 > /proc/sys/vm/drop_caches; }
    replaced_node "$way"
    launch "all-$way$i" 1 "${opts[@]}"  # resumes, trains no step (train_ddp.py runs steps start..STEPS-1)
    wait
    RANK1_ENV=""
    for r in 0 1; do
      sed -n "s/.*restored step \([0-9]*\) from .* in \([0-9.]*\) s (\([0-9]*\) bytes read, .*/\2 \1 \3 $r/p" \
        "$WORK/all-$way$i.r$r.log" >> "$WORK/all-$way.rows"
    done
  done
done
echo "relaunch: the whole job killed at step $killed (rank 0's last logged step), a periodic checkpoint every $K steps, a memory checkpoint every step, $ROUNDS rounds per way"
for way in dir node fetch; do
  [ "$(wc -l < "$WORK/all-$way.rows")" -eq $((2 * ROUNDS)) ] || { echo "  $way: not a restore line per rank and round" >&2; exit 1; }
  [ "$(cut -d' ' -f2 "$WORK/all-$way.rows" | sort -u | wc -l)" -eq 1 ] || { echo "  $way: the ranks resumed different steps" >&2; exit 1; }
  sort -n "$WORK/all-$way.rows" | awk -v way="$way" -v killed="$killed" '{ t[$4, ++n[$4]] = $1; s = $2; rd += $3 }
    END { printf "  %-5s resumed from step %d (%d step(s) lost), median restore rank 0 %.3f s, rank 1 %.3f s, %.1f MiB read from the dir per rank\n",
          way, s, killed - s, t[0, int((n[0] + 1) / 2)], t[1, int((n[1] + 1) / 2)], rd / NR / 1048576 }'
done
