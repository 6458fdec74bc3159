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

Every decision on the way (who writes the plan, who hands it to whom, what follows the end of train() or a
generation that did not form) and every record are native (_native.inplace, ckpt/inplace.hpp, unit-tested
there); this module keeps the effects: stores, gloo, sockets. A process follows the public state machine of
ckpt/inplace.hpp: waiting (a spare) -> forming -> training -> recovering -> forming ... -> finished, or left.

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

import torch
import torch.distributed as dist

from . import _native, inplace

_core = _native.inplace  # the decisions and records (ckpt/inplace.hpp); this module keeps the effects

_ENV = inplace.ENV
_PLAN_TIMEOUT_S = float(os.environ.get(_ENV["inplace_plan_timeout"], "20"))
# How long the ranks of a generation wait for each other at its store before the missing ones count as lost.
_JOIN_TIMEOUT = datetime.timedelta(seconds=float(os.environ.get(_ENV["inplace_join_timeout"], "15")))
_ROLL_SCAN_S = 0.25  # how often the roll call's host reads who has answered (one read per rank)

# The Checkpointer's error when a rank never joined its heartbeat mesh.
_MESH_FAILED = "not every rank joined the mesh"
# The memory tier's checkpoints this rank held when the last words ended (MemoryCopy), until the next generation's
# restore: copies, the partner copies by ward, which the handover sends to the wards' replacements; own, this
# rank's own staging, which its restore takes where its live state is of another step.
_state = {"checkpointer": None, "recovery": None, "group": None, "plan": None, "copies": {}, "own": []}


def _say(line):
    print(f"ckpt: {line}", file=sys.stderr, flush=True)


# What a process that gives up on recovering in place leaves to ckpt-run: relaunching the node steps inside the
# allocation without the lost ranks' nodes (a spare node in their place), or, where it cannot, a requeue.
_HANDING_OVER = "handing over to ckpt-run (a relaunch inside the allocation, or a requeue)"


def _leave(line, status=inplace.EXIT_PEER_LOST):
    if line:
        _say(line)
    sys.stdout.flush()
    os._exit(status)  # the failed group's threads may still wait on the dead peer: no interpreter teardown


# ---- what the Checkpointer tells run() ----------------------------------------------------------------------------

def note_checkpointer(cp):
    _state["checkpointer"] = cp


def note_phase(name, step=None):
    """restore() (with the step it resumed from) and the first after_step() of a recovered generation stamp their
    time; the recovery's root prints the whole breakdown at the first step and records it for ckpt-run."""
    recovery = _state["recovery"]
    if recovery is None or getattr(recovery.phases, name):
        return
    setattr(recovery.phases, name, time.time())
    if step is not None:
        recovery.phases.step = step
    if name == "first_step":
        _state["recovery"] = None
        recovery.finish()


def handover(layout):
    """This rank's part in handing state over as a recovered generation starts (ckpt/inplace.hpp, state_donors):
    (what it sends: [(recipient, items)] with items [(region name, uint8 tensor)], None for its own live state, or
    from the partner copy it holds of a lost rank; the donor it receives from, or None). A recipient is a
    replacement, or a survivor the plan lists as behind its step. A copy is sent once and then dropped; one that
    is missing (none of the plan's step is held) goes out as nothing, and the replacement reads its shard instead."""
    plan = _state["plan"]
    copies, _state["copies"] = _state["copies"], {}
    if plan is None:
        return [], None
    donors = _core.state_donors(plan, layout)
    rank = int(os.environ[_ENV["rank"]])
    sends = []
    for to, donor in sorted(donors.items()):
        if donor.rank != rank:
            continue
        if not donor.partner_copy:
            sends.append((to, None))
            continue
        copy = copies.get((to, plan.step))
        if copy is None:
            _say(f"rank {rank}: holds no partner copy of rank {to}'s step {plan.step}; it reads its shard")
            sends.append((to, []))
            continue
        sends.append((to, _items_of(copy)))
    return sends, (donors[rank].rank if rank in donors else None)


def _items_of(copy):
    """A MemoryCopy's ranges as [(region name, uint8 tensor over its bytes)], without a copy."""
    if not copy.ranges:
        return []
    data = torch.frombuffer(copy, dtype=torch.uint8)
    return [(name, data[offset:offset + length]) for name, offset, length in copy.ranges]


