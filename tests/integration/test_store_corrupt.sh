#!/usr/bin/env bash
# Corrupt input on real files. For each corruption of the newest of three checkpoints (100, 200, 300): it is
# detected (ls, verify naming the shard), a restart walks back to 200, nothing is written through a symlink,
# and gc deletes only what it should (never the corrupt one, never the newest verified one).
source "$(dirname "$0")/store_lib.sh"

# Every path under a tree with its type, size and content hash: to prove that nothing changed.
snapshot() {
  (cd "$1" && find . -mindepth 1 -printf '%p %y %s\n' | sort
   find . -type f -perm -u=r -exec md5sum {} + 2>/dev/null | sort)
}

flip_bit() {
  local file="$1" offset="$2" byte
  byte="$(od -An -tu1 -j "$offset" -N 1 "$file" | tr -d ' ')"
  printf "$(printf '\\%03o' $((byte ^ 16)))" | dd of="$file" bs=1 seek="$offset" conv=notrunc status=none
}

template="$work/template"
for step in 100 200 300; do "$CRASHER" save "$template" "$step" --bytes 65536 >/dev/null; done
outside="$work/outside"
mkdir -p "$outside"
echo precious >"$outside/precious"

# corrupt_<name> ROOT: applies one corruption to step 300 (or plants something next to it).
corrupt_truncated() { truncate -s 1000 "$(step_dir "$1" 300)/rank-00001.shard"; }
corrupt_flipped_bit() { flip_bit "$(step_dir "$1" 300)/rank-00002.shard" 40000; }
corrupt_missing_shard() { rm "$(step_dir "$1" 300)/rank-00003.shard"; }
corrupt_garbage_manifest() { printf 'garbage{{{\001\002' >"$(step_dir "$1" 300)/MANIFEST.json"; }
corrupt_dotdot_manifest() {
  sed -i 's#"file": "rank-00000.shard"#"file": "../000000000200/rank-00000.shard"#' \
    "$(step_dir "$1" 300)/MANIFEST.json"
}
corrupt_absolute_manifest() {
  sed -i 's#"file": "rank-00000.shard"#"file": "/etc/passwd"#' "$(step_dir "$1" 300)/MANIFEST.json"
}
corrupt_symlinked_shard() {
  # The link points at an identical copy, so following it would even pass the checksum.
  local d
  d="$(step_dir "$1" 300)"
  cp "$d/rank-00000.shard" "$outside/copy.shard"
  rm "$d/rank-00000.shard"
  ln -s "$outside/copy.shard" "$d/rank-00000.shard"
}
corrupt_symlinked_manifest() {
  local d
  d="$(step_dir "$1" 300)"
  cp "$d/MANIFEST.json" "$outside/MANIFEST.json"
  rm "$d/MANIFEST.json"
  ln -s "$outside/MANIFEST.json" "$d/MANIFEST.json"
}
corrupt_planted_symlink() { ln -s "$outside" "$(step_dir "$1" 300)/planted"; }

# name | state ls reports for 300 | text verify must print | marked FAILED by a restart?
cases=(
  "truncated|corrupt|shard rank-00001.shard (rank 1): 1000 bytes, manifest says 65536|no"
  "flipped_bit|complete|shard rank-00002.shard (rank 2): checksum mismatch|yes"
  "missing_shard|corrupt|shard rank-00003.shard (rank 3): missing|no"
  "garbage_manifest|corrupt|manifest: not valid JSON|no"
  "dotdot_manifest|corrupt|unsafe name '../000000000200/rank-00000.shard'|no"
  "absolute_manifest|corrupt|unsafe name '/etc/passwd'|no"
  "symlinked_shard|corrupt|symlink planted: rank-00000.shard|no"
  "symlinked_manifest|corrupt|symlink planted: MANIFEST.json|no"
  "planted_symlink|corrupt|symlink planted: planted|no"
)

