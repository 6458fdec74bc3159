"""One rank of a two-rank last-words job (dp=2) whose teardown hangs once training stopped, as a program does
that calls dist.barrier() or destroy_process_group() after losing a peer: trains 50 ms steps until after_step
says stop or an update is refused, then sleeps for `hang` seconds. Used by test_hooks_exit_grace.sh."""
import ctypes
import sys
import time

import slurm_ckpt

root, rank, steps, grace, hang = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
cp = slurm_ckpt.Checkpointer(dir=root, rank=rank, world_size=2, layout="dp=2", last_words=True, run_id="grace",
                             interval="1000steps", signals=False, copy_threads=0, exit_grace=grace)
state = (ctypes.c_double * 64)()
cp.register_host("model", ctypes.addressof(state), ctypes.sizeof(state))
cp.restore()
print(f"rank {rank} joined", flush=True)
try:
    for step in range(steps):
        time.sleep(0.05)  # forward and backward: outside the update
        cp.before_update()
        state[0] = step + 1
        if cp.after_step(step + 1):
            break
        print(f"rank {rank} step {step + 1}", flush=True)
except slurm_ckpt.Error as e:
    print(f"rank {rank} stopped: {e}", flush=True)
print(f"rank {rank} tearing down", flush=True)
time.sleep(hang)  # the teardown that waits on the lost peer
print(f"rank {rank} teardown returned", flush=True)