def own_copy():
    """A survivor's own checkpoint in memory of the step the generation resumes from (its staging's snapshots and
    their blobs, kept after the last words) as [(region name, uint8 tensor)]; once, then dropped. Its restore offers
    it after its live state: a rank caught mid-update, or whose live state is a step ahead, still reads nothing."""
    plan, own, _state["own"] = _state["plan"], _state["own"], []
    if plan is None:
        return []
    return [item for copy in own if copy.step == plan.step for item in _items_of(copy)]


def drop_memory_copies():
    """The memory tier's checkpoints kept for this generation's restore, let go (a restore that takes nothing from
    memory: CKPT_INPLACE_STATE=files)."""
    _state["copies"], _state["own"] = {}, []


def _keep_memory_copies(cp):
    """After the last words: the memory tier's checkpoints this rank holds outlive its Checkpointer."""
    copies = cp._native.release_memory_copies() if cp is not None and cp.enabled else []
    rank = int(os.environ.get(_ENV["rank"], "-1"))
    _state["own"] = [c for c in copies if c.rank == rank]
    _state["copies"] = {(c.rank, c.step): c for c in copies if c.rank != rank}  # a ward's two newest copies


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


class _Absentees:
    """At the host of a generation's store, while the generation forms and in its roll call: the ranks still
    absent after GRACE_S are dialed at the mailbox they published (inplace.refuses), again every GRACE_S; those
    refused are gone for good (_core.gone_for_good), so that the generation gives up on them at once rather than
    at the join timeout. Nothing to dial in generation 0 (no mailbox is published before a group formed) or once
    the world shrank (mailboxes are named by the old ranks)."""

    GRACE_S = _core.WATCH_PERIOD_S

    def __init__(self, members, plan, rank):
        self.members, self.plan, self.rank = members, plan, rank
        self.refused = set()
        self.said = set()
        self.next_look = time.monotonic() + self.GRACE_S

    @staticmethod
    def dials(plan, launch):
        """Whether the mailboxes name the plan's ranks: not in generation 0, not once the world shrank."""
        return plan.generation > 0 and plan.world == launch.world

    @staticmethod
    def of(members, plan, rank, hosts, launch):
        return _Absentees(members, plan, rank) if hosts and _Absentees.dials(plan, launch) else None

    def due(self):
        return time.monotonic() >= self.next_look

    def look(self, absent):
        """The absent ranks refused by now (dialing those not refused yet, at most every GRACE_S)."""
        if self.due():
            for r in absent:
                entry = None if r in self.refused else _mailbox_of(self.members, r, self.plan)
                if entry is not None and inplace.refuses(entry.addr, entry.port):
                    self.refused.add(r)
            self.next_look = time.monotonic() + self.GRACE_S
        gone = _core.gone_for_good(list(absent), sorted(self.refused))
        if set(gone) - self.said:
            self.said.update(gone)
            _say(f"rank {self.rank}: ranks {gone} of generation {self.plan.generation} are gone: their mailboxes "
                 "refuse connections")
        return gone


def _await_all(store, stage, rank, world, hosts, absentees):
    """Every rank of the generation reached `stage` ("joined": checked in at its store; "formed": its gloo group
    connected). The store's host counts them and, with `absentees`, gives up at once on a rank gone for good; the
    others wait for its verdict: "all", or why the generation cannot form, which each raises as a RuntimeError (as
    for a wait that timed out)."""
    store.add(f"{stage}/{rank}", 1)
    store.add(stage, 1)
    if not hosts:  # the host says by its own deadline, which may be a little after this rank's
        store.wait([f"{stage}/verdict"], _JOIN_TIMEOUT + datetime.timedelta(seconds=2))
        verdict = store.get(f"{stage}/verdict").decode(errors="replace")
        if verdict != "all":
            raise RuntimeError(verdict)
        return
    deadline = time.monotonic() + _JOIN_TIMEOUT.total_seconds()
    why = None
    while why is None and store.add(stage, 0) < world:
        if absentees is not None and absentees.due():
            gone = absentees.look([r for r in range(world) if store.add(f"{stage}/{r}", 0) == 0])
            if gone:
                why = f"ranks {gone} are gone: their mailboxes refuse connections"
        if why is None and time.monotonic() >= deadline:
            why = f"not every rank {stage} within {_JOIN_TIMEOUT.total_seconds():g} s"
        time.sleep(0.01)
    store.set(f"{stage}/verdict", why or "all")
    if why is not None:
        raise RuntimeError(why)


