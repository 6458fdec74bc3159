#!/usr/bin/env bash
# At job start the plugin picks the newest checkpoint whose manifest lists a complete set of shards, on every node,
# without reading shard bytes: with a complete step 200, a step 300 with one corrupt shard and an incomplete step
# 400, every rank is given 300 and nothing is marked or deleted. The ranks that restore find the corrupt shard (the
# rank that loads it), agree, and all resume from 200; 300 is marked FAILED once; each rank reads its own shard only.
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
  [ "$step" = 300 ] || fail "a rank on $node got CKPT_RESUME_STEP=$step"
  [ "$path" = "$dir/000000000300" ] || fail "a rank on $node got CKPT_RESUME_PATH=$path"
done < "$SCRATCH/resume"
pass "every rank on every node is given step 300: the plugin reads manifests, not shards"

[ ! -e "$dir/000000000300/FAILED" ] || fail "the plugin marked step 300 FAILED without reading its shards"
[ -d "$dir/000000000400" ] || fail "the incomplete checkpoint was deleted"
job=$(awk '{print $4}' "$SCRATCH/resume" | sort -u)
cat "$CKPT_CLUSTER_DIR"/log/slurmd-n*.log | grep -F "ckpt: job $job.0: " > "$SCRATCH/job.log" || true
[ "$(grep -c "resume from step 300 ($dir/000000000300)" "$SCRATCH/job.log")" -eq 4 ] || fail "not every node logged its resume line"
grep "step 400: skipped, incomplete" "$SCRATCH/job.log" > /dev/null || fail "no skip reason for step 400 logged"
pass "the choice and the skipped checkpoint are logged"

# Four ranks restore: rank 1 finds its shard corrupt, and every rank walks back to 200 with it.
PROBE=$CKPT_BUILD_DIR/tests/restore_probe
srun -N4 -n4 --ckpt-interval=15m --ckpt-dir="$dir" "$PROBE" > "$SCRATCH/restored" 2> "$SCRATCH/restored.err" ||
  { cat "$SCRATCH/restored.err" >&2; fail "restore_probe failed"; }
[ "$(wc -l < "$SCRATCH/restored")" -eq 4 ] || fail "expected 4 ranks to restore"
while read -r rank step read loaded; do
  [ "$step" = 200 ] || fail "rank $rank restored step $step"
  [ "$loaded" = 65536 ] || fail "rank $rank loaded $loaded bytes"
  # Its shard of 300, then its shard of 200, and small files (its records, rank 0 the manifests).
  [ "$read" -lt $((2 * 65536 + 32768)) ] || fail "rank $rank read $read bytes to load two 65536-byte shards"
done < "$SCRATCH/restored"
pass "every rank restores step 200, reading its own shard of each candidate only"
[ -e "$dir/000000000300/FAILED" ] || fail "corrupt step 300 was not marked FAILED"
grep -q "rank 1: step 300: shard rank-00001.shard (rank 1): checksum mismatch" "$dir/000000000300/FAILED" ||
  fail "the FAILED marker does not name rank 1's shard: $(cat "$dir/000000000300/FAILED")"
[ -e "$dir/000000000300/rank-00001.shard" ] || fail "the corrupt checkpoint was deleted"
pass "step 300 is marked FAILED by the agreement, naming the shard; nothing is deleted"

# A dir with nothing complete exports no resume variables.
mkdir -p "$SCRATCH/empty"
srun -N2 -n2 --ckpt-interval=15m --ckpt-dir="$SCRATCH/empty" \
  bash -c 'echo "${CKPT_RESUME_STEP:-none} ${CKPT_RESUME_PATH:-none}"' > "$SCRATCH/fresh"
[ "$(sort -u "$SCRATCH/fresh")" = "none none" ] || fail "a fresh job got resume variables: $(cat "$SCRATCH/fresh")"
pass "nothing to resume, no CKPT_RESUME_*"
finish
