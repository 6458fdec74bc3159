# Shared setup for the checkpoint-store tests that run on real files without the cluster (sourced).
# Sets CKPT, CRASHER and a scratch dir $work (removed on exit), and a failure counter: fail records, the test
# reports the count at its end.
set -euo pipefail

: "${CKPT_BUILD_DIR:?CKPT_BUILD_DIR must name the build dir}"
STORE_TEST=$(basename "$0" .sh)
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"
CKPT="$CKPT_BUILD_DIR/cli/ckpt"
CRASHER="$CKPT_BUILD_DIR/tests/store_crasher"
for bin in "$CKPT" "$CRASHER"; do
  [[ -x "$bin" ]] || { echo "$STORE_TEST: $bin is not built" >&2; exit 1; }
done

work="$(mktemp -d)"
chmod 755 "$work"
# u+rwX first: some tests take permissions away to check the errors.
trap 'chmod -R u+rwX "$work" 2>/dev/null; rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

step_dir() { printf '%s/%012d' "$1" "$2"; }

# The state `ckpt ls --json` reports for a step, or "absent".
state_of() {
  local root="$1" step="$2"
  "$CKPT" ls "$root" --json | "$PY" -c '
import json, sys
step = int(sys.argv[1])
for e in json.load(sys.stdin):
    if e["step"] == step:
        print(e["state"]); break
else:
    print("absent")' "$step"
}