def _missing(plan, rank, secret, hosts=False, absentees=None):
    """After a generation failed to form: a roll call on a fresh connection to its store. Every live rank answers
    once its own connect gave up (within the join timeout); the store's host counts the answers and publishes the
    verdict, the same for every rank: the ranks that did not answer by its deadline, or sooner once every one of
    them is gone for good (_Absentees). None when the store cannot be reached."""
    wait_s = _JOIN_TIMEOUT.total_seconds() + 2
    try:
        client = dist.TCPStore(plan.addr, plan.port, None, False, datetime.timedelta(seconds=2 * wait_s))
        store = _keyspace(secret, plan.generation, client)
        store.add(f"alive/{rank}", 1)
        store.add("alive", 1)
        if hosts:  # a rank whose gloo connect ended while the host's failed waits for no "formed" verdict
            store.set("formed/verdict", "the group did not form at the store's host")
        else:
            # The host began its roll call at most a join timeout after this rank did, and ends it within wait_s.
            store.wait(["roll/verdict"], datetime.timedelta(seconds=2 * wait_s))
            verdict = inplace.parse_bounded(store.get("roll/verdict"))
            store.add("roll/read", 1)
            _abandon(client, store)
            return [r for r in verdict if isinstance(r, int)] if isinstance(verdict, list) else None

        # add(key, 0) reads a counter without waiting for it. The count every 50 ms; who is absent (a read per
        # rank, here only) every _ROLL_SCAN_S and at the deadline.
        deadline, scanned = time.monotonic() + wait_s, 0.0
        missing = None
        while store.add("alive", 0) < plan.world:
            now = time.monotonic()
            if now - scanned >= _ROLL_SCAN_S or now >= deadline:
                missing, scanned = [r for r in range(plan.world) if store.add(f"alive/{r}", 0) == 0], now
                if now >= deadline or (absentees is not None and
                                       _core.roll_call_settled(missing, absentees.look(missing))):
                    break
            time.sleep(0.05)
        else:
            missing = []
        store.set("roll/verdict", json.dumps(missing))
        # Every rank that answered reads the verdict before this process moves on and its store goes.
        readers, deadline = plan.world - len(missing) - 1, time.monotonic() + wait_s
        while store.add("roll/read", 0) < readers and time.monotonic() < deadline:
            time.sleep(0.01)
        _abandon(client, store)
        return missing
    except RuntimeError:
        return None


class _Group:
    """One generation's process group, and the sockets it opened, which a watchdog shuts when a peer is lost."""

    def __init__(self, backend, plan, rank, secret, store=None, before=None, keep_port=None, on_stuck=None,
                 absentees=None, watched=list):
        before = _sockets() if before is None else before  # the master's: taken before its store was made
        self.store_port = plan.port
        world = plan.world
        hosts = store is not None
        if store is None:
            store = dist.TCPStore(plan.addr, plan.port, None, False, _JOIN_TIMEOUT)
        store = _keyspace(secret, plan.generation, store)
        self.store = store
        try:
            # Everyone checks in first, then gloo connects. A rank that died after checking in leaves gloo's
            # connect retrying, GIL held, for its whole collective timeout: a native timer shuts its sockets, at
            # once where one of the `watched()` mailboxes (the replacements', published before they checked in)
            # refuses.
            _await_all(store, "joined", rank, world, hosts, absentees)
            unblock = _native.GroupUnblock(_JOIN_TIMEOUT.total_seconds(), before, plan.port, watched())
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
            _await_all(store, "formed", rank, world, hosts, absentees)
        except RuntimeError as e:
            if dist.is_initialized():
                _abandon(dist.distributed_c10d._get_default_group(), store)
                dist.destroy_process_group()
            raise _JoinFailed(_missing(plan, rank, secret, hosts, absentees), e) from None
        self.keep_port = keep_port
        self.sockets = {}
        self.adopt(before)
        # The previous generation's Checkpointer still reports the loss that ended it: this group's watchdog must
        # see only the one train() makes now (on a loaded host it would otherwise shut the new group at once).
        _state["checkpointer"] = None
        self._stop = threading.Event()
        self._returned = threading.Event()
        self._trainer = threading.get_ident()  # the thread that runs train() in this generation
        self._on_stuck = on_stuck
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
                if not lw.get("counted_dead"):  # a rank the others count as dead leaves on its own
                    self._watch_unwinding()
                return

    def _watch_unwinding(self):
        """After the shut, until train() returns: a training thread the core finds stuck (training_stuck: blocked
        in a send gloo never fails) is reported to on_stuck, with how long it has used no CPU."""
        if self._on_stuck is None:
            return
        try:
            clock = time.pthread_getcpuclockid(self._trainer)
            cpu, idle_since = time.clock_gettime(clock), time.monotonic()
            while not self._stop.wait(0.2):
                now, used = time.monotonic(), time.clock_gettime(clock)
                if used != cpu:
                    cpu, idle_since = used, now
                lw = _last_words()
                if lw.get("counted_dead"):
                    return
                if _core.training_stuck(bool(lw.get("done")), self._returned.is_set(), now - idle_since):
                    self._on_stuck(now - idle_since)
                    return
        except OSError:  # the thread is gone
            return

    def train_ended(self):
        """train() returned or raised: the training thread is not stuck."""
        self._returned.set()

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


