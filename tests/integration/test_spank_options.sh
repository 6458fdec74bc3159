#!/usr/bin/env bash
# The SPANK plugin's --ckpt-* options and site policy, on the real 4-node cluster.
source "$(dirname "$0")/lib.sh"
D=$CKPT_CLUSTER_DIR
EXPECTED="(expected auto, a duration like 15m, or N steps)"

# srun --help lists every option.
srun --help > "$SCRATCH/help" 2>&1
for opt in interval dir keep last-words mtbf max-restarts grace spares; do assert_contains "$SCRATCH/help" "--ckpt-$opt"; done
pass "srun --help lists the options"

# Every task on all four nodes sees the normalized settings.
srun -N4 -n8 --ckpt-interval=15m --ckpt-dir="$SCRATCH/run-%j" --ckpt-mtbf=1h30m \
  bash -c 'echo "$SLURMD_NODENAME $SLURM_PROCID $SLURM_JOB_ID $(env | grep ^CKPT_ | sort | tr "\n" " ")"' > "$SCRATCH/env"
[ "$(wc -l < "$SCRATCH/env")" -eq 8 ] || fail "expected 8 task lines"
[ "$(awk '{print $1}' "$SCRATCH/env" | sort -u | wc -l)" -eq 4 ] || fail "tasks did not span 4 nodes"
job=$(awk 'NR==1 {print $3}' "$SCRATCH/env")
while read -r node rank jobid rest; do
  for kv in "CKPT_INTERVAL=900s" "CKPT_DIR=$SCRATCH/run-$jobid" "CKPT_KEEP=3" "CKPT_LAST_WORDS=on" "CKPT_MTBF=5400s" \
            "CKPT_GRACE=120s" "CKPT_MAX_RESTARTS=3" "CKPT_RESTART_COUNT=0" "CKPT_JOB_ID=$jobid" "CKPT_SPARES=0" \
            "CKPT_MAX_SPARES=4"; do
    [[ " $rest " == *" $kv "* ]] || fail "rank $rank on $node lacks $kv: $rest"
  done
done < "$SCRATCH/env"
[ -d "$SCRATCH/run-$job" ] || fail "CKPT_DIR was not created"
pass "all 8 tasks on 4 nodes see the normalized environment"

# With a time limit, ranks learn when it ends (for the terminal checkpoint CKPT_GRACE before it).
read -r end now < <(srun -t 5 -N1 --ckpt-interval=15m --ckpt-dir="$SCRATCH/limit" bash -c 'echo "${CKPT_END_TIME:-0} $(date +%s)"')
[ $((end - now)) -gt 240 ] && [ $((end - now)) -le 300 ] || fail "CKPT_END_TIME is $end, now $now (want about now + 300)"
pass "CKPT_END_TIME gives the time limit"

# Ranks learn the cluster's KillWait (5 s here), which bounds the last words.
wait=$(srun -N1 --ckpt-interval=15m --ckpt-dir="$SCRATCH/limit" bash -c 'echo "${CKPT_KILL_WAIT:-none}"')
[ "$wait" = 5s ] || fail "CKPT_KILL_WAIT is $wait, want 5s (KillWait in slurm.conf)"
pass "CKPT_KILL_WAIT gives the cluster's KillWait"

# Options given to sbatch reach every srun in the script, and the batch script itself.
cat > "$SCRATCH/job.sh" <<JOB
#!/bin/bash
#SBATCH -N2 -n2
#SBATCH --ckpt-interval=500steps
#SBATCH --ckpt-keep=2
echo "batch CKPT_INTERVAL=\$CKPT_INTERVAL"
srun bash -c 'echo "step \$SLURMD_NODENAME CKPT_INTERVAL=\$CKPT_INTERVAL CKPT_KEEP=\$CKPT_KEEP"'
JOB
sbatch -W -o "$SCRATCH/batch.out" --ckpt-dir="$SCRATCH/batch-%j" "$SCRATCH/job.sh" > /dev/null
assert_contains "$SCRATCH/batch.out" "batch CKPT_INTERVAL=500steps"
[ "$(grep -c 'step n.* CKPT_INTERVAL=500steps CKPT_KEEP=2' "$SCRATCH/batch.out")" -eq 2 ] || {
  cat "$SCRATCH/batch.out" >&2; fail "sbatch options did not reach srun"; }
pass "sbatch options reach srun"

