#!/usr/bin/env bash
# The recovery controller with its libslurm backend, on the real 4-node cluster: node crash (requeue and
# in-allocation relaunch, timed), a job's own exclusions kept by the requeue, a pending job released when an admin
# forgets its excluded node, a requeue that
# may do without its spare, crash loop, no false restarts, forged
# events, checkpoint requirement, and events through a spool dir as well as over HTTP.
source "$(dirname "$0")/lib.sh"
BACKEND=libslurm
source "$CKPT_SOURCE_DIR/tests/integration/controller_harness.sh"
source "$CKPT_SOURCE_DIR/tests/integration/controller_scenarios.sh"

start_webhook
write_config "webhook_url = http://127.0.0.1:$HOOK_PORT/alerts" "spool_dir = $SCRATCH/spool"
start_controller
use_controller_in_plugstack "$SCRATCH/spool"
scenario_spool_transport "$SCRATCH/spool"
use_controller_in_plugstack
scenario_no_false_restarts
scenario_needs_checkpoint
scenario_node_crash_requeue
scenario_forgotten_node_releases
scenario_own_exclusions_kept
scenario_spares_requeue
scenario_relaunch
scenario_relaunch_handover
scenario_crash_loop
cat "$SCRATCH/timings"
finish
