"""slurm_ckpt.torch.run: restart in place. When a peer dies, the survivors stay alive and re-enter the training
function with a fresh process group, a warm spare taking the dead ranks over; nothing is relaunched.

    def train():                    # the loop as always: Checkpointer, restore(), before_update(), after_step()
        ...                         # dist is initialised already: dist.get_rank(), dist.get_world_size()
    slurm_ckpt.torch.run(train)

Under `ckpt-run --spares N` (one step per node, see slurm_ckpt.inplace), one generation after another:
  1. the group forms: gloo over a TCP store whose address the generation's plan names;
  2. train() runs. The loop makes a Checkpointer, restores the newest complete checkpoint and trains;
  3. a peer dies: the last words write a terminal checkpoint of the step the survivors are on. A watchdog shuts the
     group's sockets here, so that a collective blocked on a frozen peer returns (gloo has no abort). train()
     returns or raises;
  4. the survivors leave the group. The rank that decided the last words (the root) claims a spare per dead rank
     and writes the next generation's plan. It hands each claimed spare the plan through the spare's mailbox
     socket, and posts it in its own mailbox store, where the other survivors wait for it (each rank's store is
     made at its start and named in mailbox-<rank>: nobody polls the file system). Everyone, the spares included,
     goes back to 1 and restores that checkpoint.
Without a spare (or with last words off, or when the plan does not come) the survivors exit with status 75,
and the requeue path takes over as before.

Outside ckpt-run (srun, torchrun) run() forms the group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (or srun's
variables) and calls train() once.
"""
import atexit
import datetime
import json
import os
import queue
import sys
import threading
import time

import torch.distributed as dist

from . import _native, inplace

_PLAN_FANOUT = 16  # how many survivors wait for a plan in one process's mailbox
_PLAN_TIMEOUT_S = float(os.environ.get("CKPT_INPLACE_PLAN_TIMEOUT", "20"))
# How long the ranks of a generation wait for each other at its store before the missing ones count as lost.
_JOIN_TIMEOUT = datetime.timedelta(seconds=float(os.environ.get("CKPT_INPLACE_JOIN_TIMEOUT", "15")))

# The Checkpointer's error when a rank never joined its heartbeat mesh.
_MESH_FAILED = "not every rank joined the mesh"
_state = {"checkpointer": None, "phases": None, "group": None}


def _say(line):
    print(f"ckpt: {line}", file=sys.stderr, flush=True)


def _leave(line, status=inplace.EXIT_PEER_LOST):
    _say(line)
    sys.stdout.flush()
    os._exit(status)  # the failed group's threads may still wait on the dead peer: no interpreter teardown


# ---- what the Checkpointer tells run() ----------------------------------------------------------------------------

def note_checkpointer(cp):
    _state["checkpointer"] = cp


def note_phase(name, step=None):
    """restore() (with the step it resumed from) and the first after_step() of a recovered generation stamp their
    time; the recovery's root prints the whole breakdown at the first step."""
    phases = _state["phases"]
    if phases is None or name in phases:
        return
    phases[name] = time.time()
    if step is not None:
        phases["step"] = step
    if name == "first_step":
        _state["phases"] = None
        members = phases.pop("members", None)
        if phases.pop("report", False):
            _say("in-place recovery " + json.dumps(phases, sort_keys=True))
            try:  # for ckpt-run, which reports the recovery to the controller
                members.write_phases(phases["generation"], phases)
            except OSError as e:
                _say(f"cannot record the phases of in-place recovery {phases['generation']}: {e}")


def _last_words():
    cp = _state["checkpointer"]
    if cp is None or not cp.enabled:
        return {}
    return cp._native.last_words()


# ---- the group ----------------------------------------------------------------------------------------------------

