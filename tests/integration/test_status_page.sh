#!/usr/bin/env bash
# The controller's status page in headless Chromium, without Slurm (the crash-and-recover run of demo_recovery
# checks it on a real job):
#   - the page a browser gets (no MUNGE credential) loads with no console output, says it shows counts only,
#     is never cached or framed, and a job's page answers 401;
#   - the same page with a job's history in the engine's line formats (two requeues, then a clean exit) and
#     hostile text in it draws the timeline (a clean exit is no failure and loses no work), lists both
#     recoveries with their phases, and shows the hostile text as text: no element of it reaches the DOM, no
#     script of it runs.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/status_page_lib.sh"
CTL=$CKPT_BUILD_DIR/controller/ckpt-controller
[ -x "$CTL" ] || fail "ckpt-controller is not built"
CTL_PID=""
trap '[ -n "$CTL_PID" ] && kill "$CTL_PID" 2>/dev/null || true' EXIT
offline_controller_up

# What a browser gets.
curl -s -D "$SCRATCH/headers" -o "$SCRATCH/anonymous.html" "$CONTROLLER_URL/status"
for h in 'HTTP/1.1 200' 'Content-Type: text/html' 'Cache-Control: no-store' 'X-Frame-Options: DENY' 'X-Content-Type-Options: nosniff'; do
  assert_contains "$SCRATCH/headers" "$h"
done
assert_contains "$SCRATCH/anonymous.html" "Content-Security-Policy"
code=$(curl -s -o /dev/null -w '%{http_code}' "$CONTROLLER_URL/status/4242")
[ "$code" = 401 ] || fail "GET /status/4242 without a credential answered $code, expected 401"
code=$(curl -s -o /dev/null -w '%{http_code}' "$CONTROLLER_URL/status/x")
[ "$code" = 400 ] || fail "GET /status/x answered $code, expected 400"
page_render "$CONTROLLER_URL/status" status-page-anonymous
dom_has status-page-anonymous 'id="anonymous"'
dom_has status-page-anonymous 'id="no-jobs"'
echo "anonymous page: 200 with no-store/DENY/nosniff and a CSP; /status/4242 401; /status/x 400"

# The same page with a job in it: the history in the formats of controller/engine.cpp's note() calls.
"$PY" - "$SCRATCH/anonymous.html" "$SCRATCH/sample.html" <<'PY' || fail "could not make the sample page"
import json, re, sys
t0 = 1796023561.0
hostile = '</script><img src=x onerror="document.title=1"><b id="injected">bold</b> & "quotes"'
raw = [
    (0.00, 0, "transition", "tracking job 4242"),
    (0.05, 0, "event", "job_start from n1 (batch step)"),
    (0.13, 0, "event", "job_start from n2 (step 0)"),
    (25.50, 0, "event", "task_exit from n3 (step 0): rank 2 killed by signal 9"),
    (25.50, 0, "transition", "running -> failing: failure reported"),
    (25.56, 0, "decision", "reports from n1,n2; probed n3: n3 refused; dead n3 (refused twice: n3)"),
    (25.60, 0, "decision", "node failure; newest complete checkpoint: step 30; lost work 4.250 s"),
    (25.60, 0, "decision", "excluding n3 from the job's next runs"),
    (25.61, 0, "transition", "failing -> requeueing: node failure: restart 1 (0 of 3 without progress; resumes from step 30)"),
    (25.62, 0, "action", "requeued job 4242 (libslurm)"),
    (35.20, 0, "transition", "requeueing -> pending: requeued; waiting for Slurm to start run 1"),
    (36.00, 0, "event", "Slurm runs the job again (restart count 1)"),
    (36.00, 1, "transition", "pending -> running: run 1 started"),
    (36.06, 1, "recovery", "running again after 10.560 s (requeue): decision 0.100 s, slurm 10.400 s, launch 0.060 s"),
    (50.00, 1, "event", "task_exit from n2 (step 0): rank 1 exited 1 " + hostile),
    (50.00, 1, "transition", "running -> failing: failure reported"),
    (53.00, 1, "decision", "task crash; newest complete checkpoint: step 70; lost work 2.000 s"),
    (53.01, 1, "transition", "failing -> requeueing: task crash: restart 2 (0 of 3 without progress; resumes from step 70)"),
    (60.00, 2, "transition", "pending -> running: run 2 started"),
    (60.10, 2, "recovery", "running again after 10.100 s (requeue): decision 3.000 s, slurm 7.000 s, launch 0.100 s"),
    (88.00, 2, "transition", "running -> failing: failure reported"),
    (88.40, 2, "decision", "clean exit; newest complete checkpoint: step 100; lost work 3.000 s"),
    (88.40, 2, "transition", "failing -> completed: ended cleanly"),
]
lines = [{"time": t0 + dt, "restart_count": r, "kind": k, "text": x} for dt, r, k, x in raw]
job = {"job_id": 4242, "state": "completed", "restart_count": 2, "restarts": 2, "restarts_without_progress": 0,
       "max_restarts": 3, "progress_step": 70, "excluded_nodes": ["n3"], "ending": "clean exit",
       "slow_nodes": [{"node": "n2", "score": 0.48, "time": t0 + 40, "action": "exclude"}],
       "reason": "ended cleanly " + hostile, "updated": t0 + 90}
