#!/usr/bin/env bash
# The last-words heartbeat mesh admits only ranks of the job. A stranger on the node (another user when this runs
# as root) connects to rank 1's mesh port while rank 1 waits for rank 0, claims rank 0 with a plain hello and
# with a guessed secret, sends the reports that start last words, and keeps a silent connection open. Rank 1
# must hang up on every try, log one line for them, never start its last words, and still form the mesh with the
# real rank 0; both ranks then train every step. No cluster.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/torch_lib.sh"
"$PY" -c 'import slurm_ckpt' || { echo "test_hooks_mesh_auth: needs the built slurm_ckpt module" >&2; exit 1; }
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT

# The stranger: another user where this runs as root (created as tests/cluster.sh does), else this user.
as_stranger=()
if [ "$(id -u)" -eq 0 ] && command -v runuser >/dev/null; then
  id "$TEST_USER" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$TEST_USER"
  as_stranger=(runuser -u "$TEST_USER" --)
fi

root=$SCRATCH/ck
mesh=$root/.control/auth-mesh
hooks=$CKPT_SOURCE_DIR/tests/hooks
"$PY" "$hooks/mesh_rank.py" "$root" 1 20 >"$SCRATCH/rank1.log" 2>&1 &
rank1=$!
for _ in $(seq 200); do [ -s "$mesh/rank-1.addr" ] && break; sleep 0.05; done
[ -s "$mesh/rank-1.addr" ] || fail "rank 1 published no address"
read -r address port _ <"$mesh/rank-1.addr"  # the third field: its node
[ "$address" != 0.0.0.0 ] || fail "rank 1 listens on every address"
[ "$(stat -c %a "$mesh")" = 700 ] || fail "the mesh dir is mode $(stat -c %a "$mesh")"
[ "$(stat -c %a "$mesh/secret")" = 600 ] && [ "$(stat -c %s "$mesh/secret")" = 32 ] \
  || fail "the secret is mode $(stat -c %a "$mesh/secret"), $(stat -c %s "$mesh/secret") bytes"

"${as_stranger[@]}" "$PY" "$hooks/mesh_fake_peer.py" "$address" "$port" "$mesh" >"$SCRATCH/fake.log" 2>&1 &
fake=$!
for _ in $(seq 200); do grep -q '^silent: open' "$SCRATCH/fake.log" && break; sleep 0.05; done
assert_contains "$SCRATCH/fake.log" "plain hello: closed"
assert_contains "$SCRATCH/fake.log" "guessed secret: closed"
assert_contains "$SCRATCH/fake.log" "silent: open"
[ ${#as_stranger[@]} -eq 0 ] || assert_contains "$SCRATCH/fake.log" "secret: Permission denied"

# The real rank 0 joins while the stranger's silent connection is still open.
"$PY" "$hooks/mesh_rank.py" "$root" 0 20 >"$SCRATCH/rank0.log" 2>&1 || { cat "$SCRATCH/rank0.log" >&2; fail "rank 0 failed"; }
wait $rank1 || { cat "$SCRATCH/rank1.log" >&2; fail "rank 1 failed"; }
wait $fake || true
assert_contains "$SCRATCH/rank0.log" "rank 0 trained 20 steps"
assert_contains "$SCRATCH/rank1.log" "rank 1 trained 20 steps"
assert_not_contains "$SCRATCH/rank1.log" "last words:"
assert_not_contains "$SCRATCH/rank0.log" "last words:"
refused=$(grep -c "heartbeat: refused a connection from $address:" "$SCRATCH/rank1.log" || true)
[ "$refused" = 1 ] || { cat "$SCRATCH/rank1.log" >&2; fail "expected one refusal line for the stranger, got $refused"; }
pass "a stranger cannot join the mesh, claim a rank or start last words; the job's ranks still join"
rm -rf "$SCRATCH"