class _Reaper:
    """Destroys what failed generations left (groups, stores), on a thread of its own, each item once nothing else
    holds it (the failed train()'s frames may, until the next generation runs). torch destroys a process group
    with the GIL released: a destructor that waits on a dead peer, or closes thousands of pairs, holds up only this
    thread. A failed group must not be kept either: gloo's event loop spins on a shut socket whose next message
    was meant for a buffer the failed collective freed (a core per survivor, per recovery) until its pairs close.

    At exit the reaper stops: a daemon thread that takes the GIL back while the interpreter finalizes is ended by
    an unwind through the destructor it was in, which aborts the process. So exit waits for the destructor in
    progress (30 s at most), and what is left is never destroyed."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._cv = threading.Condition()
        self._destroying = False
        self._closing = False
        self._thread = None

    def take(self, *things):
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ckpt-inplace-reaper", daemon=True)
                self._thread.start()
                atexit.register(self.close)
        self._queue.put(things)

    def _run(self):
        held = []
        while True:
            try:
                held.extend(self._queue.get(timeout=0.2 if held else None))
            except queue.Empty:
                pass
            for i in reversed(range(len(held))):
                if sys.getrefcount(held[i]) > 2:  # more than this list's reference and the call's: still in use
                    continue
                with self._cv:
                    while self._closing:
                        self._cv.wait()  # parked for good, holding what is left
                    self._destroying = True
                del held[i]
                with self._cv:
                    self._destroying = False
                    self._cv.notify_all()

    def close(self, timeout_s=30.0):
        with self._cv:
            self._closing = True
            self._cv.wait_for(lambda: not self._destroying, timeout_s)


_reaper = _Reaper()
_abandon = _reaper.take


def _sockets():
    """This process's sockets: fd -> 'socket:[inode]'."""
    return _native.socket_fds()


class _JoinFailed(Exception):
    """A generation did not form: `missing` are the ranks that did not answer the roll call after it failed
    (None when the roll call itself failed: the store's host is gone)."""

    def __init__(self, missing, why):
        super().__init__(f"{why}; missing ranks: {missing if missing is not None else 'unknown'}")
        self.missing = missing


def _keyspace(secret, generation, store):
    """The generation's store as the job uses it: every key under a prefix derived from the job's secret, which a
    stranger connected to the store cannot guess (see slurm_ckpt.inplace)."""
    return dist.PrefixStore(inplace.key(secret, f"store/{generation}"), store)


def _missing(plan, rank, secret):
    """After a generation failed to form: a roll call on a fresh connection to its store. Every live rank answers
    once its own connect gave up (within the join timeout); the others are missing. None when the store cannot be
    reached."""
    wait_s = _JOIN_TIMEOUT.total_seconds() + 2
    try:
        client = dist.TCPStore(plan["addr"], plan["port"], None, False, datetime.timedelta(seconds=wait_s))
        store = _keyspace(secret, plan["generation"], client)
        store.add(f"alive/{rank}", 1)

        def absent():  # add(key, 0) reads a counter without waiting for it
            return [r for r in range(plan["world"]) if store.add(f"alive/{r}", 0) == 0]

        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and absent():
            time.sleep(0.05)
        missing = absent()
        _abandon(client, store)
        return missing
    except RuntimeError:
        return None


