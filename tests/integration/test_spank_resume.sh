#!/usr/bin/env bash
# At job start the plugin picks the newest complete, verified checkpoint on every node: with a complete step 200,
# a corrupt step 300 and an incomplete step 400, every rank resumes from 200; 300 is marked FAILED and nothing
# is deleted.
source "$(dirname "$0")/lib.sh"
CRASHER=$CKPT_BUILD_DIR/tests/store_crasher
dir=$SCRATCH/ckpt

"$CRASHER" save "$dir" 200 --world 4 --bytes 65536 > /dev/null
"$CRASHER" save "$dir" 300 --world 4 --bytes 65536 > /dev/null
# Flip one bit in the middle of rank 1's shard of step 300.
shard=$dir/000000000300/rank-00001.shard
byte=$(od -An -tu1 -j 30000 -N1 "$shard" | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" | dd of="$shard" bs=1 seek=30000 conv=notrunc status=none
# Step 400 dies after its shards are durable and before its manifest: incomplete.
"$CRASHER" save "$dir" 400 --world 4 --bytes 65536 --kill-at ShardsDurable > /dev/null 2>&1 && fail "crasher survived"
[ ! -e "$dir/000000000400/MANIFEST.json" ] || fail "step 400 has a manifest"

srun -N4 -n8 --ckpt-interval=15m --ckpt-dir="$dir" \
  bash -c 'echo "$SLURMD_NODENAME ${CKPT_RESUME_STEP:-none} ${CKPT_RESUME_PATH:-none} $SLURM_JOB_ID"' > "$SCRATCH/resume"
[ "$(wc -l < "$SCRATCH/resume")" -eq 8 ] || fail "expected 8 ranks"
[ "$(awk '{print $1}' "$SCRATCH/resume" | sort -u | wc -l)" -eq 4 ] || fail "ranks did not span 4 nodes"
while read -r node step path _; do
  [ "$step" = 200 ] || fail "a rank on $node got CKPT_RESUME_STEP=$step"
  [ "$path" = "$dir/000000000200" ] || fail "a rank on $node got CKPT_RESUME_PATH=$path"
done < "$SCRATCH/resume"
pass "every rank on every node resumes from step 200"

[ -e "$dir/000000000300/FAILED" ] || fail "corrupt step 300 was not marked FAILED"
[ -e "$dir/000000000300/rank-00001.shard" ] || fail "the corrupt checkpoint was deleted"
[ -d "$dir/000000000400" ] || fail "the incomplete checkpoint was deleted"
pass "step 300 is marked FAILED, nothing is deleted"

# The nodes' logs say where this job resumes from and why step 300 was skipped.
job=$(awk '{print $4}' "$SCRATCH/resume" | sort -u)
cat "$CKPT_CLUSTER_DIR"/log/slurmd-n*.log | grep -F "ckpt: job $job.0: " > "$SCRATCH/job.log" || true
[ "$(grep -c "resume from step 200 ($dir/000000000200)" "$SCRATCH/job.log")" -eq 4 ] || fail "not every node logged its resume line"
grep "step 300: " "$SCRATCH/job.log" | grep -E "checksum mismatch|skipped, failed" > /dev/null || fail "no skip reason for step 300 logged"
pass "the choice and the skipped checkpoint are logged"

# A dir with nothing complete exports no resume variables.
mkdir -p "$SCRATCH/empty"
srun -N2 -n2 --ckpt-interval=15m --ckpt-dir="$SCRATCH/empty" \
  bash -c 'echo "${CKPT_RESUME_STEP:-none} ${CKPT_RESUME_PATH:-none}"' > "$SCRATCH/fresh"
[ "$(sort -u "$SCRATCH/fresh")" = "none none" ] || fail "a fresh job got resume variables: $(cat "$SCRATCH/fresh")"
pass "nothing to resume, no CKPT_RESUME_*"
finish
