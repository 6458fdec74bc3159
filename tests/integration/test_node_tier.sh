#!/usr/bin/env bash
# The node tier on the real local cluster (hooks/src/node_tier.hpp): slurm-examples/train_ddp.py --zero1 on 3 nodes,
# one rank each, the memory tier on (--ckpt-memory), no periodic checkpoint, inside allocations held by
# `salloc --no-shell` so that a relaunch is a new step of the same job, as ckpt-run's is.
#  1. A rank's process is killed (SIGKILL; its node lives on) at a random step. The survivors' last words write the
#     terminal checkpoint, the dead rank's shard from its partner's copy. Every rank's staging stays in
#     /dev/shm/slurm-ckpt.<uid>.<job> (each node's own /dev/shm).
#  2. The relaunch in the same job: every rank, the killed one too, takes its state from the files its node kept,
#     each range checked against the checkpoint's checksum (or, where every rank's node kept a newer memory step
#     whole, that step, checked against the checksums its index keeps), and reads next to nothing from the
#     checkpoint dir. The final weights are bitwise those of an uninterrupted run.
#  2b. Every task killed at once (no survivor for last words), nothing in the checkpoint dir: the relaunch resumes
#     every rank from the newest memory step their nodes kept, reading nothing from the dir; bitwise again. Before
#     that, with one node's tier lost (as when the node was replaced), its rank fetches its memory step back from
#     the copy its partner's node kept, and every rank resumes that step, reading nothing; with that copy lost too,
#     no rank takes the memory step: all walk back together (to step 0).
#  3. The job ends: the plugin's epilog removes its node tier.
#  4. Another job resumes from the same checkpoint dir with the first job's node tier (a copy taken after the crash:
#     the very bytes of the checkpoint) planted in its own node tier's dir, as a reused job id would find a tier
#     whose epilog failed. Planted before the job's first step, the plugin's job prolog removes it. Planted after,
#     it is never used: each rank says whose it was and reads its shard from the dir; the final weights are bitwise
#     the same again.
#  5. Attacks on the epilog (root): links to root's files in, or as, a user's node tier dir are removed, never what
#     they point at; another user's dir made under a job's name is refused by its ranks and left alone at the end.
#  6. plugstack.conf broken while a job runs: the job's epilog (which loads the plugin) drains no node.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
have_torch || fail "needs python3-torch and a built slurm_ckpt"
STEPS=30
EXTRA_MIB=16
tag=$RANDOM$RANDOM
held=()
cleanup() { for j in "${held[@]}"; do scancel "$j" 2> /dev/null || true; done; }
trap cleanup EXIT

# allocate NAME: a 3-node allocation without a shell; sets `job`.
allocate() {
  local out
  out=$(salloc -N3 -w 'n[1-3]' --no-shell -J "nodetier-$1-$tag" 2>&1) || { echo "$out" >&2; fail "salloc failed"; }
  job=$(sed -n 's/.*Granted job allocation \([0-9][0-9]*\).*/\1/p' <<< "$out")
  [ -n "$job" ] || { echo "$out" >&2; fail "no job id from salloc"; }
  held+=("$job")
}

# train LOG OUT [srun options...] -- [train_ddp args...]: one launch of the 3-rank ZeRO-1 job.
train() {
  local log=$1 out=$2 opts=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  MASTER_ADDR=$(rendezvous_addr) MASTER_PORT=$(free_port) \
    srun -N3 -n3 -w 'n[1-3]' --ckpt-interval="${INTERVAL:-100000steps}" --ckpt-last-words="${LAST_WORDS:-on}" "${opts[@]}" \
    "$PY" "$CKPT_SOURCE_DIR/slurm-examples/train_ddp.py" --zero1 --extra-mib $EXTRA_MIB --steps $STEPS \
    --out "$out" "$@" > "$log" 2>&1
}

# tier_dir NODE JOB [UID]: the job's node tier on NODE, as this host sees NODE's own /dev/shm.
tier_dir() { echo "$("$CLUSTER" shm "$1")/slurm-ckpt.${3:-$(id -u)}.$2"; }
# save_tiers JOB DEST / put_tiers SRC JOB: every node's tier of JOB, kept per node (DEST/n1 ...) and put back.
save_tiers() { local n; for n in n1 n2 n3; do rm -rf "${2:?}/$n"; mkdir -p "$2"; cp -a "$(tier_dir "$n" "$1")" "$2/$n"; done; }
put_tiers() { local n; for n in n1 n2 n3; do rm -rf "$(tier_dir "$n" "$2")"; cp -a "$1/$n" "$(tier_dir "$n" "$2")"; done; }
# The "restored step N from DIR in T s (R bytes read, M found in memory)" lines of LOG: "R M" per rank.
restored_bytes() { sed -n 's/.*restored step [0-9]* from .* (\([0-9]*\) bytes read, \([0-9]*\) found in memory).*/\1 \2/p' "$1"; }

