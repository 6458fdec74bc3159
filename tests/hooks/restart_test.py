"""slurm_ckpt.restart alone, on this host: the watchdog that shuts a generation's sockets acts on the loss its own
generation's Checkpointer reports, never on the previous one's; a stranger connected to a root's mailbox store
can neither steer nor stall a survivor's wait for the plan. Run by tests/integration/test_inplace_local.sh."""
import datetime
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import torch.distributed as dist

from slurm_ckpt import _native, inplace, restart

_core = _native.inplace
SECRET = secrets.token_bytes(32)


def plan_of(generation, world, lost=(), takeover=None, step=None):
    plan = _core.Plan()
    plan.generation, plan.world, plan.addr, plan.port, plan.root = generation, world, "127.0.0.1", 1, 0
    plan.lost, plan.takeover, plan.step = list(lost), dict(takeover or {}), step
    return plan


def failed_generation():
    """What a survivor knows of the generation that failed (0, no takeover)."""
    return plan_of(0, 1)


class FakeCheckpointer:
    """What the watchdog reads: `enabled` and the native last_words() report."""

    def __init__(self, report):
        self.enabled = True
        self.calls = 0
        outer = self

        class Native:
            def last_words(self):
                outer.calls += 1
                return report
        self._native = Native()


def wait_until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


class WatchdogTest(unittest.TestCase):
    def form(self, on_stuck=None):
        plan = plan_of(0, 1)
        store = restart._store_master(plan)
        return restart._Group("gloo", plan, 0, SECRET, *store, on_stuck=on_stuck)

    def test_previous_generation_loss_does_not_shut_the_new_group(self):
        stale = FakeCheckpointer({"armed": True, "lost_peer": True, "lost": [1]})
        restart._state["checkpointer"] = stale  # what the generation that just failed left behind
        group = self.form()
        try:
            time.sleep(0.3)  # 15 watchdog turns: a host too loaded to run train() that soon
            self.assertEqual(stale.calls, 0)
            self.assertTrue(group._watch.is_alive())
        finally:
            group.leave(failed=False)

    def test_group_keys_are_under_a_secret_prefix(self):
        group = self.form()
        try:
            stranger = dist.TCPStore(inplace.address(), group.store_port, None, False, datetime.timedelta(seconds=5))
            with self.assertRaises(RuntimeError):  # where torch alone would keep it
                stranger.wait(["joined/0"], datetime.timedelta(milliseconds=200))
            stranger.wait([inplace.key(SECRET, "store/0") + "/joined/0"], datetime.timedelta(seconds=1))
        finally:
            group.leave(failed=False)

    def test_this_generation_loss_shuts_the_group(self):
        group = self.form()
        try:
            self.assertTrue(group._watch.is_alive())
            current = FakeCheckpointer({"armed": True, "lost_peer": True, "lost": [1]})
            restart.note_checkpointer(current)  # as train()'s Checkpointer does
            self.assertTrue(wait_until(lambda: not group._watch.is_alive()))
            self.assertGreater(current.calls, 0)
        finally:
            group.leave(failed=True)
            restart._state["checkpointer"] = None


    def lose_peer_while(self, train):
        """The group's peer is lost and the last words are done while this thread (the one that formed the group,
        as run()'s does) runs `train`; the idle times the watchdog reported stuck."""
        stuck = []
        group = self.form(on_stuck=stuck.append)
        try:
            restart.note_checkpointer(FakeCheckpointer({"armed": True, "lost_peer": True, "lost": [1], "done": True}))
            train()
            group.train_ended()
            time.sleep(0.5)  # the watchdog's turns after train() returned
            return stuck
        finally:
            group.leave(failed=True)
            restart._state["checkpointer"] = None

    def test_a_thread_blocked_after_the_loss_is_stuck(self):
        stuck = self.lose_peer_while(lambda: time.sleep(restart._core.STUCK_IDLE_S + 2))  # blocked, no CPU
        self.assertEqual(len(stuck), 1)
        self.assertGreaterEqual(stuck[0], restart._core.STUCK_IDLE_S)

    def test_a_thread_that_computes_or_returns_is_not_stuck(self):
        def compute():
            deadline = time.monotonic() + restart._core.STUCK_IDLE_S + 2
            while time.monotonic() < deadline:
                sum(range(1000))
        self.assertEqual(self.lose_peer_while(compute), [])
        self.assertEqual(self.lose_peer_while(lambda: None), [])