# --ckpt-spares reaches the batch script, where ckpt-run reads it, with the site's limit (max_spares: 4, the
# built-in default, as tests/cluster.sh sets none).
sbatch -W -N1 -o "$SCRATCH/spares.out" --ckpt-spares=1 --ckpt-dir="$SCRATCH/spares-%j" \
  --wrap 'echo "batch CKPT_SPARES=$CKPT_SPARES CKPT_MAX_SPARES=$CKPT_MAX_SPARES"' > /dev/null
assert_contains "$SCRATCH/spares.out" "batch CKPT_SPARES=1 CKPT_MAX_SPARES=4"
pass "--ckpt-spares reaches the batch script"

# ckpt-run in that script: CKPT_SPARES picks restart in place without --spares (2 nodes: one trains, one is the
# spare), and an explicit --spares above CKPT_MAX_SPARES is a usage error.
RUN=$CKPT_BUILD_DIR/ckpt-run/ckpt-run
[ -x "$RUN" ] || fail "ckpt-run is not built"
cat > "$SCRATCH/spares-run.sh" <<JOB
#!/bin/bash
$RUN srun -N1 --ntasks-per-node=1 true; echo "env rc=\$?"
$RUN --spares 5 srun -N1 --ntasks-per-node=1 true; echo "over rc=\$?"
JOB
sbatch -W -N2 -o "$SCRATCH/spares-run.out" --ckpt-spares=1 --ckpt-dir="$SCRATCH/spares-run-%j" \
  "$SCRATCH/spares-run.sh" > /dev/null
assert_contains "$SCRATCH/spares-run.out" "ckpt-run: 1 nodes train, spares n"
assert_contains "$SCRATCH/spares-run.out" "env rc=0"
assert_contains "$SCRATCH/spares-run.out" "ckpt-run: --spares: 5 is above the site maximum of 4 (CKPT_MAX_SPARES)"
assert_contains "$SCRATCH/spares-run.out" "over rc=2"
pass "ckpt-run takes its spares from --ckpt-spares and keeps --spares within max_spares"

# An explicit srun option inside the script overrides the one inherited from sbatch.
sbatch -W -N1 -o "$SCRATCH/override.out" --ckpt-interval=15m --ckpt-dir="$SCRATCH/override-%j" \
  --wrap 'srun --ckpt-interval=5m bash -c "echo step CKPT_INTERVAL=\$CKPT_INTERVAL"' > /dev/null
assert_contains "$SCRATCH/override.out" "step CKPT_INTERVAL=300s"
pass "srun's own value overrides sbatch's"

# After a requeue, every step sees the job's restart count.
cat > "$SCRATCH/requeue.sh" <<'JOB'
#!/bin/bash
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then scontrol requeue "$SLURM_JOB_ID"; sleep 60; exit 0; fi
srun bash -c 'echo "step CKPT_RESTART_COUNT=$CKPT_RESTART_COUNT"'
JOB
job=$(sbatch --parsable -N1 --requeue --open-mode=append -o "$SCRATCH/requeue.out" --ckpt-interval=15m \
  --ckpt-dir="$SCRATCH/requeue-%j" "$SCRATCH/requeue.sh")
for _ in $(seq 240); do
  grep -q "^step " "$SCRATCH/requeue.out" 2>/dev/null && break
  if [ "$(scontrol show job "$job" | grep -oE 'Restarts=[0-9]+' | cut -d= -f2)" = 1 ]; then
    scontrol update jobid="$job" StartTime=now 2>/dev/null || true  # fails once it runs: that is fine
  fi
  sleep 0.5
done
wait_job_state "$job" COMPLETED 60
assert_contains "$SCRATCH/requeue.out" "step CKPT_RESTART_COUNT=1"
pass "CKPT_RESTART_COUNT follows requeues"

# A bad value refuses the job with one line naming the option and the value, in srun and in sbatch.
expect_fail srun -N1 --ckpt-interval=-5 true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-interval: invalid value '-5' $EXPECTED"
expect_fail sbatch --ckpt-interval=-5 --wrap true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-interval: invalid value '-5' $EXPECTED"
expect_fail srun -N1 --ckpt-keep=0 true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-keep: invalid value '0'"
expect_fail srun -N1 --ckpt-interval=15m --ckpt-interval=1h true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-interval: given twice with different values"
srun -N1 --ckpt-interval=15m --ckpt-interval=900s --ckpt-dir="$SCRATCH/twice" true || fail "same value twice was refused"
pass "bad values are refused with a clear line"