class _Group:
    """One generation's process group, and the sockets it opened, which a watchdog shuts when a peer is lost."""

    def __init__(self, backend, plan, rank, secret, store=None, before=None, keep_port=None):
        before = _sockets() if before is None else before  # the master's: taken before its store was made
        self.store_port = plan["port"]
        world = plan["world"]
        if store is None:
            store = dist.TCPStore(plan["addr"], plan["port"], None, False, _JOIN_TIMEOUT)
        store = _keyspace(secret, plan["generation"], store)
        self.store = store
        try:
            # Everyone checks in first, then gloo connects. A rank that died after checking in leaves gloo's
            # connect retrying, GIL held, for its whole collective timeout: a native timer shuts its sockets.
            store.set(f"joined/{rank}", str(os.getpid()))
            store.wait([f"joined/{r}" for r in range(world)], _JOIN_TIMEOUT)
            unblock = _native.GroupUnblock(_JOIN_TIMEOUT.total_seconds(), before, plan["port"])
            # torch names groups by a process-wide count, which is the prefix of their keys in the store; a
            # generation whose gloo connect failed counted its group without registering it, and the next one
            # would look for its peers under another name than a fresh spare does.
            if hasattr(dist.distributed_c10d, "_group_count"):
                dist.distributed_c10d._group_count = 0
            try:
                dist.init_process_group(backend, store=store, rank=rank, world_size=world)
            finally:
                unblock.cancel()
            # gloo's connect can succeed on some ranks and fail on others: all must have formed the group.
            store.set(f"formed/{rank}", "1")
            store.wait([f"formed/{r}" for r in range(world)], _JOIN_TIMEOUT)
        except RuntimeError as e:
            if dist.is_initialized():
                _abandon(dist.distributed_c10d._get_default_group(), store)
                dist.destroy_process_group()
            raise _JoinFailed(_missing(plan, rank, secret), e) from None
        self.keep_port = keep_port
        self.sockets = {}
        self.adopt(before)
        # The previous generation's Checkpointer still reports the loss that ended it: this group's watchdog must
        # see only the one train() makes now (on a loaded host it would otherwise shut the new group at once).
        _state["checkpointer"] = None
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watchdog, name="ckpt-inplace-watch", daemon=True)
        self._watch.start()

    def adopt(self, before):
        """Counts the sockets opened since the snapshot `before` as the group's: its own, and those of the
        subgroups train() makes (dist.new_group), which a collective may block on just the same."""
        sockets = {fd: t for fd, t in _sockets().items() if before.get(fd) != t}
        if self.keep_port is not None:
            # The mailbox store's connections that survivors made while waiting for this generation's plan: the
            # watchdog must leave that store whole for the next recovery.
            sockets = {fd: t for fd, t in sockets.items() if _native.local_port(fd) != self.keep_port}
        self.sockets.update(sockets)

    def _watchdog(self):
        while not self._stop.wait(0.02):
            lw = _last_words()
            if lw.get("lost_peer") or lw.get("counted_dead"):
                self.shut()
                return

    def shut(self):
        """Shuts the group's connections (not its store's): blocked collectives fail at once."""
        _native.shut_group_sockets(self.sockets, self.store_port)

    def leave(self, failed):
        self._stop.set()
        if failed:
            self.shut()
            _abandon(dist.distributed_c10d._get_default_group(), self.store)
        dist.destroy_process_group()


_new_group = dist.new_group


def _new_group_of_generation(*args, **kwargs):
    """dist.new_group while run() drives train(): the subgroup's sockets join the generation's, so that the
    watchdog shuts them too when a peer is lost (a TP or DP collective blocked on a dead peer returns)."""
    before = _sockets()
    try:
        return _new_group(*args, **kwargs)
    finally:
        group = _state["group"]
        if group is not None:
            group.adopt(before)


def _store_master(world):
    """The generation's store, hosted here: (the store and the sockets before it, for _Group), and the plan's
    part that names it."""
    before = _sockets()
    store = dist.TCPStore(inplace.address(), 0, None, True, _JOIN_TIMEOUT, wait_for_workers=False)
    return (store, before), {"world": world, "addr": inplace.address(), "port": store.port}


class _Mailbox:
    """This process's mailbox store: as a recovery's root it posts the plan there, and as any other survivor it
    posts there the plan its parent in the plan tree handed it; its children, which learnt its address from
    mailbox-<rank>, wait on it (see _plan_tree). Made at the start, before any group's
    socket snapshot, so that no watchdog or join timer takes its listener for a group's; published once the
    process first formed a group (a spare's, under the rank it took over)."""

    def __init__(self, secret=None):
        self.secret = secret  # run() sets it once the run's secret exists
        self.addr = inplace.address()
        self.store = dist.TCPStore(self.addr, 0, None, True, _JOIN_TIMEOUT, wait_for_workers=False)
        self.port = self.store.port
        self.published = False

    def publish(self, members, rank, generation):
        if self.published:
            return
        try:
            members.publish_mailbox(rank, generation, self.addr, self.port)
            self.published = True
        except OSError as e:  # the survivors of a recovery this rank roots then read the plan file, slowly
            _say(f"rank {rank}: cannot publish its mailbox: {e}")

    def post(self, generation, plan):
        label = f"plan/{generation}"
        self.store.set(inplace.key(self.secret, label), inplace.seal(self.secret, label, plan))

    def wait_taken(self, generation, count, timeout_s):
        """A process that abandons stays until its `count` children took the plan (or timeout_s passed): its store
        goes with it, and a child that comes later could only wait for the connect to time out."""
        deadline = time.monotonic() + timeout_s
        taken = inplace.key(self.secret, f"taken/{generation}")
        while self.store.add(taken, 0) < count and time.monotonic() < deadline:
            time.sleep(0.01)


