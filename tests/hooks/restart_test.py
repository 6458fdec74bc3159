"""slurm_ckpt.restart alone, on this host: the watchdog that shuts a generation's sockets acts on the loss its own
generation's Checkpointer reports, never on the previous one's; a stranger connected to a root's mailbox store
can neither steer nor stall a survivor's wait for the plan. Run by tests/integration/test_inplace_local.sh."""
import datetime
import secrets
import tempfile
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
        return restart._plan_from_root(self.members, self.members.secret(), 1, 1, 0, current, timeout_s)

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