class ReaperTest(unittest.TestCase):
    def test_exit_waits_for_the_destructor_in_progress(self):
        # A daemon thread still inside a C++ destructor when the interpreter finalizes aborts the process as it
        # takes the GIL back: exit must wait for the reaper's destruction in progress.
        code = (
            "import sys, time\n"
            "from slurm_ckpt import restart\n"
            "class Slow:\n"
            "    def __del__(self):\n"
            "        time.sleep(0.5)\n"
            "        open(sys.argv[1], 'w').write('destroyed')\n"
            "restart._abandon(Slow())\n"
            "time.sleep(0.1)\n")
        with tempfile.TemporaryDirectory() as tmp:
            marker = os.path.join(tmp, "marker")
            done = subprocess.run([sys.executable, "-c", code, marker], timeout=60)
            self.assertEqual(done.returncode, 0)
            self.assertTrue(os.path.exists(marker))


class MailboxTest(unittest.TestCase):
    """The root posts plan 1 in its mailbox store; survivor rank 1 waits there."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        env = {"CKPT_INPLACE_ID": "7.r0.1", "CKPT_INPLACE_WORLD": "3", "CKPT_DIR": self.tmp.name,
               "SLURMD_NODENAME": "h0", "SLURM_PROCID": "0", "CKPT_INPLACE_RANK_BASE": "0"}
        self.members = inplace.Membership(inplace.Launch(env), slow_poll_s=0.05)
        self.box = restart._Mailbox(self.members.secret())
        self.members.publish_mailbox(0, 0, self.box.addr, self.box.port)
        self.plan = self.members.write_plan(plan_of(1, 3, lost=[2], takeover={2: "h3.0"}, step=5))
        self.stranger = dist.TCPStore(self.box.addr, self.box.port, None, False, datetime.timedelta(seconds=5))

    def tearDown(self):
        self.tmp.cleanup()

    def wait(self, timeout_s=3.0):
        plan = restart._plan_from_mailboxes(self.members, self.members.secret(), 1, 1, [0], failed_generation(),
                                            timeout_s)
        return plan.to_json() if plan is not None else None

    def test_plan_is_signed_and_under_a_secret_name(self):
        self.box.post(1, self.plan)
        self.assertEqual(self.wait(), self.plan.to_json())
        with self.assertRaises(RuntimeError):  # the obvious name holds nothing
            self.stranger.wait(["plan/1"], datetime.timedelta(milliseconds=200))

    def test_stranger_keys_do_not_reach_the_survivor(self):
        forged = self.plan.to_json().replace("127.0.0.1", "10.6.6.6")
        for name in ("plan/1", "taken/1", "plan/1/0"):
            self.stranger.set(name, inplace.seal(secrets.token_bytes(32), "plan/1", forged))
        self.box.post(1, self.plan)
        self.assertEqual(self.wait(), self.plan.to_json())

    def test_unsigned_plan_under_the_right_name_is_refused(self):
        # What a process listening on a dead root's port could serve: the right key (learnt somehow), no secret.
        label = "plan/1"
        forged = self.plan.to_json().replace("127.0.0.1", "10.6.6.6")
        self.stranger.set(inplace.key(self.members.secret(), label), inplace.seal(b"x" * 32, label, forged))
        started = time.monotonic()
        self.assertEqual(self.wait(), self.plan.to_json())  # from the plan record
        self.assertLess(time.monotonic() - started, 2.5)


class PlanRelayTest(unittest.TestCase):
    """Seven survivors of eight ranks in groups of two (the tree of ckpt/overlay.hpp, unit-tested in
    tests/unit/test_inplace.cpp): the root posts the plan in its mailbox alone, and the others relay it down."""

    GROUP = 2

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.members = {}
        self.boxes = {}
        for r in range(8):
            env = {"CKPT_INPLACE_ID": "7.r0.2", "CKPT_INPLACE_WORLD": "8", "CKPT_DIR": self.tmp.name,
                   "SLURMD_NODENAME": f"h{r}", "SLURM_PROCID": "0", "CKPT_INPLACE_RANK_BASE": str(r)}
            self.members[r] = inplace.Membership(inplace.Launch(env), slow_poll_s=0.05)
            self.boxes[r] = restart._Mailbox(self.members[r].secret())
            self.members[r].publish_mailbox(r, 0, self.boxes[r].addr, self.boxes[r].port)
        self.plan = plan_of(1, 8, lost=[3], takeover={3: "h9.0"}, step=5)
        self.failure = _core.Failure()
        self.failure.lost, self.failure.root = [3], 0

    def role(self, r):
        return _core.recovery_role(8, self.failure, r, False, group_size=self.GROUP)

    def relay(self, survivors):
        got = {}

        def take(r):
            plan = restart._plan_of_tree(self.members[r], self.boxes[r], 1, r, self.role(r).sources,
                                         failed_generation(), 5.0)
            got[r] = plan.to_json() if plan is not None else None
        threads = [threading.Thread(target=take, args=(r,)) for r in survivors]
        for t in threads:
            t.start()
        self.boxes[0].post(1, self.plan)
        for t in threads:
            t.join()
        return got

    def test_plan_reaches_every_survivor_through_the_tree(self):
        survivors = [1, 2, 4, 5, 6, 7]
        self.assertEqual(self.role(7).sources, [6, 0])  # rank 7 hears from 6, which hears from 2, then the root
        self.assertEqual(self.role(6).sources, [2, 0])
        started = time.monotonic()
        got = self.relay(survivors)
        self.assertLess(time.monotonic() - started, 0.9)  # no wait ran out: each took it from its parent
        self.assertEqual(got, {r: self.plan.to_json() for r in survivors})
        self.assertFalse(self.members[0].has_plan(1))  # no plan record was written: it came down the tree

    def test_a_dead_parent_sends_its_children_to_the_root(self):
        # rank 2's process is gone (its port closed): its children 6 (and, below it, 7) wait on the root instead
        self.boxes[2].store = None
        self.boxes.pop(2)
        time.sleep(0.1)
        got = self.relay([6, 7])
        self.assertEqual(got, {6: self.plan.to_json(), 7: self.plan.to_json()})


class RollCallTest(unittest.TestCase):
    """Generation 1 of three ranks, rank 0 hosting its store, rank 2 never checking in: the host gives up on it at
    once where its mailbox refuses (its process is gone), and waits out the timeouts where it accepts (a rank that
    may only be slow); either way ranks 0 and 1 end the roll call with the same verdict."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.members, self.boxes = {}, {}
        for r in range(3):
            env = {"CKPT_INPLACE_ID": "8.r0.1", "CKPT_INPLACE_WORLD": "3", "CKPT_DIR": self.tmp.name,
                   "SLURMD_NODENAME": f"h{r}", "SLURM_PROCID": "0", "CKPT_INPLACE_RANK_BASE": str(r)}
            self.members[r] = inplace.Membership(inplace.Launch(env))
            self.boxes[r] = restart._Mailbox(self.members[r].secret())
            self.members[r].publish_mailbox(r, 0, self.boxes[r].addr, self.boxes[r].port)
        self.plan = plan_of(1, 3)
        self.master, _ = restart._store_master(self.plan)
        timeout = restart._JOIN_TIMEOUT
        restart._JOIN_TIMEOUT = datetime.timedelta(seconds=3)
        self.addCleanup(setattr, restart, "_JOIN_TIMEOUT", timeout)

    def join_and_call_roll(self):
        """Ranks 0 (the host) and 1 check in and, once that failed, call the roll: {rank: (why, missing)}."""
        got = {}

        def rank(r):
            hosts = r == 0
            client = self.master if hosts else dist.TCPStore(self.plan.addr, self.plan.port, None, False,
                                                             datetime.timedelta(seconds=10))
            store = restart._keyspace(SECRET, 1, client)
            absentees = restart._Absentees.of(self.members[r], self.plan, r, hosts, self.members[r].launch)
            try:
                restart._await_all(store, "joined", r, 3, hosts, absentees)
                why = None
            except RuntimeError as e:
                why = str(e)
            got[r] = (why, restart._missing(self.plan, r, SECRET, hosts, absentees))
        threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return got

    def test_a_rank_whose_mailbox_refuses_is_given_up_at_once(self):
        self.boxes[2].store = None  # rank 2's process is gone: its mailbox's port is closed
        started = time.monotonic()
        got = self.join_and_call_roll()
        self.assertLess(time.monotonic() - started, 2.5)  # within the join timeout, not after it
        gone = "ranks [2] are gone: their mailboxes refuse connections"
        self.assertEqual(got, {0: (gone, [2]), 1: (gone, [2])})

    def test_a_rank_whose_mailbox_accepts_is_waited_for(self):
        started = time.monotonic()
        got = self.join_and_call_roll()
        self.assertGreaterEqual(time.monotonic() - started, 3 + 5)  # the join timeout, then the roll call's
        late = "not every rank joined within 3 s"
        self.assertEqual(got, {0: (late, [2]), 1: (late, [2])})


if __name__ == "__main__":
    unittest.main(verbosity=2)
