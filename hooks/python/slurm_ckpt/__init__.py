"""slurm_ckpt: asynchronous, Slurm-aware checkpoints for training loops (the Python side of libckpt).

With PyTorch::

    import slurm_ckpt.torch
    cp = slurm_ckpt.torch.Checkpointer(model, optimizer, extra=None, dir=None, interval=None)
    start = cp.restore()                  # the step to resume from, 0 when there is no checkpoint
    for step in range(start, total_steps):
        loss = compute_loss(model, batch(step))
        loss.backward()
        cp.before_update()                # the guard: the last snapshot has copied the state
        optimizer.step()
        optimizer.zero_grad()
        if cp.after_step(step + 1):       # True: a terminal checkpoint was taken (time limit, SIGTERM, ...)
            break
    cp.close()                            # waits for the last write and commit

Settings come from the CKPT_* environment that the SPANK plugin exports; keyword arguments override them
(see option_keys()). Without a checkpoint dir every call is a cheap no-op.
"""
import importlib as _importlib

from ._native import Checkpointer, Error, option_keys

__all__ = ["Checkpointer", "Error", "option_keys", "torch"]


def __getattr__(name):
    # `slurm_ckpt.torch` is imported on first use, so `import slurm_ckpt` works where torch is not installed.
    if name == "torch":
        return _importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'slurm_ckpt' has no attribute {name!r}")