# kill_every_task LOG: job $first's 3 tasks frozen together, then killed, so no rank outlives another long enough for
# last words (only this job's tasks: a node may run another job's beside them); waits for the srun ($pid). Sets
# `killed`, the last step LOG shows.
kill_every_task() {
  local tasks n p
  tasks=$(for n in n1 n2 n3; do
    for p in $("$CLUSTER" task-pids "$n"); do
      if tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "SLURM_JOB_ID=$first"; then echo "$p"; fi
    done
  done)
  [ "$(wc -w <<< "$tasks")" -eq 3 ] || fail "not 3 tasks of job $first to kill: $tasks"
  # shellcheck disable=SC2086
  kill -STOP $tasks || fail "a task of job $first was gone before the kill"
  # shellcheck disable=SC2086
  kill -KILL $tasks
  killed=$(logged_step "$1")
  for _ in $(seq 300); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  kill "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
}

train "$SCRATCH/straight.log" "$SCRATCH/straight.bin" -J "nodetier-straight-$tag" --ckpt-dir="$SCRATCH/straight" ||
  { cat "$SCRATCH/straight.log" >&2; fail "the uninterrupted run failed"; }
pass "uninterrupted ZeRO-1 run on 3 nodes ($EXTRA_MIB MiB of extra parameters): $(cat "$SCRATCH/straight.bin.sha256")"

# ---- 1. a rank killed: the terminal checkpoint, and every rank's staging left on its node ----
allocate first
first=$job
at=$((8 + RANDOM % 8))
victim=n$((1 + RANDOM % 3))
train "$SCRATCH/crash.log" "$SCRATCH/first.bin" --jobid="$first" --ckpt-memory=512M --ckpt-dir="$SCRATCH/ckpt" -- \
  --step-sleep 0.2 --log-every 1 &
pid=$!
wait_logged_step "$SCRATCH/crash.log" "$at" || { cat "$SCRATCH/crash.log" >&2; fail "no step $at"; }
"$CLUSTER" kill-tasks "$victim" > /dev/null
for _ in $(seq 300); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
kill "$pid" 2> /dev/null || true
wait "$pid" 2> /dev/null || true
term=$(latest_step "$SCRATCH/ckpt")
[ "$term" -gt 0 ] || { grep "last words\|memory tier\|node tier" "$SCRATCH/crash.log" >&2; fail "no terminal checkpoint after the kill on $victim"; }
for n in n1 n2 n3; do
  [ "$(ls "$(tier_dir $n "$first")"/*.json 2> /dev/null | wc -l)" -eq 1 ] ||
    { ls -la "$(tier_dir $n "$first")" >&2 || true; fail "the node tier of job $first on $n does not hold its rank's index"; }
done
save_tiers "$first" "$SCRATCH/first-tier"
pass "the tasks on $victim killed at step ~$at: terminal checkpoint of step $term; every rank's staging in its node's /dev/shm"

# ---- 2. the relaunch in the same job reads its state from the node tier ----
train "$SCRATCH/relaunch.log" "$SCRATCH/first.bin" --jobid="$first" --ckpt-memory=512M --ckpt-dir="$SCRATCH/ckpt" ||
  { cat "$SCRATCH/relaunch.log" >&2; fail "the relaunch failed"; }
# The terminal checkpoint's step, or a newer memory step every rank's node kept whole (the last words wrote the
# newest step whose every shard they could reach; the dead rank's own staging may hold a newer one).
resumed=$(sed -n 's/^train_ddp: resumed from step \([0-9]*\) .*/\1/p' "$SCRATCH/relaunch.log")
[ -n "$resumed" ] && [ "$resumed" -ge "$term" ] || { cat "$SCRATCH/relaunch.log" >&2; fail "the relaunch did not resume from step $term or later"; }
if [ "$resumed" -gt "$term" ]; then
  [ "$(grep -c "restored step $resumed from the node tier" "$SCRATCH/relaunch.log")" -eq 3 ] ||
    { grep "node tier\|restored" "$SCRATCH/relaunch.log" >&2; fail "step $resumed is newer than the dir's $term, but not every rank took it from its node tier"; }