# A --ckpt-dir outside the allowed prefixes is refused.
expect_fail srun -N1 --ckpt-dir=/etc/ckpt-evil true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-dir: '/etc/ckpt-evil' is outside the allowed checkpoint dirs ($D/ckpt)"
expect_fail srun -N1 --ckpt-dir="$D/ckpt/../../etc" true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-dir: invalid value"
[ ! -e /etc/ckpt-evil ] || fail "a refused dir was created"
pass "dirs outside the allowed prefixes are refused"

# The site's interval minimum applies.
sed "s|min_interval=1s|min_interval=10m|" "$D/etc/plugstack.conf" > "$SCRATCH/plugstack-min.conf"
sed "s|^PlugStackConfig=.*|PlugStackConfig=$SCRATCH/plugstack-min.conf|" "$SLURM_CONF" > "$SCRATCH/slurm-min.conf"
SLURM_CONF=$SCRATCH/slurm-min.conf expect_fail srun -N1 --ckpt-interval=5m true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-interval: 5m is below the site minimum of 10m"
pass "interval bounds apply"

# Spares above the site's limit are refused before submission, with one line naming the value and the limit:
# the built-in max_spares (4), and one the site sets (max_spares=0: no spares at all).
expect_fail srun -N1 --ckpt-spares=5 true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-spares: 5 is above the site maximum of 4"
expect_fail sbatch --ckpt-spares=5 --wrap true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-spares: 5 is above the site maximum of 4"
assert_not_contains "$SCRATCH/out" "Submitted batch job"
sed "s|min_interval=1s|min_interval=1s max_spares=0|" "$D/etc/plugstack.conf" > "$SCRATCH/plugstack-nospares.conf"
sed "s|^PlugStackConfig=.*|PlugStackConfig=$SCRATCH/plugstack-nospares.conf|" "$SLURM_CONF" > "$SCRATCH/slurm-nospares.conf"
SLURM_CONF=$SCRATCH/slurm-nospares.conf expect_fail srun -N1 --ckpt-spares=1 true
assert_contains "$SCRATCH/err" "ckpt: --ckpt-spares: 1 is above the site maximum of 0 (the site allows no spares)"
pass "the spares limit applies"

# A typo in plugstack.conf fails closed and names the key.
sed "s|min_interval=1s|min_intervall=1s|" "$D/etc/plugstack.conf" > "$SCRATCH/plugstack-typo.conf"
sed "s|^PlugStackConfig=.*|PlugStackConfig=$SCRATCH/plugstack-typo.conf|" "$SLURM_CONF" > "$SCRATCH/slurm-typo.conf"
SLURM_CONF=$SCRATCH/slurm-typo.conf expect_fail srun -N1 true
assert_contains "$SCRATCH/err" "ckpt: plugstack.conf: unknown key 'min_intervall'"
pass "a plugstack typo fails closed"

# A job that asks for nothing gets nothing.
srun -N1 bash -c 'env | grep -E "^CKPT_(DIR|INTERVAL|KEEP|LAST_WORDS|MTBF|GRACE|MAX_RESTARTS|RESTART_COUNT|JOB_ID|RESUME_|SPARES|MAX_SPARES)" || true' \
  > "$SCRATCH/none"
[ ! -s "$SCRATCH/none" ] || { cat "$SCRATCH/none" >&2; fail "a job without --ckpt options got CKPT_ variables"; }
pass "no option, no environment"

# The checkpoint dir belongs to the job's user, mode 0700, never to root.
chown "$TEST_USER" "$SCRATCH"
runuser -u "$TEST_USER" -- env SLURM_CONF="$SLURM_CONF" srun -N2 -n2 --ckpt-interval=15m \
  --ckpt-dir="$SCRATCH/user-%u/%j" bash -c 'echo $CKPT_DIR' > "$SCRATCH/userdir"
userdir=$(head -n1 "$SCRATCH/userdir")
[ -d "$userdir" ] || fail "user's CKPT_DIR $userdir missing"
[ "$(stat -c '%U %a' "$userdir")" = "$TEST_USER 700" ] || fail "CKPT_DIR is $(stat -c '%U %a' "$userdir")"
[ "$(stat -c '%U' "$(dirname "$userdir")")" = "$TEST_USER" ] || fail "parent created as $(stat -c %U "$(dirname "$userdir")")"
pass "CKPT_DIR is created by and for the job's user"

finish
