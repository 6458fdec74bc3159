"""One rank of a two-rank last-words job (dp=2), through the native module: joins the heartbeat mesh, runs
`steps` updates of 50 ms, prints how far it got and leaves in order. A rank whose last words were triggered can
start no update, so "trained <steps> steps" means nothing reached them. Used by test_hooks_mesh_auth.sh."""
import ctypes
import sys
import time

import slurm_ckpt

root, rank, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
cp = slurm_ckpt.Checkpointer(dir=root, rank=rank, world_size=2, layout="dp=2", last_words=True, run_id="auth",
                             interval="1000steps", signals=False, copy_threads=0)
state = (ctypes.c_double * 64)()
cp.register_host("model", ctypes.addressof(state), ctypes.sizeof(state))
cp.restore()
print(f"rank {rank} joined", flush=True)
done = 0
try:
    for step in range(steps):
        cp.before_update()
        state[0] = step + 1
        time.sleep(0.05)
        cp.after_step(step + 1)
        done = step + 1
except slurm_ckpt.Error as e:
    print(f"rank {rank} stopped after {done} steps: {e}", flush=True)
    cp.abort()
    sys.exit(1)
print(f"rank {rank} trained {done} steps", flush=True)
cp.close()