data = {"generated": t0 + 95, "viewer": {"uid": 0, "all": True},
        "status": {"backend": "libslurm", "uptime_s": 95, "jobs": {"completed": 1}, "gave_up": [],
                   "excluded_nodes": [{"node": "n3", "reason": hostile, "expires": t0 + 3600, "jobs": [4242]}]},
        "jobs": [job], "jobs_total": 1, "histories": {"4242": lines}}
# Escaped as the controller escapes it (status_page.cpp: script_safe).
blob = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
page = open(sys.argv[1]).read()
page, n = re.subn(r'(<script type="application/json" id="ckpt-data">).*?(</script>)',
                  lambda m: m.group(1) + blob + m.group(2), page, flags=re.S)
assert n == 1, "no data element in the page"
open(sys.argv[2], "w").write(page)
PY
page_render "file://$SCRATCH/sample.html" status-page-sample
dom_has status-page-sample 'id="job-4242"'
dom_has status-page-sample 'recovery 1 (requeue): running again as run 1 after 10.6 s = decision 0.10 s + slurm 10.4 s + launch 0.06 s'
dom_has status-page-sample 'recovery 2 (requeue): running again as run 2 after 10.1 s = decision 3.00 s + slurm 7.00 s + launch 0.10 s'
dom_has status-page-sample 'class="phase phase-slurm"'
dom_has status-page-sample 'step 30'
dom_has status-page-sample 'n2 0.48 (exclude)'
dom_has status-page-sample '<table class="slow-nodes">'
dom_has status-page-sample 'step 70'
dom_has status-page-sample 'step 100'
dom_has status-page-sample '&lt;/script&gt;&lt;img src=x onerror='
dom_lacks status-page-sample '<img'
dom_lacks status-page-sample '<b id="injected"'
recoveries=$(grep -o '<li class="recovery"' "$SCRATCH/status-page-sample.dom" | wc -l)
failures=$(grep -o 'class="failure"' "$SCRATCH/status-page-sample.dom" | wc -l)
checkpoints=$(grep -o 'class="checkpoint"' "$SCRATCH/status-page-sample.dom" | wc -l)
runs=$(grep -o 'data-state="running"' "$SCRATCH/status-page-sample.dom" | wc -l)
echo "sample job: $runs running spans, $failures failures, $checkpoints checkpoints, $recoveries recoveries drawn"
lost=$(grep -o 'class="lost-work"' "$SCRATCH/status-page-sample.dom" | wc -l)
echo "sample job: $lost lost-work spans (the clean exit at the end loses nothing and is no failure)"
[ "$recoveries" = 2 ] && [ "$failures" = 2 ] && [ "$checkpoints" = 3 ] && [ "$runs" = 3 ] && [ "$lost" = 2 ] \
  || fail "expected 3 running spans, 2 failures, 3 checkpoints, 2 lost-work spans and 2 recoveries"
echo "hostile text shown as text: no <img>, no injected element"
finish