def _store_master(plan):
    """The generation's store, hosted here and named in `plan`: (the store, the sockets before it), for _Group."""
    before = _sockets()
    store = dist.TCPStore(inplace.address(), 0, None, True, _JOIN_TIMEOUT, wait_for_workers=False)
    plan.addr, plan.port = inplace.address(), store.port
    return store, before


class _Mailbox:
    """This process's mailbox store: as a recovery's root it posts the plan there, and as any other survivor it
    posts there the plan its parent in the plan tree handed it; its children, which learnt its address from
    mailbox-<rank>, wait on it (see _plan_tree). Made at the start, before any group's
    socket snapshot, so that no watchdog or join timer takes its listener for a group's; published once the
    process first formed a group, or a spare's at its claim, under the rank it took over. It lives as long as the
    process: a connection it refuses says the process is gone (_Absentees)."""

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
        except RuntimeError as e:  # the survivors of a recovery this rank roots then read the plan record, slowly
            _say(f"rank {rank}: cannot publish its mailbox: {e}")

    def post(self, generation, plan):
        label = f"plan/{generation}"
        self.store.set(inplace.key(self.secret, label), inplace.seal(self.secret, label, plan.to_json()))

    def wait_taken(self, generation, count, timeout_s):
        """A process that abandons stays until its `count` children took the plan (or timeout_s passed): its store
        goes with it, and a child that comes later could only wait for the connect to time out."""
        deadline = time.monotonic() + timeout_s
        taken = inplace.key(self.secret, f"taken/{generation}")
        while self.store.add(taken, 0) < count and time.monotonic() < deadline:
            time.sleep(0.01)


def _mailbox_of(members, rank, current):
    """Rank `rank`'s mailbox (one record read), or None when it is unknown or stale. `current` is the plan of the
    generation that failed: a process that took a rank over in it may not have published its mailbox yet."""
    entry = members.mailbox(rank)
    if entry is None:
        return None
    if rank in current.takeover and entry.generation < current.generation:
        return None  # the dead predecessor's address
    return entry


def _plan_from_mailboxes(members, secret, generation, rank, sources, current, timeout_s):
    """A survivor's wait for plan `generation`, blocked in a mailbox store: its parent's in the plan tree, and when
    that fails or times out, the root's. None after timeout_s. The waits last 1, 2, 4 ... s, with one look at the
    plan record after each (a survivor that named another root than the one that wrote the plan still finds it)
    and a fresh connection (a timed-out wait leaves torch's client out of step). Once no store can be reached, or
    one holds a plan the job did not sign, the record alone, once a second."""
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
                store = dist.TCPStore(entry.addr, entry.port, None, False, datetime.timedelta(seconds=slice_s))
                store.wait([key], datetime.timedelta(seconds=slice_s))
                body = inplace.unseal(secret, label, store.get(key))
                plan = _core.Plan.parse(body) if body is not None else None
                if plan is not None and plan.generation == generation:
                    if plan.abandons:  # the abandoning process waits for this before it leaves
                        store.add(inplace.key(secret, f"taken/{generation}"), 1)
                    return plan
                _say(f"rank {rank}: the plan at {entry.addr}:{entry.port} is not signed with the job's "
                     f"secret; reading the plan record instead")
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


