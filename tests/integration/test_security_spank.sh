#!/usr/bin/env bash
# What a hostile or careless user can do to the plugin on the real cluster. None of it may drain or down a node,
# and no co-user may choose where another user's checkpoints live: every failure ends only the user's own job,
# with one "ckpt:" line in the job's output, and `sinfo -R` stays empty.
source "$(dirname "$0")/lib.sh"
"$CLUSTER" up > /dev/null
D=$CKPT_CLUSTER_DIR
CO_USER=nobody  # the co-user who squats and plants

drained() { sinfo -h -R -o '%N: %E' 2>/dev/null || true; }
[ -z "$(drained)" ] || fail "nodes were drained before the test: $(drained)"
chown "$TEST_USER" "$SCRATCH"
as_user() { runuser -u "$TEST_USER" -- env SLURM_CONF="$SLURM_CONF" "$@"; }

# expect_job_refused NAME TEXT SBATCH-ARGS...: a batch job of the test user fails on its node, its output names
# the reason in one ckpt: line, its script never ran, and no node is drained.
expect_job_refused() {
  local name=$1 text=$2
  shift 2
  local out=$SCRATCH/$name.out
  if as_user sbatch -W -N1 -o "$out" "$@" > "$SCRATCH/$name.submit" 2>&1; then
    cat "$out" >&2
    fail "$name: the job succeeded"
  fi
  [ "$(grep -c "ckpt: " "$out")" -eq 1 ] || { cat "$out" >&2; fail "$name: expected one ckpt: line"; }
  assert_contains "$out" "$text"
  assert_not_contains "$out" "the script ran"
  [ -z "$(drained)" ] || fail "$name drained a node: $(drained)"
  pass "$name: refused on the node, the node stays in service"
}

# 1. A checkpoint dir that is a file (the node finds out, not sbatch).
as_user touch "$SCRATCH/afile"
expect_job_refused file "is not a directory" --ckpt-dir="$SCRATCH/afile/%j" --wrap 'echo the script ran'

# 2. A job name that would climb out of the dir or break the log into two lines: refused at submission, with the
# name the user gave (slurmstepd checks the expansion again with the job's real name).
expect_fail as_user sbatch -N1 -J $'two\nlines' --ckpt-dir="$SCRATCH/%x" --wrap 'echo the script ran'
assert_contains "$SCRATCH/err" "ckpt: --ckpt-dir: invalid value '$SCRATCH/%x': %x expands to 'two\\x0alines', which contains a control character"
expect_fail as_user sbatch -N1 --job-name=.. --ckpt-dir="$SCRATCH/%x" --wrap 'echo the script ran'
assert_contains "$SCRATCH/err" "%x expands to '..'"
pass "a bad job name is refused at submission with the name the user gave"

# 3. A parent squatted by a co-user before the user's first job: world-writable, the co-user's.
install -d -o "$CO_USER" -m 0777 "$SCRATCH/squat"
expect_job_refused squat "'$SCRATCH/squat' (owner uid $(id -u "$CO_USER"), mode 0777)" \
  --ckpt-dir="$SCRATCH/squat/%u/%j" --wrap 'echo the script ran'
[ -z "$(ls -A "$SCRATCH/squat")" ] || fail "something was created in the squatted dir: $(ls -A "$SCRATCH/squat")"
pass "nothing was created below the squatted dir"

# 4. A symlink planted by the co-user in a sticky dir, pointing at a "complete" checkpoint of their own.
install -d -o root -m 1777 "$SCRATCH/sticky"
install -d -o "$CO_USER" -m 0755 "$SCRATCH/planted" "$SCRATCH/planted/000000000500"
echo '{}' > "$SCRATCH/planted/000000000500/MANIFEST.json"
runuser -u "$CO_USER" -- ln -s "$SCRATCH/planted" "$SCRATCH/sticky/$TEST_USER"
expect_job_refused symlink "is a symlink of another user" --ckpt-dir="$SCRATCH/sticky/%u" \
  --wrap 'echo the script ran; env | grep ^CKPT_RESUME'
assert_not_contains "$SCRATCH/symlink.out" "CKPT_RESUME"

# 5. The same refusals in a step started by srun: the step fails, the node stays.
expect_fail as_user srun -N2 --ckpt-dir="$SCRATCH/squat/%u" bash -c 'echo the script ran'
assert_contains "$SCRATCH/err" "belongs to neither root nor the job's user"
assert_not_contains "$SCRATCH/out" "the script ran"
[ -z "$(drained)" ] || fail "a refused srun drained a node: $(drained)"
pass "a refused srun step fails without draining its nodes"

# 6. An option value that reaches slurmstepd unchecked (set in the job's environment, past sbatch's checks).
expect_job_refused env_option "ckpt-keep" --ckpt-dir="$SCRATCH/env-%j" \
  --export=ALL,_SLURM_SPANK_OPTION_ckpt_ckpt_keep=lots \
  --wrap 'echo the script ran'

# A good job still runs, and the nodes took every job above.
as_user sbatch -W -N1 -o "$SCRATCH/good.out" --ckpt-dir="$SCRATCH/good-%j" --wrap 'echo "dir $CKPT_DIR"' > /dev/null
assert_contains "$SCRATCH/good.out" "dir $SCRATCH/good-"
[ -z "$(drained)" ] || fail "nodes drained: $(drained)"
pass "sinfo -R is empty after every hostile job"
finish
