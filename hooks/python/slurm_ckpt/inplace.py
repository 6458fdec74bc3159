"""Who trains as which rank, generation by generation, when a job recovers in place (no torch here).

`ckpt-run --spares N` starts one step per node: the training nodes' processes (CKPT_INPLACE_RANK_BASE + their
SLURM_PROCID is their rank) and the spares' (CKPT_INPLACE_SPARE=1), which wait, framework imported, to take a dead
rank over. They meet in one directory of the checkpoint dir's control area, `.control/inplace-<CKPT_INPLACE_ID>/`:

  spare-<node>.<local>   a spare, ready (written once, at its start)
  claim-<node>.<local>   that spare's rank and generation (written by the recovery's root before the plan)
  gen-<G>.plan           generation G: its world, the address of its rendezvous store, who replaced whom
  gen-<G>.phases         when each phase of recovery G ended, written once training completed a step again
  finished | abandoned   training ended (idle spares leave with 0) or handed over to a requeue (they leave with 75)

Every file is written whole and renamed into place, so a reader sees all of it or nothing. Generation 0's plan is
written by rank 0; a later one by the rank that decided the last words (the root among the survivors), from what
they agreed: the dead ranks, and the terminal checkpoint every rank resumes from.
"""
import json
import os
import socket
import time

EXIT_PEER_LOST = 75  # a survivor that cannot go on: the requeue path takes over (the controller reads it so)


def _write_atomic(path, data):
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_json(path):
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def address():
    """The address this node's peers reach it at: CKPT_INPLACE_ADDR, else the host name's."""
    explicit = os.environ.get("CKPT_INPLACE_ADDR")
    if explicit:
        return explicit
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


class Launch:
    """What the launcher told this process (None when it was not started for in-place recovery)."""

    def __init__(self, env):
        self.id = env["CKPT_INPLACE_ID"]
        self.world = int(env["CKPT_INPLACE_WORLD"])
        self.spare = env.get("CKPT_INPLACE_SPARE") == "1"
        self.local = int(env.get("SLURM_LOCALID", "0"))
        self.node = env.get("SLURMD_NODENAME") or socket.gethostname()
        self.rank = None if self.spare else int(env["CKPT_INPLACE_RANK_BASE"]) + int(env.get("SLURM_PROCID", "0"))
        root = env.get("CKPT_DIR")
        if not root:
            raise RuntimeError("ckpt: in-place recovery needs a checkpoint dir (CKPT_DIR)")
        if not all(c.isalnum() or c in "._-" for c in self.id) or self.id.startswith("."):
            raise RuntimeError(f"ckpt: CKPT_INPLACE_ID='{self.id}': expected letters, digits, '.', '_' or '-'")
        self.dir = os.path.join(root, ".control", f"inplace-{self.id}")

    @staticmethod
    def from_env(env=os.environ):
        return Launch(env) if env.get("CKPT_INPLACE_ID") else None

    @property
    def slot(self):
        return f"{self.node}.{self.local}"


class Membership:
    """The files of one in-place run (see the module's doc)."""

    def __init__(self, launch, poll_s=0.005):
        self.launch = launch
        self.dir = launch.dir
        self.poll_s = poll_s
        os.makedirs(self.dir, mode=0o700, exist_ok=True)

    def _path(self, name):
        return os.path.join(self.dir, name)

    # ---- spares --------------------------------------------------------------------------------------------------

    def register_spare(self):
        _write_atomic(self._path(f"spare-{self.launch.slot}"),
                      json.dumps({"node": self.launch.node, "local": self.launch.local, "pid": os.getpid(),
                                  "ready_unix": time.time()}))

    def wait_claim(self):
        """A spare waits here: its claim ({generation, rank}), or None when training ended without it."""
        claim = self._path(f"claim-{self.launch.slot}")
        ended = (self._path("finished"), self._path("abandoned"))
        checks = 0
        while True:
            value = _read_json(claim) if os.path.exists(claim) else None
            if value is not None:
                return value
            checks += 1
            if checks % 50 == 0 and any(os.path.exists(p) for p in ended):
                return None
            time.sleep(self.poll_s)

    def free_spares(self):
        """Ready spares no plan claimed, in a stable order: whole nodes first."""
        names = sorted(os.listdir(self.dir))
        claimed = {n[len("claim-"):] for n in names if n.startswith("claim-")}
        slots = [n[len("spare-"):] for n in names if n.startswith("spare-") and ".tmp." not in n]
        return [s for s in slots if s not in claimed]

    # ---- plans ---------------------------------------------------------------------------------------------------

    def write_plan(self, generation, plan, claims=()):
        for slot, rank in claims:
            _write_atomic(self._path(f"claim-{slot}"), json.dumps({"generation": generation, "rank": rank}))
        plan = dict(plan, generation=generation, written_unix=time.time())
        _write_atomic(self._path(f"gen-{generation}.plan"), json.dumps(plan, sort_keys=True))
        return plan

    def has_plan(self, generation):
        return os.path.exists(self._path(f"gen-{generation}.plan"))

    def wait_plan(self, generation, timeout_s):
        path = self._path(f"gen-{generation}.plan")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(path):
                plan = _read_json(path)
                if plan is not None:
                    return plan
            time.sleep(self.poll_s)
        return None

    def write_phases(self, generation, phases):
        """gen-<G>.phases: when each phase of recovery G ended (unix seconds), written at its first step."""
        _write_atomic(self._path(f"gen-{generation}.phases"), json.dumps(phases, sort_keys=True))

    def mark(self, name, why=""):
        """`finished` or `abandoned`: tells the idle spares to leave."""
        _write_atomic(self._path(name), json.dumps({"why": why, "unix": time.time()}))
