"""slurm_ckpt.restart alone, on this host: the watchdog that shuts a generation's sockets acts on the loss its own
generation's Checkpointer reports, never on the previous one's; a stranger connected to a root's mailbox store
can neither steer nor stall a survivor's wait for the plan. Run by tests/integration/test_inplace_local.sh."""
import datetime
import math
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import torch.distributed as dist

from slurm_ckpt import inplace, restart

SECRET = secrets.token_bytes(32)


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
    def form(self):
        store, plan = restart._store_master(1)
        return restart._Group("gloo", dict(plan, generation=0), 0, SECRET, *store)

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
        self.plan = self.members.write_plan(1, {"world": 3, "addr": "127.0.0.1", "port": 1, "root": 0, "lost": [2],
                                                "step": 5, "takeover": {"2": "h3.0"}})
        self.stranger = dist.TCPStore(self.box.addr, self.box.port, None, False, datetime.timedelta(seconds=5))

    def tearDown(self):
        self.tmp.cleanup()

    def wait(self, timeout_s=3.0):
        current = {"generation": 0, "takeover": {}}
        return restart._plan_from_mailboxes(self.members, self.members.secret(), 1, 1, [0], current, timeout_s)

    def test_plan_is_signed_and_under_a_secret_name(self):
        self.box.post(1, self.plan)
        self.assertEqual(self.wait(), self.plan)
        with self.assertRaises(RuntimeError):  # the obvious name holds nothing
            self.stranger.wait(["plan/1"], datetime.timedelta(milliseconds=200))

    def test_stranger_keys_do_not_reach_the_survivor(self):
        forged = dict(self.plan, addr="10.6.6.6", port=6666)
        for name in ("plan/1", "taken/1", "plan/1/0"):
            self.stranger.set(name, inplace.seal(secrets.token_bytes(32), "plan/1", forged))
        self.box.post(1, self.plan)
        self.assertEqual(self.wait(), self.plan)

    def test_unsigned_plan_under_the_right_name_is_refused(self):
        # What a process listening on a dead root's port could serve: the right key (learnt somehow), no secret.
        label = "plan/1"
        forged = dict(self.plan, addr="10.6.6.6", port=6666)
        self.stranger.set(inplace.key(self.members.secret(), label), inplace.seal(b"x" * 32, label, forged))
        started = time.monotonic()
        self.assertEqual(self.wait(), self.plan)  # from the plan file, the record
        self.assertLess(time.monotonic() - started, 2.5)


class PlanTreeTest(unittest.TestCase):
    def test_every_survivor_once_within_the_fanout(self):
        for world, lost, root, fanout in ((4, [2], 0, 16), (24, [11], 8, 16), (1000, [5, 77], 3, 16),
                                          (7, [], 6, 2), (10, [0, 1], 2, 3)):
            survivors = [r for r in range(world) if r not in lost]
            parents, depth = {}, {root: 0}
            for r in survivors:
                parent, children = restart._plan_tree(world, lost, root, r, fanout)
                self.assertEqual(parent is None, r == root)
                self.assertLessEqual(len(children), fanout)
                for c in children:
                    self.assertNotIn(c, parents)
                    self.assertNotIn(c, lost)
                    parents[c] = r
            self.assertEqual(sorted(parents), sorted(r for r in survivors if r != root))
            for r in survivors:  # every survivor reaches the root, in log_fanout(N) hops
                hops, at = 0, r
                while at != root:
                    at, hops = parents[at], hops + 1
                self.assertLessEqual(hops, max(1, math.ceil(math.log(len(survivors), fanout))))

    def test_a_lost_rank_waits_on_the_root(self):
        self.assertEqual(restart._plan_tree(4, [2], 0, 2), (0, []))


class PlanRelayTest(unittest.TestCase):
    """Seven survivors, a fan-out of 2: the root posts the plan in its mailbox alone, and the others relay it."""

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
        self.plan = {"world": 8, "addr": "127.0.0.1", "port": 1, "root": 0, "lost": [3], "step": 5,
                     "takeover": {"3": "h9.0"}, "generation": 1, "written_unix": 1.0}

    def relay(self, survivors, fanout=2):
        got = {}

        def take(r):
            parent = restart._plan_tree(8, [3], 0, r, fanout)[0]
            got[r] = restart._plan_of_tree(self.members[r], self.boxes[r], 1, r, parent, 0,
                                           {"generation": 0, "takeover": {}}, 5.0)
        threads = [threading.Thread(target=take, args=(r,)) for r in survivors]
        for t in threads:
            t.start()
        self.boxes[0].post(1, self.plan)
        for t in threads:
            t.join()
        return got

    def test_plan_reaches_every_survivor_through_the_tree(self):
        survivors = [1, 2, 4, 5, 6, 7]
        started = time.monotonic()
        got = self.relay(survivors)
        self.assertLess(time.monotonic() - started, 0.9)  # no wait ran out: each took it from its parent
        self.assertEqual(got, {r: self.plan for r in survivors})
        # no plan file was written: rank 7 (parent 2, grandparent 1) had it from rank 2's mailbox
        self.assertFalse(self.members[0].has_plan(1))
        self.assertEqual(restart._plan_tree(8, [3], 0, 7, 2)[0], 2)

    def test_a_dead_parent_sends_its_children_to_the_root(self):
        # rank 1's process is gone (its port closed): its children 2 and 4 wait on the root instead
        self.boxes[1].store = None
        self.boxes.pop(1)
        time.sleep(0.1)
        got = self.relay([2, 4])
        self.assertEqual(got, {2: self.plan, 4: self.plan})


if __name__ == "__main__":
    unittest.main(verbosity=2)