fi
[ "$(grep -c "node tier: an earlier process of this job left the snapshots" "$SCRATCH/relaunch.log")" -eq 3 ] ||
  { grep "node tier\|restored" "$SCRATCH/relaunch.log" >&2; fail "not every rank found its node's staging"; }
restored_bytes "$SCRATCH/relaunch.log" > "$SCRATCH/relaunch.bytes"
[ "$(wc -l < "$SCRATCH/relaunch.bytes")" -eq 3 ] || { cat "$SCRATCH/relaunch.log" >&2; fail "not 3 restore lines"; }
while read -r read_bytes held_bytes; do
  [ "$read_bytes" -lt 1048576 ] && [ "$held_bytes" -ge $((EXTRA_MIB << 20)) ] ||
    { grep "node tier\|restored\|ranges" "$SCRATCH/relaunch.log" >&2; fail "a rank read $read_bytes bytes from the dir and found $held_bytes in memory"; }
done < "$SCRATCH/relaunch.bytes"
cmp -s "$SCRATCH/straight.bin" "$SCRATCH/first.bin" || fail "final weights differ after the relaunch from the node tier"
sed 's/^/  bytes read, found in memory: /' "$SCRATCH/relaunch.bytes"
pass "relaunched in job $first from step $resumed (the dir's newest: $term): every rank's state from its node's memory; final weights bitwise identical"

# ---- 2b. every task killed at once, so no last words: the relaunch resumes from the node's memory snapshot ----
# Nothing is in the checkpoint dir (no periodic checkpoint, no terminal one): the newest memory step every rank's
# node kept is newer, and the relaunch takes it, checked, reading nothing from the dir.
at=$((8 + RANDOM % 8))
train "$SCRATCH/all.log" "$SCRATCH/all.bin" --jobid="$first" --ckpt-memory=512M --ckpt-dir="$SCRATCH/whole" -- \
  --step-sleep 0.2 --log-every 1 &
pid=$!
wait_logged_step "$SCRATCH/all.log" "$at" || { cat "$SCRATCH/all.log" >&2; fail "no step $at"; }
kill_every_task "$SCRATCH/all.log"
[ "$(latest_step "$SCRATCH/whole")" -eq 0 ] || fail "a checkpoint in $SCRATCH/whole after killing every task"

# ---- 2c. one rank's node kept nothing: its partner's node did ----
# n2's tier gone, as when n2 was replaced by a node that holds nothing of the job: rank 1 (on n2) asks rank 2, its
# partner, for the copy of its memory checkpoint that rank 2's killed process kept on n3, and every rank resumes
# the memory step all three hold, each checked, reading nothing from the dir. Then the tier as the kill left it
# goes back.
save_tiers "$first" "$SCRATCH/all-tier"
rm -rf "$(tier_dir n2 "$first")"  # rank 1 runs on n2
train "$SCRATCH/one-lost.log" "$SCRATCH/one-lost.bin" --jobid="$first" --ckpt-memory=512M --ckpt-dir="$SCRATCH/whole" ||
  { cat "$SCRATCH/one-lost.log" >&2; fail "the relaunch with n2's node tier lost failed"; }
grep -q "rank 1: memory tier: this node holds no snapshot of this rank; fetched step [0-9]* of launch" "$SCRATCH/one-lost.log" &&
  grep -q "rank 2: memory tier: sent rank 1's relaunch its step" "$SCRATCH/one-lost.log" ||
  { grep "node tier\|memory tier\|restored" "$SCRATCH/one-lost.log" >&2; fail "rank 1 did not fetch its memory step from rank 2's node"; }
mem=$(sed -n 's/.*restored step \([0-9]*\) from the node tier .*/\1/p' "$SCRATCH/one-lost.log" | sort -u)
[ "$(grep -c "restored step [0-9]* from the node tier" "$SCRATCH/one-lost.log")" -eq 3 ] && [ "$(wc -w <<< "$mem")" -eq 1 ] &&
  [ "$mem" -ge $((killed - 2)) ] ||
  { grep "node tier\|memory tier\|restored\|resumed" "$SCRATCH/one-lost.log" >&2; fail "not every rank resumed one memory step (got '$mem', killed after step $killed)"; }