for c in "${cases[@]}"; do
  IFS='|' read -r name state text marked <<<"$c"
  root="$work/$name"
  cp -a "$template" "$root"
  "corrupt_$name" "$root"
  outside_before="$(snapshot "$outside")"
  before="$(snapshot "$root")"

  got="$(state_of "$root" 300)"
  [[ "$got" == "$state" ]] || fail "$name: ckpt ls says $got, expected $state"
  rc=0
  err="$("$CKPT" verify "$root" --step 300 2>&1 >/dev/null)" || rc=$?
  [[ $rc -eq 1 ]] || fail "$name: ckpt verify --step 300 exited $rc, expected 1"
  [[ "$err" == "ckpt: step 300: "*"$text"* ]] || fail "$name: ckpt verify said '$err'"
  [[ "$(wc -l <<<"$err")" -eq 1 ]] || fail "$name: ckpt verify printed more than one line"
  [[ "$("$CKPT" latest "$root" 2>/dev/null)" == "$(step_dir "$root" 200)" ]] || fail "$name: ckpt latest is not 200"
  [[ "$(snapshot "$root")" == "$before" ]] || fail "$name: read-only commands changed the checkpoint dir"

  resolved="$("$CRASHER" resolve "$root" 2>/dev/null)" || true
  [[ "$resolved" == 200 ]] || fail "$name: a restart resolved '$resolved', expected 200"
  if [[ "$marked" == yes ]]; then
    [[ -f "$(step_dir "$root" 300)/FAILED" ]] || fail "$name: step 300 was not marked FAILED"
    [[ "$(state_of "$root" 300)" == failed ]] || fail "$name: ckpt ls does not say failed"
  else
    [[ ! -e "$(step_dir "$root" 300)/FAILED" ]] || fail "$name: step 300 was marked although scan already excludes it"
  fi

  out="$("$CKPT" gc "$root" --keep 1)" || fail "$name: gc failed"
  [[ "$out" == "deleted $(step_dir "$root" 100)" ]] || fail "$name: gc printed '$out'"
  [[ -d "$(step_dir "$root" 300)" ]] || fail "$name: gc deleted the corrupt checkpoint"
  "$CKPT" verify "$root" --step 200 >/dev/null || fail "$name: step 200 does not verify after gc"

  # The store keeps working: the next save commits and becomes the one to resume from.
  "$CRASHER" save "$root" 400 --bytes 65536 >/dev/null || fail "$name: saving step 400 failed"
  [[ "$("$CKPT" latest "$root" 2>/dev/null)" == "$(step_dir "$root" 400)" ]] || fail "$name: step 400 is not latest"
  [[ "$(snapshot "$outside")" == "$outside_before" ]] || fail "$name: something outside the checkpoint dir changed"
  echo "ok: $name"
done

# A step dir that is a symlink to another checkpoint: seen, not followed, not written through, not deleted.
root="$work/symlinked_step"
cp -a "$template" "$root"
ln -s "$(step_dir "$root" 200)" "$(step_dir "$root" 400)"
before_200="$(snapshot "$(step_dir "$root" 200)")"
[[ "$(state_of "$root" 400)" == corrupt ]] || fail "symlinked step dir: ckpt ls does not say corrupt"
err="$("$CKPT" verify "$root" --step 400 2>&1 >/dev/null)" && fail "symlinked step dir: verify passed"
[[ "$err" == "ckpt: step dir 000000000400 is a symlink or not a directory" ]] || fail "symlinked step dir: '$err'"
[[ "$("$CKPT" latest "$root" 2>/dev/null)" == "$(step_dir "$root" 300)" ]] || fail "symlinked step dir: latest not 300"
[[ "$("$CRASHER" resolve "$root" 2>/dev/null)" == 300 ]] || fail "symlinked step dir: resolve not 300"
if "$CRASHER" save "$root" 400 --bytes 65536 >/dev/null 2>&1; then
  fail "symlinked step dir: a save wrote through it"
fi
"$CKPT" gc "$root" --keep 2 >/dev/null || fail "symlinked step dir: gc failed"
[[ -L "$(step_dir "$root" 400)" ]] || fail "symlinked step dir: the link was deleted"
[[ "$(snapshot "$(step_dir "$root" 200)")" == "$before_200" ]] || fail "symlinked step dir: step 200 changed"
echo "ok: symlinked_step"

# A symlinked step dir pointing out of the checkpoint dir: a save must not create anything there.
root="$work/escape"
cp -a "$template" "$root"
ln -s "$outside" "$(step_dir "$root" 500)"
outside_before="$(snapshot "$outside")"
if "$CRASHER" save "$root" 500 --bytes 65536 >/dev/null 2>&1; then fail "escape: a save wrote through a symlink"; fi
[[ "$(snapshot "$outside")" == "$outside_before" ]] || fail "escape: files appeared outside the checkpoint dir"
echo "ok: escape"

if [[ $failures -ne 0 ]]; then
  echo "test_store_corrupt: $failures failures" >&2
  exit 1
fi
echo "test_store_corrupt: all passed"
