# The status page in a real browser (sourced after lib.sh): headless Chromium loads a page, the DOM it built and
# a screenshot are kept, and any console line (an exception, a refused script or style, a failed load) fails.
ARTIFACTS=$CKPT_BUILD_DIR/artifacts

# offline_controller_up: a ckpt-controller on a free port with its config, database and log in $SCRATCH and no
# Slurm behind it (the rest backend aimed at a closed port), answering /healthz; sets CTL_PID and CONTROLLER_URL.
offline_controller_up() {
  local port; port=$(free_port)
  CONTROLLER_URL=http://127.0.0.1:$port
  cat > "$SCRATCH/controller.conf" <<CONF
listen = 127.0.0.1:$port
database = $SCRATCH/controller.db
backend = rest
rest_url = http://127.0.0.1:9
munge_socket = $SCRATCH/no-munged.socket
CONF
  SLURM_JWT=not-a-real-token setsid "$CKPT_BUILD_DIR/controller/ckpt-controller" run -c "$SCRATCH/controller.conf" \
    > "$SCRATCH/controller.log" 2>&1 &
  CTL_PID=$!
  for _ in $(seq 100); do curl -sf "$CONTROLLER_URL/healthz" > /dev/null && return 0; sleep 0.1; done
  cat "$SCRATCH/controller.log" >&2
  fail "the controller did not start"
}

# page_render URL NAME: leaves the DOM in $SCRATCH/NAME.dom and the screenshot in $ARTIFACTS/NAME.png.
page_render() {
  local url=$1 name=$2 log=$SCRATCH/$2.chromium.log
  command -v chromium > /dev/null || fail "chromium is not installed (scripts/install-deps.sh installs it)"
  mkdir -p "$ARTIFACTS"
  local flags=(--headless --no-sandbox --disable-gpu --user-data-dir="$SCRATCH/chromium-profile"
               --enable-logging=stderr --v=0 --window-size=1280,1500)
  timeout 120 chromium "${flags[@]}" --dump-dom "$url" > "$SCRATCH/$name.dom" 2> "$log" \
    || { tail -5 "$log" >&2; fail "chromium could not load $url"; }
  timeout 120 chromium "${flags[@]}" --screenshot="$ARTIFACTS/$name.png" "$url" >> "$log" 2>&1 \
    || { tail -5 "$log" >&2; fail "chromium could not take a screenshot of $url"; }
  if grep 'CONSOLE' "$log" > "$SCRATCH/$name.console"; then
    cat "$SCRATCH/$name.console" >&2
    fail "the page $url wrote to the browser console (above)"
  fi
  grep -q 'data-rendered="ok"' "$SCRATCH/$name.dom" || fail "the page's script did not finish on $url"
  [ -s "$ARTIFACTS/$name.png" ] || fail "no screenshot of $url"
  echo "rendered $url: $(wc -c < "$SCRATCH/$name.dom") bytes of DOM, no console output;" \
       "screenshot $ARTIFACTS/$name.png ($(wc -c < "$ARTIFACTS/$name.png") bytes)"
}

# dom_has NAME TEXT / dom_lacks NAME TEXT: the DOM Chromium built holds TEXT literally (or not).
dom_has() { grep -qF -- "$2" "$SCRATCH/$1.dom" || fail "the rendered page $1 lacks '$2' (DOM in $SCRATCH/$1.dom)"; }
dom_lacks() { ! grep -qF -- "$2" "$SCRATCH/$1.dom" || fail "the rendered page $1 shows '$2' (DOM in $SCRATCH/$1.dom)"; }

# check_status_page JOB CONFIG: after a crash-and-recover run of root's JOB under the controller at
# $CONTROLLER_URL whose config is CONFIG: the anonymous page in the browser names no job; the page saved with
# root's MUNGE credential shows JOB, its recovery and its phases; the page $TEST_USER saves does not show JOB;
# every metric the dashboard and the alerts use is in /metrics.
check_status_page() {
  local job=$1 ctl=("$CKPT_BUILD_DIR/controller/ckpt-controller" -c "$2")
  page_render "$CONTROLLER_URL/status" status-page-anonymous
  dom_has status-page-anonymous 'id="anonymous"'
  dom_lacks status-page-anonymous "data-job=\"$job\""
  echo "anonymous browser: counts only, job $job not shown"

  "${ctl[@]}" page -o "$SCRATCH/status.html" > /dev/null || fail "ckpt-controller page failed"
  [ "$(stat -c %a "$SCRATCH/status.html")" = 600 ] || fail "the saved page is not mode 0600"
  page_render "file://$SCRATCH/status.html" status-page
  dom_has status-page "id=\"job-$job\""
  dom_has status-page 'class="failure"'
  dom_has status-page 'class="checkpoint"'
  dom_has status-page 'class="phase phase-slurm"'
  grep -o '<li class="recovery"[^<]*' "$SCRATCH/status-page.dom" > "$SCRATCH/recoveries" \
    || fail "the page shows no recovery of job $job"
  assert_contains "$SCRATCH/recoveries" "(requeue): running again as run 1 after"
  sed 's/<li class="recovery" data-seconds="[0-9.]*">/  page: /' "$SCRATCH/recoveries"
  echo "status page of job $job: $ARTIFACTS/status-page.png"

  # Another user's saved page: their own view, without this job (the page follows the read endpoints' rules).
  local other
  other=$(mktemp -d /tmp/status-page-other.XXXXXX)
  chown "$TEST_USER" "$other"
  runuser -u "$TEST_USER" -- "${ctl[@]}" page -o "$other/status.html" > /dev/null \
    || fail "ckpt-controller page as $TEST_USER failed"
  grep -qF "\"viewer\":{\"all\":false,\"uid\":$(id -u "$TEST_USER")}" "$other/status.html" \
    || fail "the page saved by $TEST_USER is not made for $TEST_USER"
  ! grep -qE "\"job_id\":$job[,}]" "$other/status.html" || fail "$TEST_USER's page shows job $job of another user"
  rm -rf "$other"
  echo "page saved by $TEST_USER (uid $(id -u "$TEST_USER")): job $job not shown"

  curl -sf "$CONTROLLER_URL/metrics" > "$SCRATCH/metrics" || fail "no /metrics"
  "$PY" "$CKPT_SOURCE_DIR/tests/ops/check_dashboards.py" --metrics "$SCRATCH/metrics" \
    --dashboard "$CKPT_SOURCE_DIR/packaging/host/grafana-dashboard.json" \
    --rules "$CKPT_SOURCE_DIR/packaging/host/prometheus-alerts.yml" \
    --require-samples ckpt_controller_restarts_total,ckpt_controller_recovery_seconds_count \
    || fail "the dashboard or the alerts use what /metrics lacks after a recovery (above)"
}
