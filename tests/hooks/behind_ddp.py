"""slurm-examples/train_ddp.py with a survivor a step behind when its peer dies (tests/integration/
test_inplace_local.sh): a failure the last words see only when timing is unlucky, made certain. With the gradients
of step AT (CKPT_TEST_BEHIND_AT) averaged, rank 1 waits for a word from rank 2, and rank 2 for a word from rank 0,
which rank 0 sends once it has ended step AT; rank 2 then dies (SIGKILL) instead of answering. Rank 0 is at step AT,
rank 1 at AT - 1: the last words agree on AT and find rank 1 behind it. Generation 0's ranks only; a spare trains
as train_ddp.py does.

    CKPT_TEST_BEHIND_AT=10 python3 behind_ddp.py [train_ddp.py's options]
"""
import os
import signal
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm-examples"))
import train_ddp  # noqa: E402

AT = int(os.environ["CKPT_TEST_BEHIND_AT"])
_average = train_ddp.average_gradients
_calls = 0


def average_gradients(params, world, group=None):
    global _calls
    _calls += 1  # from step 0 in generation 0: the call of step s (1-based) is the s-th
    ours = not os.environ.get("CKPT_INPLACE_SPARE") and _calls in (AT, AT + 1)
    rank = dist.get_rank() if ours else -1
    if rank == 0 and _calls == AT + 1:  # step AT has ended here; before the all-reduce rank 2 will not join
        dist.send(torch.zeros(1), 2)
    _average(params, world, group)
    if rank == 2 and _calls == AT:
        dist.recv(torch.zeros(1), 0)
        os.kill(os.getpid(), signal.SIGKILL)
    elif rank == 1 and _calls == AT:
        dist.recv(torch.zeros(1), 2)  # never comes: raises once the watchdog shuts the group's connections


train_ddp.average_gradients = average_gradients

if __name__ == "__main__":
    sys.exit(train_ddp.main())