restored_bytes "$SCRATCH/one-lost.log" | while read -r read_bytes held_bytes; do
  [ "$read_bytes" -eq 0 ] && [ "$held_bytes" -ge $((EXTRA_MIB << 20)) ] ||
    fail "a rank read $read_bytes bytes from the dir and found $held_bytes in memory, with n2's tier lost"
done
cmp -s "$SCRATCH/straight.bin" "$SCRATCH/one-lost.bin" || fail "final weights differ after rank 1 fetched its memory step"
put_tiers "$SCRATCH/all-tier" "$first"
pass "n2's node tier lost: rank 1 fetched its memory step $mem back from the copy n3 kept; every rank resumed it, 0 bytes read; final weights bitwise identical"

# ---- 2d. rank 1's snapshot lost on its node and on its partner's: no rank resumes from memory alone ----
# n2's and n3's tiers gone: rank 2 fetches its own step back from n1, but rank 1's copy was on n3. Rank 0 proposes
# its memory step, rank 1 cannot take it, and every rank walks back to the dir, which holds nothing: all three
# start again at step 0. Then the tier as the kill left it goes back for 2b.
rm -rf "$(tier_dir n2 "$first")" "$(tier_dir n3 "$first")"
train "$SCRATCH/two-lost.log" "$SCRATCH/two-lost.bin" --jobid="$first" --ckpt-memory=512M --ckpt-dir="$SCRATCH/whole" ||
  { cat "$SCRATCH/two-lost.log" >&2; fail "the relaunch with n2's and n3's node tiers lost failed"; }
grep -q "rank 0: node tier: step [0-9]* of launch [^ ]* is in this node's memory" "$SCRATCH/two-lost.log" &&
  grep -q "rank 2: memory tier: this node holds no snapshot of this rank; fetched step" "$SCRATCH/two-lost.log" &&
  grep -q "rank 1: step [0-9]* of launch [^ ]*: not in this rank's node tier" "$SCRATCH/two-lost.log" &&
  grep -q "every rank walks back to the checkpoint dir" "$SCRATCH/two-lost.log" ||
  { grep "node tier\|memory tier\|walks back\|restored" "$SCRATCH/two-lost.log" >&2; fail "rank 0's memory step was not proposed and refused by rank 1"; }
# Asked before anyone checks it: no rank hashed a snapshot that rank 1 does not hold.
grep "from this node's memory, checked against their checksums" "$SCRATCH/two-lost.log" >&2 &&
  fail "a rank checked the memory step before every rank was known to hold it"
grep -q "restored step" "$SCRATCH/two-lost.log" && { grep "restored step" "$SCRATCH/two-lost.log" >&2; fail "a rank restored a step while rank 1 held none"; }
grep -q "^train_ddp: starting at step 0" "$SCRATCH/two-lost.log" || fail "the relaunch with rank 1's snapshots lost did not start at step 0"
cmp -s "$SCRATCH/straight.bin" "$SCRATCH/two-lost.bin" || fail "final weights differ after starting again at step 0"
put_tiers "$SCRATCH/all-tier" "$first"
pass "rank 1's snapshots lost on n2 and with n3's tier: rank 0's memory step was proposed, rank 1 could not take it, every rank started again at step 0; final weights bitwise identical"

train "$SCRATCH/all-relaunch.log" "$SCRATCH/all.bin" --jobid="$first" --ckpt-memory=512M --ckpt-dir="$SCRATCH/whole" ||
  { cat "$SCRATCH/all-relaunch.log" >&2; fail "the relaunch after killing every task failed"; }
mem=$(sed -n 's/.*restored step \([0-9]*\) from the node tier .*/\1/p' "$SCRATCH/all-relaunch.log" | sort -u)
[ "$(wc -w <<< "$mem")" -eq 1 ] && [ "$mem" -ge $((killed - 2)) ] ||
  { grep "node tier\|restored\|resumed" "$SCRATCH/all-relaunch.log" >&2; fail "the relaunch did not resume every rank from one memory step (got '$mem', killed after step $killed)"; }
