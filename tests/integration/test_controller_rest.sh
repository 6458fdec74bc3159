#!/usr/bin/env bash
# The same scenario suite as test_controller_libslurm.sh, with the controller driving Slurm through slurmrestd
# (openapi/v0.0.38, JWT) as it would from off the cluster. v0.0.38 has no requeue and no node update: node
# failures are requeued by Slurm itself and expedited by the controller; other endings cannot be requeued.
source "$(dirname "$0")/lib.sh"
BACKEND=rest
source "$CKPT_SOURCE_DIR/tests/integration/controller_harness.sh"
source "$CKPT_SOURCE_DIR/tests/integration/controller_scenarios.sh"
command -v slurmrestd >/dev/null || { echo "SKIP: slurmrestd is not installed" >&2; exit 77; }

use_controller_in_plugstack
start_webhook
start_restd
write_config "webhook_url = http://127.0.0.1:$HOOK_PORT/alerts"
start_controller
# The token is in the config's file and never in the log.
grep -qF "$(sed 's/^SLURM_JWT=//' "$SCRATCH/jwt")" "$SCRATCH/controller.log" && fail "the controller logged its token"
scenario_no_false_restarts
scenario_needs_checkpoint
scenario_relaunch
scenario_crash_loop
scenario_node_crash_requeue
scenario_forgotten_node_releases
grep -qF "$(sed 's/^SLURM_JWT=//' "$SCRATCH/jwt")" "$SCRATCH/controller.log" && fail "the controller logged its token"
cat "$SCRATCH/timings"
finish