def _mailbox_of(members, rank, current):
    """Rank `rank`'s mailbox address (one file read), or None when it is unknown or stale. `current` is the plan of
    the generation that failed: a process that took a rank over in it may not have published its mailbox yet."""
    entry = members.mailbox(rank)
    if not entry or entry.get("rank") != rank or not isinstance(entry.get("port"), int):
        return None
    if str(rank) in current.get("takeover", {}) and entry.get("generation", -1) < current.get("generation", 0):
        return None  # the dead predecessor's address
    return entry


def _plan_tree(world, lost, root, rank, fanout=None):
    """Who hands survivor `rank` the plan, and who takes it from `rank`: the survivors in rank order from the root,
    each the parent of the next `fanout`, so that no mailbox serves more than `fanout` survivors and the plan
    reaches N of them in log_fanout(N) hops (4 at 16,384 ranks). (None, children) at the root."""
    fanout = fanout or _PLAN_FANOUT
    lost = set(lost)
    order = [root] + [r for r in range(world) if r != root and r not in lost]
    if rank not in order:
        return root, []
    i = order.index(rank)
    return (order[(i - 1) // fanout] if i > 0 else None), order[i * fanout + 1:(i + 1) * fanout + 1]


def _plan_from_mailboxes(members, secret, generation, rank, sources, current, timeout_s):
    """A survivor's wait for plan `generation`, blocked in a mailbox store: its parent's in the plan tree, and when
    that fails or times out, the root's. None after timeout_s. The waits last 1, 2, 4 ... s, with one look at the
    plan file after each (a survivor that named another root than the one that wrote the plan still finds it) and
    a fresh connection (a timed-out wait leaves torch's client out of step). Once no store can be reached, or one
    holds a plan the job did not sign, the file alone, once a second."""
    deadline = time.monotonic() + timeout_s
    label = f"plan/{generation}"
    key = inplace.key(secret, label)
    sources = list(dict.fromkeys(sources))
    entry = None
    for slice_s in inplace.backoff(1.0, 8.0):
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        slice_s = min(slice_s, left)
        while entry is None and sources:
            entry = _mailbox_of(members, sources.pop(0), current)
        t0 = time.monotonic()
        if entry is not None:
            try:
                store = dist.TCPStore(entry["addr"], entry["port"], None, False, datetime.timedelta(seconds=slice_s))
                store.wait([key], datetime.timedelta(seconds=slice_s))
                plan = inplace.unseal(secret, label, store.get(key))
                if plan is not None:
                    if plan.get("abandon"):  # the abandoning process waits for this before it leaves
                        store.add(inplace.key(secret, f"taken/{generation}"), 1)
                    return plan
                _say(f"rank {rank}: the plan at {entry['addr']}:{entry['port']} is not signed with the job's "
                     f"secret; reading the plan file instead")
                sources, entry = [], None
            except (RuntimeError, OSError, ValueError, AttributeError):  # a connect's timeout is an OSError
                store = None  # closes a client whose wait timed out
            if sources or time.monotonic() - t0 < slice_s / 2:
                entry = None  # the next source; or, failing fast, the store is gone or was never there
        else:
            time.sleep(min(1.0, left))
        plan = members.wait_plan(generation, 0)
        if plan is not None:
            return plan


def _set_rank_env(rank, world, launch, generation):
    # CKPT_INPLACE_GENERATION fences earlier generations out of the checkpoint dir: a frozen rank that thaws
    # cannot commit there any more.
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(launch.local),
                      CKPT_RUN_ID=f"{launch.id}.g{generation}", CKPT_INPLACE_GENERATION=str(generation))
    if generation > 0:  # the plugin's choice was for generation 0: resume from the newest checkpoint instead
        os.environ.pop("CKPT_RESUME_STEP", None)
        os.environ.pop("CKPT_RESUME_PATH", None)


# ---- recovery -----------------------------------------------------------------------------------------------------

def _next_plan(members, mailbox, generation, rank, failure, world):
    """At the recovery's root: a spare per lost rank, claimed, and the plan; or a plan that abandons. Written to
    the files first (the record, and the fallback), then handed to the spares and posted for the survivors."""
    lost = failure["lost"]
    free = members.free_spares()
    if len(free) < len(lost):
        why = f"{len(lost)} ranks lost, {len(free)} spares ready"
        members.mark("abandoned", why)
        plan = members.write_plan(generation, {"abandon": why})
        mailbox.post(generation, plan)
        return None, plan
    store, plan = _store_master(world)
    takeover = dict(zip(lost, free))
    plan.update(root=rank, lost=lost, step=failure["step"], takeover={str(r): slot for r, slot in takeover.items()},
                detect_unix=failure["detect_unix"])
    claims = [(slot, r) for r, slot in takeover.items()]
    plan = members.write_plan(generation, plan, claims=claims)
    missed = members.deliver_claims(plan, claims)
    if missed:
        _say(f"spares {missed} cannot be reached: they find their claim files")
    mailbox.post(generation, plan)
    return store, plan


def _peer_loss(cp, rank):
    """After train() of a generation a peer of which died: what the last words agreed on."""
    if cp is not None:
        try:
            cp.abort()  # waits for the last words to end (idempotent after close)
        except Exception:  # noqa: BLE001 - the checkpoint in flight failed with the group; the library said so
            pass
    lw = _last_words()
    if lw.get("counted_dead"):
        _leave(f"rank {rank}: the other ranks count this rank as dead; leaving")
    # The step is the terminal checkpoint's when one was committed; else the newest complete one is resumed from.
    step = lw.get("step") if lw.get("committed") else None
    return {"lost": lw.get("lost", []), "root": lw.get("root", -1), "step": step,
            "detect_unix": lw.get("detect_unix"), "decided_unix": lw.get("decided_unix"),
            "done_unix": lw.get("done_unix")}


def _join_failure(plan, missing):
    """A generation that did not form: its missing ranks are lost; it resumes from the same checkpoint."""
    now = time.time()
    root = plan["root"] if plan["root"] not in missing else -1
    return {"lost": missing, "root": root, "step": plan.get("step"), "detect_unix": now, "decided_unix": now,
            "done_unix": now}


def _plan_of_tree(members, mailbox, generation, rank, parent, root, current, timeout_s):
    """A survivor's plan, taken from its parent in the plan tree (or the file) and posted in its own mailbox for
    its children."""
    if parent is None:  # the root, after the plan was written (a rank that recovers twice as the root)
        plan = members.wait_plan(generation, timeout_s)
    else:
        plan = _plan_from_mailboxes(members, mailbox.secret, generation, rank, [parent, root], current, timeout_s)
    if plan is not None:
        mailbox.post(generation, plan)
    return plan


def _recover(members, mailbox, generation, rank, world, failure, current):
    """This rank's plan for generation `generation` after `failure` of the generation `current` planned, with the
    master store when this rank hosts it. Leaves the process when it cannot go on."""
    lost = failure["lost"]
    root = failure["root"] if failure["root"] >= 0 else min(r for r in range(world) if r not in lost)
    if members.has_plan(generation + 1):
        # A rank that was frozen through a recovery and thaws now: the job went on without it.
        _leave(f"rank {rank}: generation {generation + 1} runs already; this process is stale and leaves")
    parent, children = _plan_tree(world, lost, root, rank)
    store = None
    if rank == root and not members.has_plan(generation):
        store, plan = _next_plan(members, mailbox, generation, rank, failure, world)
    else:
        plan = _plan_of_tree(members, mailbox, generation, rank, parent, root, current, _PLAN_TIMEOUT_S)
    if plan is None:
        members.mark("abandoned", f"no plan for generation {generation}")  # the idle spares leave too
        _leave(f"rank {rank}: no plan for generation {generation} within {_PLAN_TIMEOUT_S:g} s; "
               f"handing over to a requeue")
    if plan.get("abandon"):
        mailbox.wait_taken(generation, len(children), 5)
        _leave(f"rank {rank}: cannot recover in place ({plan['abandon']}); handing over to a requeue")
    if rank in plan["lost"]:
        _leave(f"rank {rank}: counted as lost by generation {generation}; leaving")
    phases = {"generation": generation, "detect": failure["detect_unix"], "decided": failure["decided_unix"],
              "last_words_done": failure["done_unix"], "plan": plan["written_unix"], "step": plan["step"],
              "lost": plan["lost"], "report": rank == plan["root"], "members": members}
    if rank == plan["root"]:
        _say(f"in-place recovery {generation}: ranks {plan['lost']} lost; spares {sorted(plan['takeover'].values())}"
             f" take them over; resuming from " +
             (f"step {plan['step']}" if plan["step"] is not None else "the newest complete checkpoint"))
    return plan, store, phases


def init_process_group(backend="gloo", alone=False, **kwargs):
    """dist.init_process_group from torchrun's variables or srun's: the rank and world size from RANK/WORLD_SIZE,
    else SLURM_PROCID/SLURM_NTASKS; MASTER_ADDR, when unset or empty, the first host of the step (where srun
    starts rank 0); MASTER_PORT, when unset, one derived from the job id. A world of one forms a group only with
    alone=True (on this host's loopback: nobody else joins). Returns (rank, world)."""
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    if (world > 1 or alone) and not dist.is_initialized():
        if not os.environ.get("MASTER_ADDR"):
            nodes = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
            if world == 1:
                os.environ["MASTER_ADDR"] = "127.0.0.1"
            elif not nodes:
                raise RuntimeError("ckpt: set MASTER_ADDR (or run under srun): rank 0's host is not known")
            else:
                os.environ["MASTER_ADDR"] = _native.expand_hostlist(nodes)[0]
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
        dist.init_process_group(backend, rank=rank, world_size=world, **kwargs)
    return rank, world


def _run_plain(train, backend, args, kwargs):
    init_process_group(backend)
    try:
        return train(*args, **kwargs)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _warm_up(warm, kwargs):
    """Runs `warm` (run()'s) once in this process; train() gets what it made as its keyword argument `warm`.
    Returns the seconds it took (None without `warm`)."""
    if warm is None:
        return None
    t0 = time.monotonic()
    kwargs["warm"] = warm()
    return time.monotonic() - t0


def _first_generation(launch, members, warm, kwargs):
    """Where this process starts: (generation, rank, plan, store). A training rank starts generation 0 (rank 0
    hosts its store); a spare warms up, registers as ready, waits for its claim, and leaves when training ends
    without it."""
    if launch.spare:
        took = _warm_up(warm, kwargs)
        if took is not None:
            _say(f"spare {launch.slot}: warm in {took:.2f} s; ready")
        spare_box = inplace.SpareMailbox(inplace.address())
        members.register_spare(spare_box)
        claim = members.wait_claim(spare_box)
        spare_box.close()
        if claim is None:
            os._exit(inplace.EXIT_PEER_LOST if os.path.exists(os.path.join(members.dir, "abandoned")) else 0)
        generation, rank = claim["generation"], claim["rank"]
        # Through the mailbox the plan came with the claim; a claim file precedes its plan file by a moment.
        plan = claim.get("plan") or members.wait_plan(generation, _PLAN_TIMEOUT_S)
        if plan is None or plan.get("abandon"):
            _leave(f"spare {launch.slot}: no usable plan for generation {generation}")
        _say(f"spare {launch.slot} takes rank {rank} over (generation {generation})")
        return generation, rank, plan, None
    _warm_up(warm, kwargs)
    if launch.rank == 0:
        members.secret()  # made before generation 0's plan, which every other process waits for
        store, plan = _store_master(launch.world)
        return 0, 0, members.write_plan(0, dict(plan, root=0, lost=[], step=None)), store
    # Rank 0's address is known only from its plan: polled, backing off from 5 ms to 1 s.
    plan = members.wait_plan(0, max(_PLAN_TIMEOUT_S, 120))
    if plan is None:
        _leave(f"rank {launch.rank}: rank 0 did not start generation 0")
    return 0, launch.rank, plan, None


def run(train, *args, backend="gloo", warm=None, **kwargs):
    """Calls train(*args, **kwargs) with the default process group formed, again after each in-place recovery.
    Returns what the last call returned. A spare that was never needed exits 0 when training ends.

    `warm`, when given, is called once per process, before its first generation, and train() receives what it
    returns as its keyword argument `warm` in every generation. Build there what does not depend on the rank or
    the group (the model, the optimizer, their memory): a spare does it while it waits, so that a replacement
    starts training without building anything, and a survivor keeps it across generations. train() must then
    start from what restore() loads: zero the gradients (a failed step may have left some) and take every other
    state from the checkpoint."""
    launch = inplace.Launch.from_env()
    if launch is None:
        _warm_up(warm, kwargs)
        return _run_plain(train, backend, args, kwargs)
    os.environ["CKPT_EXIT_GRACE"] = "0s"  # this process leaves the failed group itself: the library must not end it
    dist.new_group = dist.distributed_c10d.new_group = _new_group_of_generation  # new_subgroups calls it too
    members = inplace.Membership(launch)
    mailbox = _Mailbox()
    world, phases = launch.world, None
    generation, rank, plan, store = _first_generation(launch, members, warm, kwargs)
    # Rank 0 made the run's secret before generation 0's plan, which every process has seen by now: one read each,
    # not a creation race of every process in the shared dir at the job's start.
    secret = mailbox.secret = members.secret()
    while True:
        _set_rank_env(rank, world, launch, generation)
        try:
            group = _Group(backend, plan, rank, secret, *(store or (None, None)), keep_port=mailbox.port)
        except (_JoinFailed, RuntimeError) as e:
            if generation == 0:
                raise
            missing = e.missing if isinstance(e, _JoinFailed) else None
            if not missing:  # the store itself is gone (its host died), or everyone answered: no way forward
                members.mark("abandoned", f"generation {generation} did not form: {e}")
                _leave(f"rank {rank}: generation {generation} did not form ({e}); handing over to a requeue")
            _say(f"rank {rank}: generation {generation} did not form: {e}")
            _abandon(store)
            generation += 1
            plan, store, phases = _recover(members, mailbox, generation, rank, world, _join_failure(plan, missing),
                                           plan)
            continue
        if phases is not None:
            phases["group"] = time.time()
        mailbox.publish(members, rank, generation)
        _state["phases"] = phases
        _state["group"] = group
        error, result = None, None
        try:
            result = train(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a dead peer surfaces as any error of the training code
            error = e
        cp = _state["checkpointer"]
        lw = _last_words()
        if error is not None and lw.get("armed") and cp is not None:
            try:
                cp.abort()  # a collective failed: the last words tell whether a peer died
            except Exception:  # noqa: BLE001 - the periodic checkpoint in flight failed with the group; said already
                pass
            lw = _last_words()
        if generation > 0 and error is not None and _MESH_FAILED in str(error) and not lw.get("lost_peer"):
            # A replacement died after the group formed, before the Checkpointer's heartbeat mesh did: every live
            # rank fails here alike, and answers the roll call.
            group.leave(failed=True)
            missing = _missing(plan, rank, secret)
            if missing:
                _say(f"rank {rank}: generation {generation} lost ranks {missing} before its first step")
                generation += 1
                plan, store, phases = _recover(members, mailbox, generation, rank, world,
                                               _join_failure(plan, missing), plan)
                continue
            raise error
        if not (lw.get("lost_peer") or lw.get("counted_dead")):
            group.leave(failed=error is not None)
            if error is not None:
                raise error
            if rank == 0:
                members.mark("finished")
            return result
        group.leave(failed=True)
        generation += 1
        plan, store, phases = _recover(members, mailbox, generation, rank, world, _peer_loss(cp, rank), plan)