def _plan_of_tree(members, mailbox, generation, rank, sources, current, timeout_s=None):
    """A survivor's plan, taken from its parent in the plan tree or the root (`sources`, in that order), or the
    record, and posted in its own mailbox for its children."""
    timeout_s = _PLAN_TIMEOUT_S if timeout_s is None else timeout_s
    if not sources:  # the tree's top, after the plan was written (a rank that recovers twice as the root)
        plan = members.wait_plan(generation, timeout_s)
    else:
        plan = _plan_from_mailboxes(members, mailbox.secret, generation, rank, sources, current, timeout_s)
    if plan is not None:
        mailbox.post(generation, plan)
    return plan


def _set_rank_env(rank, world, launch, generation):
    # CKPT_INPLACE_GENERATION fences earlier generations out of the checkpoint dir: a frozen rank that thaws
    # cannot commit there any more.
    os.environ.update({_ENV["rank"]: str(rank), _ENV["world_size"]: str(world), _ENV["local_rank"]: str(launch.local),
                       _ENV["run_id"]: f"{launch.id}.g{generation}", _ENV["generation"]: str(launch.generation_base + generation)})
    if generation > 0:  # the plugin's choice was for generation 0: resume from the newest checkpoint instead
        os.environ.pop(_ENV["resume_step"], None)
        os.environ.pop(_ENV["resume_path"], None)


def _peer_loss():
    """After train() of a generation a peer of which died: what the last words agreed on."""
    lw = _last_words()
    failure = _core.Failure()
    failure.lost = sorted(lw.get("lost", []))
    failure.root = lw.get("root", -1)
    # The step is the terminal checkpoint's when one was committed; else the newest complete one is resumed from.
    failure.step = lw.get("step") if lw.get("committed") else None
    failure.detect_unix = lw.get("detect_unix") or 0.0
    failure.decided_unix = lw.get("decided_unix") or 0.0
    failure.done_unix = lw.get("done_unix") or 0.0
    failure.stand_ins = dict(lw.get("stand_ins", {}))
    failure.behind = sorted(lw.get("behind", []))
    return failure


class _Recovery:
    """One in-place recovery as this rank lived it: the phases its root reports at the first step."""

    def __init__(self, members, generation, failure, plan, report):
        self.members, self.report = members, report
        p = self.phases = _core.Phases()
        p.generation, p.detect, p.decided, p.last_words_done = (generation, failure.detect_unix, failure.decided_unix,
                                                                failure.done_unix)
        p.plan, p.step, p.lost = plan.written_unix, plan.step, plan.lost

    def finish(self):
        if not self.report:
            return
        _say("in-place recovery " + self.phases.to_json())
        try:  # for ckpt-run, which reports the recovery to the controller
            self.members.write_phases(self.phases)
        except RuntimeError as e:
            _say(f"cannot record the phases of in-place recovery {self.phases.generation}: {e}")