grep -q "resumed from step $mem " "$SCRATCH/all-relaunch.log" || fail "the relaunch did not resume from step $mem"
restored_bytes "$SCRATCH/all-relaunch.log" > "$SCRATCH/all.bytes"
[ "$(wc -l < "$SCRATCH/all.bytes")" -eq 3 ] || fail "not 3 restore lines after killing every task"
while read -r read_bytes held_bytes; do
  [ "$read_bytes" -eq 0 ] && [ "$held_bytes" -ge $((EXTRA_MIB << 20)) ] ||
    { grep "node tier\|restored" "$SCRATCH/all-relaunch.log" >&2; fail "a rank read $read_bytes bytes from the dir and found $held_bytes in memory"; }
done < "$SCRATCH/all.bytes"
cmp -s "$SCRATCH/straight.bin" "$SCRATCH/all.bin" || fail "final weights differ after resuming from the node's memory"
{ grep "walks back to the checkpoint dir" "$SCRATCH/all-relaunch.log" || true; } | head -1 | sed 's/^/  /'
pass "every task killed after step $killed with no checkpoint in the dir: resumed from memory step $mem on every rank, 0 bytes read; final weights bitwise identical"

# ---- 2e. the dir's step is older than the newest copy a replaced node's rank fetched ----
# A checkpoint in the dir every 10 steps, a memory step every 5, every task killed after step 26: the dir's newest is
# step 20, and rank 2 (n3) holds rank 1's copies of steps 25 and 20. n2's tier gone (rank 1's node replaced) and
# rank 0's own step 25 dropped from n1's index: the relaunch resumes step 20 from the dir. Rank 1 fetched its newest
# copy (25) before the restore; for the dir's step it fetches step 20 too, and reads nothing from the dir.
INTERVAL=10steps train "$SCRATCH/straddle.log" "$SCRATCH/straddle.bin" --jobid="$first" --ckpt-memory=512M \
  --ckpt-memory-interval=5 --ckpt-dir="$SCRATCH/straddle" -- --step-sleep 0.3 --log-every 1 &
pid=$!
wait_logged_step "$SCRATCH/straddle.log" 26 || { cat "$SCRATCH/straddle.log" >&2; fail "no step 26"; }
kill_every_task "$SCRATCH/straddle.log"
[ "$(latest_step "$SCRATCH/straddle")" -eq 20 ] && [ "$killed" -lt 30 ] ||
  fail "killed after step $killed: the dir's newest is step $(latest_step "$SCRATCH/straddle"), not 20"
# index_steps NODE [WARD]: the steps NODE's tier holds whole, its rank's own or WARD's copies.
index_steps() {
  python3 - "$(tier_dir "$1" "$first")" "${2:-}" << 'PY'
import glob, json, sys
steps = set()
for f in glob.glob(sys.argv[1] + "/*.json"):
    for b in json.load(open(f)).get("buffers", []):
        if "step" in b and str(b.get("ward", "")) == sys.argv[2]:
            steps.add(b["step"])
print(" ".join(str(s) for s in sorted(steps)))
PY
}
[[ " $(index_steps n3 1) " == *" 20 25 "* ]] ||
  fail "rank 2's node does not hold rank 1's copies of steps 20 and 25 (it holds: $(index_steps n3 1))"
rm -rf "$(tier_dir n2 "$first")"
python3 - "$(tier_dir n1 "$first")" << 'PY'
import glob, json, os, sys
for f in glob.glob(sys.argv[1] + "/*.json"):
    index = json.load(open(f))
    index["buffers"] = [b for b in index["buffers"] if "ward" in b or b.get("step", 0) <= 20]
    with open(f + ".new", "w") as out:
        json.dump(index, out)
    st = os.stat(f)
    os.chown(f + ".new", st.st_uid, st.st_gid)
    os.chmod(f + ".new", st.st_mode & 0o777)
    os.replace(f + ".new", f)
PY
[ "$(index_steps n1)" = 20 ] || [ -z "$(index_steps n1)" ] || fail "rank 0's node still holds steps $(index_steps n1)"
train "$SCRATCH/straddle-relaunch.log" "$SCRATCH/straddle.bin" --jobid="$first" --ckpt-memory=512M \
  --ckpt-memory-interval=5 --ckpt-dir="$SCRATCH/straddle" ||
  { cat "$SCRATCH/straddle-relaunch.log" >&2; fail "the relaunch with n2's tier lost and the dir at step 20 failed"; }
grep -q "^train_ddp: resumed from step 20 " "$SCRATCH/straddle-relaunch.log" ||
  { grep "node tier\|memory tier\|restored\|resumed" "$SCRATCH/straddle-relaunch.log" >&2; fail "the relaunch did not resume from the dir's step 20"; }
