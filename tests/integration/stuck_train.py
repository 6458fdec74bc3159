"""slurm-examples/train_ddp.py with one survivor that cannot unwind after a peer loss, for the restart-in-place tests.

gloo never fails a send of an unbound buffer that was partly written when its connection closed (ZeRO-1's parameter
broadcast, with a peer gone): the training thread that waits on it blocks, using no CPU, until the group's 30-minute
timeout. That happens only when a crash meets such a send. Here rank $STUCK_RANK of the first launch blocks the
same way, whenever the peer loss reaches its train() (a collective that failed, or after_step() ending training):
the watchdog must find it stuck and the job go on without waiting for it.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm-examples"))

import train_ddp  # noqa: E402
from slurm_ckpt import restart  # noqa: E402

_train = train_ddp.train


def _stuck_here():
    first_launch = os.environ.get("CKPT_INPLACE_GENERATION_BASE", "0") == "0"
    if not (first_launch and os.environ.get("CKPT_INPLACE_GENERATION") == "0"
            and os.environ.get("RANK") == os.environ.get("STUCK_RANK")):
        return False
    deadline = time.monotonic() + 3  # a collective can fail on the dead peer's reset before the mesh reports it
    while not restart._last_words().get("lost_peer"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def train(*args, **kwargs):
    try:
        return _train(*args, **kwargs)
    finally:
        if _stuck_here():
            print(f"stuck_train: rank {os.environ['RANK']} blocks after the peer loss", file=sys.stderr, flush=True)
            time.sleep(3600)


train_ddp.train = train

if __name__ == "__main__":
    sys.exit(train_ddp.main())
