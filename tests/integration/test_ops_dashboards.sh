#!/usr/bin/env bash
# The Grafana dashboard and the Prometheus alerting rules of packaging/host/ against a real controller:
#   - promtool checks the rules and replays tests/ops/prometheus-alerts.test.yml through them;
#   - the dashboard passes a check of what Grafana needs to import it, and every metric name and label the
#     dashboard and the rules use is in the /metrics of a ckpt-controller started here (no Slurm needed);
#   - the checker itself fails on a dashboard with a misspelled metric and a misspelled label.
# demo_recovery runs the same check after a real recovery, when every labelled series has samples.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/status_page_lib.sh"
CTL=$CKPT_BUILD_DIR/controller/ckpt-controller
SRC=$CKPT_SOURCE_DIR
[ -x "$CTL" ] || fail "ckpt-controller is not built"
command -v promtool > /dev/null || fail "promtool is not installed (Debian's prometheus; scripts/install-deps.sh)"
CHECK=("$PY" "$SRC/tests/ops/check_dashboards.py" --dashboard "$SRC/packaging/host/grafana-dashboard.json"
       --rules "$SRC/packaging/host/prometheus-alerts.yml")

promtool check rules "$SRC/packaging/host/prometheus-alerts.yml" > "$SCRATCH/check.out" 2>&1 \
  || { cat "$SCRATCH/check.out" >&2; fail "promtool check rules failed"; }
grep -E 'SUCCESS' "$SCRATCH/check.out"
(cd "$SRC/tests/ops" && promtool test rules prometheus-alerts.test.yml) > "$SCRATCH/test.out" 2>&1 \
  || { cat "$SCRATCH/test.out" >&2; fail "promtool test rules failed"; }
echo "promtool test rules: $(grep -c 'eval_time' "$SRC/tests/ops/prometheus-alerts.test.yml") evaluations passed"

CTL_PID=""
trap '[ -n "$CTL_PID" ] && kill "$CTL_PID" 2>/dev/null || true' EXIT
offline_controller_up
for _ in $(seq 100); do curl -sf "$CONTROLLER_URL/metrics" > "$SCRATCH/metrics" && break; sleep 0.1; done
[ -s "$SCRATCH/metrics" ] || { cat "$SCRATCH/controller.log" >&2; fail "no /metrics from the controller"; }
"${CHECK[@]}" --metrics "$SCRATCH/metrics" || fail "the dashboard or the rules do not match /metrics (above)"

# The checker must catch a misspelled metric and a misspelled label.
sed -e 's/ckpt_controller_lost_work_seconds_total/ckpt_controller_lost_work_total/' \
    -e 's/sum by (ending) (increase(ckpt_controller_restarts_total/sum by (endng) (increase(ckpt_controller_restarts_total/' \
    "$SRC/packaging/host/grafana-dashboard.json" > "$SCRATCH/broken.json"
if "$PY" "$SRC/tests/ops/check_dashboards.py" --metrics "$SCRATCH/metrics" --dashboard "$SCRATCH/broken.json" \
     --rules "$SRC/packaging/host/prometheus-alerts.yml" > "$SCRATCH/broken.out"; then
  fail "the checker passed a dashboard with a misspelled metric and label"
fi
assert_contains "$SCRATCH/broken.out" "metric ckpt_controller_lost_work_total is not in /metrics"
assert_contains "$SCRATCH/broken.out" "label 'endng' is on no sample"
echo "the checker refuses a misspelled metric and label: $(grep -c PROBLEM "$SCRATCH/broken.out") problems found"
finish