grep -q "rank 1: memory tier: this node holds no snapshot of this rank; fetched step 25 " "$SCRATCH/straddle-relaunch.log" &&
  grep -q "rank 1: memory tier: this node lacks this rank's step 20 of launch [^ ]*; fetched it" "$SCRATCH/straddle-relaunch.log" ||
  { grep "node tier\|memory tier\|restored" "$SCRATCH/straddle-relaunch.log" >&2; fail "rank 1 did not fetch step 25, then step 20, from rank 2's node"; }
grep "rank 1: restored step 20 " "$SCRATCH/straddle-relaunch.log" > "$SCRATCH/straddle.line" || fail "no restore line of rank 1"
read -r read_bytes held_bytes < <(restored_bytes "$SCRATCH/straddle.line")
[ "$read_bytes" -eq 0 ] && [ "$held_bytes" -ge $((EXTRA_MIB << 20)) ] ||
  { grep "node tier\|memory tier\|restored" "$SCRATCH/straddle-relaunch.log" >&2; fail "rank 1 read $read_bytes bytes from the dir and found $held_bytes in memory"; }
cmp -s "$SCRATCH/straight.bin" "$SCRATCH/straddle.bin" || fail "final weights differ after rank 1 fetched step 20"
pass "the dir at step 20, rank 1's node replaced, its partner holding its steps 25 and 20: rank 1 fetched 25, then 20 for the dir's round, and read nothing; final weights bitwise identical"

# ---- 3. the job's end removes its node tier ----
scancel "$first"
for n in n1 n2 n3; do
  for _ in $(seq 200); do [ -e "$(tier_dir $n "$first")" ] || break; sleep 0.1; done
  [ -e "$(tier_dir $n "$first")" ] && fail "job $first's node tier on $n outlived the job"
done
pass "job $first ended: the epilog removed its node tier on every node"

# ---- 4. another job's tier in this job's dir, with the checkpoint's very bytes: never used ----
allocate second
second=$job
put_tiers "$SCRATCH/first-tier" "$second"
srun -N3 -w 'n[1-3]' --jobid="$second" true || fail "the second job's first step failed"
for n in n1 n2 n3; do
  [ -e "$(tier_dir $n "$second")" ] && { ls -la "$(tier_dir $n "$second")" >&2; fail "the job prolog left job $first's node tier planted in job $second's dir on $n"; }
done
pass "job $first's node tier planted in job $second's dir before its first step: the job prolog removed it"
put_tiers "$SCRATCH/first-tier" "$second"
train "$SCRATCH/second.log" "$SCRATCH/second.bin" --jobid="$second" --ckpt-memory=512M --ckpt-dir="$SCRATCH/ckpt" ||
  { cat "$SCRATCH/second.log" >&2; fail "the second job failed"; }
