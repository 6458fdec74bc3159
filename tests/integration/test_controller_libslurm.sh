#!/usr/bin/env bash
# The recovery controller with its libslurm backend, on the real 4-node cluster: node crash (requeue and
# in-allocation relaunch, timed), crash loop, no false restarts, forged events, checkpoint requirement.
source "$(dirname "$0")/lib.sh"
BACKEND=libslurm
source "$CKPT_SOURCE_DIR/controller/testing/harness.sh"
source "$CKPT_SOURCE_DIR/controller/testing/scenarios.sh"

use_controller_in_plugstack
start_webhook
write_config "webhook_url = http://127.0.0.1:$HOOK_PORT/alerts"
start_controller
scenario_no_false_restarts
scenario_needs_checkpoint
scenario_node_crash_requeue
scenario_relaunch
scenario_crash_loop
cat "$SCRATCH/timings"
finish