class _Run:
    """One process of an in-place run: its state machine (_native.inplace.Machine, whose table is public), and the
    effects each state needs. run() calls on_start() once, then the handler of each state until training ends or
    the process leaves (os._exit: the failed group's threads may still wait on a dead peer)."""

    def __init__(self, launch, backend):
        self.launch, self.backend = launch, backend
        self.world = launch.world
        self.members = inplace.Membership(launch)
        self.mailbox = _Mailbox()
        self.machine = None
        self.rank = self.plan = self.secret = None
        self.store = None  # (the generation's store, the sockets before it) where this rank hosts it
        self.recovery = None
        self.group = None
        self.result = None

    @property
    def generation(self):
        return self.machine.generation

    def _leave(self, line, status=inplace.EXIT_PEER_LOST):
        if self.machine.state != _core.State.LEFT:
            self.machine.on(_core.Event.HANDED_OVER if status else _core.Event.UNNEEDED)
        _leave(line, status)

    def _absentees(self):
        """What this rank, as the host of the generation's store, dials for ranks that never checked in."""
        return _Absentees.of(self.members, self.plan, self.rank, self.store is not None, self.launch)

    def _replacements(self):
        """The mailboxes of the ranks new to this generation (its replacements, the processes most likely to be
        gone while it forms), which the join timer watches: (addr, port) each, as far as published."""
        if not _Absentees.dials(self.plan, self.launch):
            return []
        boxes = [_mailbox_of(self.members, r, self.plan) for r in sorted(self.plan.takeover) if r != self.rank]
        return [(b.addr, b.port) for b in boxes if b is not None]

    # ---- start ---------------------------------------------------------------------------------------------------

    def on_start(self, warm, kwargs):
        """A training rank enters generation 0 (rank 0 hosts its store and writes its plan); a spare warms up,
        registers as ready and waits for its claim, and leaves when training ends without it."""
        if self.launch.spare:
            self.machine = _core.Machine(_core.State.WAITING)
            self._wait_as_spare(warm, kwargs)
        else:
            self.machine = _core.Machine(_core.State.FORMING)
            _warm_up(warm, kwargs)
            self.rank = self.launch.rank
            if self.rank == 0:
                self.members.secret()  # made before generation 0's plan, which every other process waits for
                plan = _core.Plan()
                plan.world, plan.root = self.world, 0
                self.store = _store_master(plan)
                self.plan = self.members.write_plan(plan)
            else:
                # Rank 0's address is known only from its plan: polled, backing off from 5 ms to 1 s.
                self.plan = self.members.wait_plan(0, max(_PLAN_TIMEOUT_S, 120))
                if self.plan is None:
                    self._leave(f"rank {self.rank}: rank 0 did not start generation 0")
        # Rank 0 made the run's secret before generation 0's plan, which every process has seen by now: one read
        # each, not a creation race of every process in the shared dir at the job's start.
        self.secret = self.mailbox.secret = self.members.secret()

    def _wait_as_spare(self, warm, kwargs):
        took = _warm_up(warm, kwargs)
        slot = self.launch.slot
        if took is not None:
            _say(f"spare {slot}: warm in {took:.2f} s; ready")
        spare_box = inplace.SpareMailbox(inplace.address())
        self.members.register_spare(spare_box)
        got = self.members.wait_claim(spare_box)
        spare_box.close()
        if got is None:
            abandoned = self.members.records.marked("abandoned")
            self._leave(None, inplace.EXIT_PEER_LOST if abandoned else 0)  # the job's own lines say why
        claim, plan = got
        self.machine.on(_core.Event.CLAIMED, claim.generation)
        self.rank = claim.rank
        # Through the mailbox the plan came with the claim; a claim record precedes its plan record by a moment.
        self.plan = plan or self.members.wait_plan(claim.generation, _PLAN_TIMEOUT_S)
        if self.plan is None or self.plan.abandons:  # (the plan counts the rank the spare takes over as lost)
            self._leave(f"spare {slot}: no usable plan for generation {claim.generation}")
        _say(f"spare {slot} takes rank {self.rank} over (generation {claim.generation})")
        # Published now, not once the group formed: should this process die before it checks in, the store's host
        # finds its mailbox refusing and the generation gives up on it at once (_Absentees).
        self.mailbox.publish(self.members, self.rank, claim.generation)

    # ---- forming -------------------------------------------------------------------------------------------------

    def on_forming(self):
        _set_rank_env(self.rank, self.world, self.launch, self.generation)
        try:
            self.group = _Group(self.backend, self.plan, self.rank, self.secret, *(self.store or (None, None)),
                                keep_port=self.mailbox.port, on_stuck=self._on_training_stuck,
                                absentees=self._absentees(), watched=self._replacements)
        except (_JoinFailed, RuntimeError) as e:
            missing = e.missing if isinstance(e, _JoinFailed) else None
            self._on_join_failed(missing, e, why=f"generation {self.generation} did not form: {e}")
            return
        self.machine.on(_core.Event.FORMED)
        # The Checkpointer that train() makes watches the replacements while its heartbeat network forms: one that
        # died since the group formed is given up at once, not after the network's timeout (20 s).
        watch = ",".join(f"{addr}:{port}" for addr, port in self._replacements())
        if watch:
            os.environ[_ENV["inplace_watch"]] = watch
        else:
            os.environ.pop(_ENV["inplace_watch"], None)
        if self.recovery is not None:
            self.recovery.phases.group = time.time()
        self.mailbox.publish(self.members, self.rank, self.generation)
        _state["recovery"] = self.recovery
        _state["group"] = self.group
        _state["plan"] = self.plan if self.generation > 0 else None

    def _on_join_failed(self, missing, error, why):
        """Ranks went missing while the generation formed (or before its mesh did): plan the next one without them,
        hand over, or raise, as the core decides."""
        after = _core.after_join_failure(self.generation, missing)
        if after == _core.AfterJoinFailure.RAISE:
            self.machine.on(_core.Event.FAILED)
            raise error
        if after == _core.AfterJoinFailure.HAND_OVER:
            self.members.mark("abandoned", why, lost=missing or [])
            self._leave(f"rank {self.rank}: {why}; {_HANDING_OVER}")
        _say(f"rank {self.rank}: {why}")
        _abandon(self.store)
        failed_plan = self.plan
        self.machine.on(_core.Event.JOIN_FAILED)
        self._recover(_core.join_failure(failed_plan, missing, time.time()), failed_plan)

    # ---- training ------------------------------------------------------------------------------------------------

    def on_training(self, train, args, kwargs):
        error = None
        try:
            self.result = train(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - a dead peer surfaces as any error of the training code
            error = e
        self.group.train_ended()
        cp = _state["checkpointer"]
        lw = _last_words()
        if cp is not None and ((error is not None and lw.get("armed")) or lw.get("lost_peer")
                               or lw.get("counted_dead")):
            try:
                cp.abort()  # waits for the last words to end: they tell whether a peer died, and what was saved
            except Exception:  # noqa: BLE001 - the periodic checkpoint in flight failed with the group; said already
                pass
            lw = _last_words()
            _keep_memory_copies(cp)
        after = _core.after_train(self.generation, raised=error is not None,
                                  mesh_failed=error is not None and _MESH_FAILED in str(error),
                                  lost_peer=bool(lw.get("lost_peer")), counted_dead=bool(lw.get("counted_dead")),
                                  finished=self.members.finished)
        if after == _core.AfterTrain.RETURN:
            self.group.leave(failed=False)
            self.machine.on(_core.Event.RETURNED)
            if self.rank == 0:
                self.members.mark("finished")
            return
        if after == _core.AfterTrain.RAISE:
            self.group.leave(failed=True)
            self.machine.on(_core.Event.FAILED)
            raise error
        self.group.leave(failed=True)
        if after == _core.AfterTrain.LEAVE:
            self._leave(f"rank {self.rank}: the other ranks count this rank as dead; leaving")
        if after == _core.AfterTrain.ROLL_CALL:
            # A replacement died after the group formed, before the heartbeat mesh did: every live rank fails here
            # alike, and answers the roll call.
            missing = _missing(self.plan, self.rank, self.secret, self.store is not None, self._absentees())
            if not missing:
                self.machine.on(_core.Event.FAILED)
                raise error
            self._on_join_failed(missing, error,
                                 why=f"generation {self.generation} lost ranks {missing} before its first step")
            return
        # The failed train()'s frames hold what it made of the failed group (train_dp_tp's TP and DP subgroups)
        # through the error's traceback, and the traceback holds this frame, whose `error` holds it: a cycle that
        # only the garbage collector would break, at some later time. Until a failed gloo group is destroyed its
        # event loop spins on the shut sockets, a core per survivor (the next generation's steps took 1.3 to 2
        # times as long). The reaper destroys it now, off this thread.
        if error is not None:
            _abandon(error)
            error = None
        failed_plan = self.plan
        self.machine.on(_core.Event.PEER_LOST)
        self._recover(_peer_loss(), failed_plan)

    def _on_training_stuck(self, idle_s):
        """On the group's watchdog thread: train() cannot unwind after the peer loss (see training_stuck). The
        terminal checkpoint holds this rank's state; a requeue takes over now, not when the others give up."""
        why = (f"rank {self.rank}: training is stuck in a collective of generation {self.generation}: no CPU for "
               f"{idle_s:.1f} s after the peer loss (gloo does not fail a send in flight when its connection closes)")
        self.members.mark("abandoned", why, lost=_last_words().get("lost", []), alone=True)
        self._leave(f"{why}; {_HANDING_OVER}")

    # ---- recovering ----------------------------------------------------------------------------------------------

    def _recover(self, failure, current):
        """This rank's plan for the generation the machine entered, after `failure` of the one `current` planned;
        Forming again once it has one. Leaves the process when it cannot go on."""
        generation, rank = self.generation, self.rank
        if self.members.has_plan(generation + 1):
            # A rank that was frozen through a recovery and thaws now: the job went on without it.
            self._leave(f"rank {rank}: generation {generation + 1} runs already; this process is stale and leaves")
        role = _core.recovery_role(self.world, failure, rank, self.members.has_plan(generation))
        # The failed generation's store (where this rank hosted it) stays up until the plan is out: the other
        # survivors' roll call may still need it.
        store = None
        if role.writes_plan:
            plan, store = self._write_plan(failure, role.root)
        else:
            plan = _plan_of_tree(self.members, self.mailbox, self.generation, rank, role.sources, current)
        verdict = _core.verdict(plan, rank)
        if verdict == _core.Verdict.NO_PLAN:
            # the idle spares leave too
            self.members.mark("abandoned", f"no plan for generation {generation}", lost=failure.lost)
            self._leave(f"rank {rank}: no plan for generation {generation} within {_PLAN_TIMEOUT_S:g} s; "
                        f"{_HANDING_OVER}")
        if verdict == _core.Verdict.ABANDONED:
            self.mailbox.wait_taken(generation, len(role.children), 5)
            self._leave(f"rank {rank}: cannot recover in place ({plan.abandon}); {_HANDING_OVER}")
        if verdict == _core.Verdict.COUNTED_LOST:
            self._leave(f"rank {rank}: counted as lost by generation {generation}; leaving")
        if plan.shrinks:  # the lost ranks are dropped: this rank's place among the survivors, in a smaller world
            rank, self.world = _core.rank_after(plan, rank), plan.world
        self.rank, self.plan, self.store = rank, plan, store
        self.recovery = _Recovery(self.members, generation, failure, plan, report=rank == plan.root)
        if rank == plan.root:
            how = (f"no spare left: {plan.world} of {plan.world_before} data-parallel replicas go on "
                   f"({_ENV['shrink']})" if plan.shrinks
                   else f"spares {sorted(plan.takeover.values())} take them over")
            _say(f"in-place recovery {generation}: ranks {plan.lost} lost; {how}; resuming from " +
                 (f"step {plan.step}" if plan.step is not None else "the newest complete checkpoint"))
        self.machine.on(_core.Event.PLANNED)

    def _write_plan(self, failure, root):
        """At the recovery's root: a spare per lost rank, claimed, and the plan (with the new generation's store,
        hosted here); or a plan that abandons. Written to the records first (the record, and the fallback), then
        handed to the spares and posted for the survivors."""
        generation = self.generation
        cp = _state["checkpointer"]
        layout = cp._native.config["layout"] if cp is not None and cp.enabled else None
        plan = _core.plan_generation(generation, self.world, root, failure, self.members.free_spares(),
                                     shrink=self.launch.shrink, layout=layout)
        store = None
        if plan.abandons:
            self.members.mark("abandoned", plan.abandon, lost=failure.lost)
        else:
            store = _store_master(plan)
        claims = [(slot, r) for r, slot in sorted(plan.takeover.items())]
        plan = self.members.write_plan(plan, claims)
        missed = self.members.deliver_claims(plan, claims)
        if missed:
            _say(f"spares {missed} cannot be reached: they find their claim records")
        self.mailbox.post(generation, plan)
        return plan, store


def init_process_group(backend="gloo", alone=False, **kwargs):
    """dist.init_process_group from torchrun's variables or srun's: the rank and world size from RANK/WORLD_SIZE,
    else SLURM_PROCID/SLURM_NTASKS; MASTER_ADDR, when unset or empty, the first host of the step (where srun
    starts rank 0); MASTER_PORT, when unset, one derived from the job id. A world of one forms a group only with
    alone=True (on this host's loopback: nobody else joins). Returns (rank, world)."""
    world = int(os.environ.get(_ENV["world_size"], os.environ.get("SLURM_NTASKS", "1")))
    rank = int(os.environ.get(_ENV["rank"], os.environ.get("SLURM_PROCID", "0")))
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
    os.environ[_ENV["exit_grace"]] = "0s"  # this process leaves the failed group itself: the library must not end it
    dist.new_group = dist.distributed_c10d.new_group = _new_group_of_generation  # new_subgroups calls it too
    process = _Run(launch, backend)
    process.on_start(warm, kwargs)
    while process.machine.state != _core.State.FINISHED:
        if process.machine.state == _core.State.FORMING:
            process.on_forming()
        else:  # TRAINING: every other state is passed through within a handler, or leaves the process
            process.on_training(train, args, kwargs)
    return process.result