grep -q "resumed from step $term " "$SCRATCH/second.log" || { cat "$SCRATCH/second.log" >&2; fail "the second job did not resume from step $term"; }
[ "$(grep -c "was left by job $first on n[1-3] for $SCRATCH/ckpt, not this run's (job $second" "$SCRATCH/second.log")" -eq 3 ] ||
  { grep "node tier" "$SCRATCH/second.log" >&2; fail "not every rank refused job $first's node tier"; }
grep -q "node tier: an earlier process" "$SCRATCH/second.log" && fail "the second job used a node tier"
restored_bytes "$SCRATCH/second.log" > "$SCRATCH/second.bytes"
while read -r read_bytes held_bytes; do
  [ "$read_bytes" -ge $((EXTRA_MIB << 20)) ] && [ "$held_bytes" -eq 0 ] ||
    { grep "node tier\|restored" "$SCRATCH/second.log" >&2; fail "a rank read $read_bytes bytes and found $held_bytes in memory"; }
done < "$SCRATCH/second.bytes"
[ "$(wc -l < "$SCRATCH/second.bytes")" -eq 3 ] || fail "not 3 restore lines in the second job"
cmp -s "$SCRATCH/straight.bin" "$SCRATCH/second.bin" || fail "final weights differ in the second job"
grep "was left by job" "$SCRATCH/second.log" | head -1 | sed 's/^/  /'
pass "job $second never used job $first's node tier planted in its dir: every rank read its shard from the checkpoint dir; final weights bitwise identical"
scancel "$second"

# ---- 5. attacks on the epilog, which runs as root ----
# A user's job points its node tier (or a link inside it) at files root owns: the epilog removes only the links.
mkdir -p "$SCRATCH/precious"
echo keep > "$SCRATCH/precious/file"
chmod 755 "$SCRATCH/precious"
as_user() { runuser -u "$TEST_USER" -- env SLURM_CONF="$SLURM_CONF" "$@"; }
uid=$(id -u "$TEST_USER")
mkdir -p "$SCRATCH/user"
chown "$TEST_USER" "$SCRATCH/user"
for plant in inside top; do
  as_user srun -N1 -w n1 -J "nodetier-$plant-$tag" bash -c '
    d=/dev/shm/slurm-ckpt.$(id -u).$SLURM_JOB_ID
    if [ "$1" = inside ]; then
      mkdir -m 700 "$d" && ln -s "$2" "$d/escape" && ln -s "$2/file" "$d/file-link"
    else
      ln -s "$2" "$d"
    fi
    echo "$SLURM_JOB_ID" > "$3/$1.job"' _ "$plant" "$SCRATCH/precious" "$SCRATCH/user" 2> "$SCRATCH/$plant.err" ||
    { cat "$SCRATCH/$plant.err" >&2; fail "the $plant job could not run"; }
done
for plant in inside top; do
  [ -s "$SCRATCH/user/$plant.job" ] || fail "the $plant job did not run (as $TEST_USER)"
  d=$(tier_dir n1 "$(cat "$SCRATCH/user/$plant.job")" "$uid")
  for _ in $(seq 100); do [ -e "$d" ] || [ -L "$d" ] || break; sleep 0.1; done
  { [ -e "$d" ] || [ -L "$d" ]; } && fail "$plant: $d outlived its job"
  [ "$(cat "$SCRATCH/precious/file" 2> /dev/null)" = keep ] || fail "$plant: the epilog removed what a link pointed at"
done
pass "links to root's files in (and as) a user's node tier: the epilog removed the links, not what they point at"

# Another user makes a job's node tier dir before the job's ranks do: the tier is off with one line, training goes
# on from the dir, and the epilog leaves the squatter's dir alone.
allocate squatted
for n in n1 n2 n3; do  # made here on each node's /dev/shm, then the user's, as the user would have made it
  mkdir -m 700 "$(tier_dir $n "$job")" && touch "$(tier_dir $n "$job")/mine" && chown -R "$TEST_USER" "$(tier_dir $n "$job")"
done
STEPS=4 train "$SCRATCH/squatted.log" "$SCRATCH/squatted.bin" --jobid="$job" --ckpt-memory=512M \
  --ckpt-dir="$SCRATCH/squatted" || { cat "$SCRATCH/squatted.log" >&2; fail "the squatted job failed"; }
[ "$(grep -c "node tier off: /dev/shm/slurm-ckpt.$(id -u).$job is owned by uid $uid" "$SCRATCH/squatted.log")" -eq 3 ] ||
  { grep "node tier" "$SCRATCH/squatted.log" >&2; fail "not every rank refused the squatted dir"; }
scancel "$job"
sleep 2
for n in n1 n2 n3; do
  [ -e "$(tier_dir $n "$job")/mine" ] || fail "the epilog removed another user's dir on $n"
  rm -rf "$(tier_dir $n "$job")"
done
pass "a node tier dir made by $TEST_USER for root's job: refused by every rank, training went on, left alone at the end"

# ---- 6. plugstack.conf broken while a job runs: its epilog must not drain the node ----
stack=$CKPT_CLUSTER_DIR/etc/plugstack.conf
cp "$stack" "$SCRATCH/plugstack.conf"
trap 'cp "$SCRATCH/plugstack.conf" "$stack"; cleanup' EXIT
allocate edited
sed -i 's/$/ no_such_key=1/' "$stack"
scancel "$job"
for _ in $(seq 100); do squeue -h -j "$job" 2> /dev/null | grep -q . || break; sleep 0.1; done
sleep 2
cp "$SCRATCH/plugstack.conf" "$stack"
trap cleanup EXIT
states=$(sinfo -h -n 'n[1-3]' -o '%n %T')
grep -qiE "drain|fail" <<< "$states" && { echo "$states" >&2; fail "a typo in plugstack.conf drained a node at a job's end"; }
pass "plugstack.conf broken while job $job ran: its epilog drained no node ($(tr '\n' ' ' <<< "$states"))"
finish
