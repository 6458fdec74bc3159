#!/usr/bin/env bash
# ckpt-controller and ckpt-run as a person meets them: config errors name the key in one line, the rest
# backend refuses to start without a token and never logs it, clients say clearly when nothing answers.
# Needs no Slurm daemon; its clients sign their requests with the test cluster's munged (the ctest fixture).
source "$(dirname "$0")/lib.sh"
CTL=$CKPT_BUILD_DIR/controller/ckpt-controller
CKPT_RUN=$CKPT_BUILD_DIR/ckpt-run/ckpt-run
[ -x "$CTL" ] && [ -x "$CKPT_RUN" ] || { echo "SKIP: controller not built" >&2; exit 77; }
PORT=$(free_port)

one_line() {  # one_line FILE TEXT: the file is exactly that line
  [ "$(wc -l < "$1")" -eq 1 ] || { cat "$1" >&2; fail "expected one line in $1"; }
  assert_contains "$1" "$2"
}

# A typo in a key, a bad value: one line naming the file, line and key; exit 2.
printf 'listen = 127.0.0.1:%s\nsetle = 1s\n' "$PORT" > "$SCRATCH/typo.conf"
expect_fail "$CTL" -c "$SCRATCH/typo.conf" check-config
one_line "$SCRATCH/err" "ckpt-controller: $SCRATCH/typo.conf:2: unknown key 'setle'"
printf 'bad_node_ttl = forever\n' > "$SCRATCH/value.conf"
expect_fail "$CTL" -c "$SCRATCH/value.conf" run
one_line "$SCRATCH/err" "ckpt-controller: $SCRATCH/value.conf:1: bad_node_ttl: invalid value 'forever' (expected a duration like 1h)"
expect_fail "$CTL" -c "$SCRATCH/missing.conf" run
one_line "$SCRATCH/err" "ckpt-controller: $SCRATCH/missing.conf: No such file or directory"
printf 'listen = 127.0.0.1:%s\n' "$PORT" > "$SCRATCH/good.conf"
# (no Slurm here, whether or not a test cluster is up: libslurm is not asked)
SLURM_CONF=$SCRATCH/no-slurm.conf "$CTL" -c "$SCRATCH/good.conf" check-config > "$SCRATCH/out" ||
  fail "a good config was refused"
assert_contains "$SCRATCH/out" "$SCRATCH/good.conf: ok"
assert_contains "$SCRATCH/out" "note: no Slurm config at $SCRATCH/no-slurm.conf (set SLURM_CONF); Slurm's settings were not checked"
pass "config errors name the key and the line"

# The rest backend: no token, no start.
cat > "$SCRATCH/rest.conf" <<CONF
listen = 127.0.0.1:$PORT
database = $SCRATCH/rest.db
backend = rest
rest_url = http://127.0.0.1:9
CONF
env -u SLURM_JWT "$CTL" -c "$SCRATCH/rest.conf" run > "$SCRATCH/out" 2> "$SCRATCH/err" && fail "started without a token"
one_line "$SCRATCH/err" "ckpt-controller: backend = rest needs a token: set rest_token_file or SLURM_JWT (refusing to start without one)"
[ ! -e "$SCRATCH/rest.db" ] || fail "created its database before refusing"
# With a token it starts even when slurmrestd is away, says so, and never prints the token.
TOKEN="eyJ-test-token-$RANDOM$RANDOM"
echo "SLURM_JWT=$TOKEN" > "$SCRATCH/jwt"
chmod 600 "$SCRATCH/jwt"
echo "rest_token_file = $SCRATCH/jwt" >> "$SCRATCH/rest.conf"
"$CTL" -c "$SCRATCH/rest.conf" run > "$SCRATCH/rest.log" 2>&1 &
pid=$!
for _ in $(seq 50); do curl -sf "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$PORT/v1/status" > "$SCRATCH/status" || fail "no status"
assert_contains "$SCRATCH/status" '"backend":"rest"'
assert_contains "$SCRATCH/status" '"can_requeue":false'
"$CTL" --url "http://127.0.0.1:$PORT" status > "$SCRATCH/status.txt" || fail "status client failed"
assert_contains "$SCRATCH/status.txt" "controller: backend rest (cannot requeue: relies on Slurm's own requeue)"
"$CTL" --url "http://127.0.0.1:$PORT" jobs > "$SCRATCH/jobs.txt" || fail "jobs client failed"
assert_contains "$SCRATCH/jobs.txt" "JOB        STATE"
curl -sf "http://127.0.0.1:$PORT/metrics" > "$SCRATCH/metrics" || fail "no metrics"
assert_contains "$SCRATCH/metrics" "# TYPE ckpt_controller_recovery_seconds histogram"
assert_contains "$SCRATCH/metrics" 'ckpt_controller_jobs{state="running"} 0'
# A second controller on the same address: one clear line.
expect_fail "$CTL" -c "$SCRATCH/rest.conf" run
assert_contains "$SCRATCH/err" "ckpt-controller: listen: cannot bind 127.0.0.1:$PORT"
kill -TERM $pid
rc=0; wait $pid || rc=$?
[ $rc -eq 0 ] || fail "SIGTERM: exit $rc"
assert_contains "$SCRATCH/rest.log" "ckpt-controller: stopped"
assert_contains "$SCRATCH/rest.log" "slurmrestd GET /slurm/v0.0.38/nodes"
assert_not_contains "$SCRATCH/rest.log" "$TOKEN"
[ "$(grep -cv '^ckpt-controller: ' "$SCRATCH/rest.log")" -eq 0 ] || { cat "$SCRATCH/rest.log" >&2; fail "a log line lacks the prefix"; }
pass "rest backend: refuses to start without a token, never logs it, stops on SIGTERM"

# Clients and ckpt-run when nothing answers, or when used wrongly.
expect_fail "$CTL" --url "http://127.0.0.1:$PORT" history 5
one_line "$SCRATCH/err" "ckpt-controller: cannot reach the controller at http://127.0.0.1:$PORT"
expect_fail env -u SLURM_JOB_ID "$CKPT_RUN" srun true
assert_contains "$SCRATCH/err" "ckpt-run: not inside a Slurm allocation (SLURM_JOB_ID is not set)"
expect_fail "$CKPT_RUN" --min-nodes x srun true
assert_contains "$SCRATCH/err" "ckpt-run: --min-nodes: invalid value 'x' (expected N >= 1)"
expect_fail env SLURM_JOB_ID=1 "$CKPT_RUN" srun -N
assert_contains "$SCRATCH/err" "ckpt-run: srun option -N needs a value"
pass "clients and ckpt-run fail with one clear line"
finish
