"""slurm_ckpt.inplace, the records of a recovery in place as Python sees them, alone (no torch, no Slurm): who is a
spare, claims, plans, the markers that release idle spares, the spares' claim mailboxes and their record fallback,
the back-off, and refusals of bad launcher input. The records' own rules are unit-tested in C++
(tests/unit/test_inplace.cpp). Run by tests/integration/test_inplace_local.sh."""
import itertools
import json
import os
import socket
import tempfile
import threading
import time
import unittest

from slurm_ckpt import _native, inplace

_core = _native.inplace


def plan_of(generation, world=4, lost=(), takeover=None):
    plan = _core.Plan()
    plan.generation, plan.world, plan.addr, plan.port = generation, world, "127.0.0.1", 1
    plan.lost, plan.takeover = list(lost), dict(takeover or {})
    return plan


class Counting:
    """A proxy that counts the calls of one method of `inner`."""

    def __init__(self, inner, name):
        self.inner, self.name, self.calls = inner, name, 0

    def __getattr__(self, attr):
        value = getattr(self.inner, attr)
        if attr != self.name:
            return value

        def counted(*args, **kwargs):
            self.calls += 1
            return value(*args, **kwargs)
        return counted


def env(root, **extra):
    e = {"CKPT_INPLACE_ID": "42.r0.7", "CKPT_INPLACE_WORLD": "4", "CKPT_DIR": root, "SLURMD_NODENAME": "n1",
         "SLURM_LOCALID": "0", "SLURM_PROCID": "1", "CKPT_INPLACE_RANK_BASE": "2"}
    e.update(extra)
    return e


class LaunchTest(unittest.TestCase):
    def test_rank_from_the_launcher(self):
        launch = inplace.Launch(env("/ck"))
        self.assertEqual((launch.rank, launch.world, launch.spare), (3, 4, False))
        self.assertEqual(launch.dir, "/ck/.control/inplace-42.r0.7")

    def test_spare_has_no_rank(self):
        launch = inplace.Launch(env("/ck", CKPT_INPLACE_SPARE="1", SLURMD_NODENAME="n9", SLURM_LOCALID="3"))
        self.assertTrue(launch.spare)
        self.assertIsNone(launch.rank)
        self.assertEqual(launch.slot, "n9.3")

    def test_not_under_the_launcher(self):
        self.assertIsNone(inplace.Launch.from_env({}))

    def test_hostile_id_is_refused(self):
        for bad in ("../../etc", ".hidden", "a/b", "x y"):
            with self.assertRaises(RuntimeError) as ctx:
                inplace.Launch(env("/ck", CKPT_INPLACE_ID=bad))
            self.assertIn("CKPT_INPLACE_ID", str(ctx.exception))

    def test_needs_a_checkpoint_dir(self):
        e = env("/ck")
        del e["CKPT_DIR"]
        with self.assertRaises(RuntimeError):
            inplace.Launch(e)


class MembershipTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()

    def members(self, slow_poll_s=0.05, **extra):
        return inplace.Membership(inplace.Launch(env(self.root, **extra)), poll_s=0.001, slow_poll_s=slow_poll_s)

    def test_dir_is_private(self):
        m = self.members()
        self.assertEqual(os.stat(m.dir).st_mode & 0o777, 0o700)

    def test_claimed_spares_are_not_free(self):
        a = self.members(CKPT_INPLACE_SPARE="1", SLURMD_NODENAME="n4")
        b = self.members(CKPT_INPLACE_SPARE="1", SLURMD_NODENAME="n5")
        a.register_spare()
        b.register_spare()
        root = self.members()
        self.assertEqual(root.free_spares(), ["n4.0", "n5.0"])
        plan = root.write_plan(plan_of(1, lost=[2], takeover={2: "n4.0"}), claims=[("n4.0", 2)])
        self.assertEqual(plan.generation, 1)
        self.assertGreater(plan.written_unix, 0)
        self.assertEqual(root.free_spares(), ["n5.0"])
        claim, through_mailbox = a.wait_claim()
        self.assertEqual((claim.generation, claim.rank, through_mailbox), (1, 2, None))
        self.assertEqual(root.wait_plan(1, 1).lost, [2])

    def test_plan_that_never_comes(self):
        t0 = time.monotonic()
        self.assertIsNone(self.members().wait_plan(3, 0.1))
        self.assertLess(time.monotonic() - t0, 2)

    def test_idle_spare_leaves_when_training_ends(self):
        spare = self.members(CKPT_INPLACE_SPARE="1")
        spare.register_spare()
        threading.Timer(0.05, lambda: self.members().mark("finished")).start()
        self.assertIsNone(spare.wait_claim())

    def test_a_torn_plan_is_not_read(self):
        m = self.members()
        with open(os.path.join(m.dir, "gen-1.plan"), "w") as f:
            f.write('{"generation": 1, "lost": [')  # a writer that crashed mid-write (never renamed in, in practice)
        self.assertIsNone(m.wait_plan(1, 0.05))

    def test_plan_poll_backs_off(self):
        m = self.members(slow_poll_s=0.1)
        m.records = reads = Counting(m.records, "read_plan")
        self.assertIsNone(m.wait_plan(3, 0.6))
        # 1, 2, 4 ... 64 ms, then 0.1 s: about a dozen looks in 0.6 s, not 600.
        self.assertGreater(reads.calls, 3)
        self.assertLess(reads.calls, 20)

    def test_slow_fallback_polls_once_per_interval(self):
        m = self.members(slow_poll_s=0.1)
        writer = self.members()
        threading.Timer(0.25, lambda: writer.write_plan(plan_of(4))).start()
        m.records = reads = Counting(m.records, "read_plan")
        self.assertEqual(m.wait_plan(4, 2, slow=True).generation, 4)
        self.assertLessEqual(reads.calls, 5)

    def test_phases_are_recorded(self):
        m = self.members()
        phases = _core.Phases()
        phases.generation, phases.detect, phases.first_step = 2, 1.0, 2.0
        m.write_phases(phases)
        with open(os.path.join(m.dir, "gen-2.phases")) as f:
            self.assertEqual(json.load(f)["first_step"], 2.0)
        self.assertEqual(m.records.read_phases(2).first_step, 2.0)


class SecretTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def members(self, **extra):
        return inplace.Membership(inplace.Launch(env(self.tmp.name, **extra)))

    def test_one_private_secret_for_every_process(self):
        a, b = self.members(), self.members(SLURM_PROCID="2")
        secret = a.secret()
        self.assertEqual(len(secret), 32)
        self.assertEqual(b.secret(), secret)
        st = os.stat(os.path.join(a.dir, "secret"))
        self.assertEqual(st.st_mode & 0o777, 0o600)
        self.assertEqual([n for n in os.listdir(a.dir) if n.endswith(".tmp")], [])

    def test_a_readable_or_short_secret_is_refused(self):
        m = self.members()
        path = os.path.join(m.dir, "secret")
        m.secret()
        os.chmod(path, 0o644)
        with self.assertRaisesRegex(RuntimeError, "private 32-byte"):
            m.secret()
        os.unlink(path)
        with open(path, "wb") as f:
            f.write(b"short")
        os.chmod(path, 0o600)
        with self.assertRaisesRegex(RuntimeError, "private 32-byte"):
            m.secret()

    def test_seal_needs_the_secret_and_the_label(self):
        secret, plan = b"s" * 32, plan_of(3).to_json().replace("127.0.0.1", "10.0.0.1")
        text = inplace.seal(secret, "plan/3", plan)
        self.assertEqual(inplace.unseal(secret, "plan/3", text), plan)
        self.assertIsNone(inplace.unseal(b"t" * 32, "plan/3", text))
        self.assertIsNone(inplace.unseal(secret, "plan/4", text))  # a replayed plan of another generation
        tampered = json.loads(text)
        tampered["body"] = tampered["body"].replace("10.0.0.1", "10.6.6.6")
        self.assertIsNone(inplace.unseal(secret, "plan/3", json.dumps(tampered)))
        for junk in ("", "[]", "{}", '{"body": 1, "mac": 2}', "\x00" * 10, json.dumps({"body": [], "mac": "x"})):
            self.assertIsNone(inplace.unseal(secret, "plan/3", junk))

    def test_keys_differ_by_secret_and_name(self):
        self.assertNotEqual(inplace.key(b"s" * 32, "plan/1"), inplace.key(b"t" * 32, "plan/1"))
        self.assertNotEqual(inplace.key(b"s" * 32, "plan/1"), inplace.key(b"s" * 32, "plan/2"))


class BackoffTest(unittest.TestCase):
    def test_doubles_up_to_the_longest(self):
        self.assertEqual(list(itertools.islice(inplace.backoff(0.005, 1.0), 10)),
                         [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0])

    def test_starting_at_the_longest_stays_there(self):
        self.assertEqual(list(itertools.islice(inplace.backoff(1.0, 1.0), 3)), [1.0, 1.0, 1.0])


class SpareMailboxTest(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()

    def members(self, slow_poll_s=0.05, **extra):
        return inplace.Membership(inplace.Launch(env(self.root, **extra)), poll_s=0.001, slow_poll_s=slow_poll_s)

    def spare(self, node, slow_poll_s):
        m = self.members(slow_poll_s=slow_poll_s, CKPT_INPLACE_SPARE="1", SLURMD_NODENAME=node)
        box = inplace.SpareMailbox("127.0.0.1")
        self.addCleanup(box.close)
        m.register_spare(box)
        return m, box

    def claim_in_thread(self, spare, box):
        got = {}
        t = threading.Thread(target=lambda: got.update(claim=spare.wait_claim(box), at=time.monotonic()))
        t.start()
        return t, got

    def test_claim_and_plan_come_through_the_mailbox(self):
        spare, box = self.spare("n4", slow_poll_s=30)  # a file poll would take 30 s: this one must not wait
        t, got = self.claim_in_thread(spare, box)
        root = self.members()
        plan = root.write_plan(plan_of(1, lost=[2], takeover={2: "n4.0"}), claims=[("n4.0", 2)])
        t0 = time.monotonic()
        self.assertEqual(root.deliver_claims(plan, [("n4.0", 2)]), [])
        t.join(5)
        self.assertFalse(t.is_alive())
        self.assertLess(got["at"] - t0, 2)
        claim, through_mailbox = got["claim"]
        self.assertEqual((claim.generation, claim.rank), (1, 2))
        self.assertEqual(through_mailbox.to_json(), plan.to_json())

    def test_a_claim_message_is_checked(self):
        plan = plan_of(2).to_json()
        self.assertIsNone(inplace.claim_of({"generation": "2", "rank": 1}))
        self.assertIsNone(inplace.claim_of({"generation": 2, "rank": -1}))
        self.assertIsNone(inplace.claim_of(["not", "a", "claim"]))
        claim, carried = inplace.claim_of({"generation": 2, "rank": 1, "plan": "{"})
        self.assertEqual((claim.rank, carried), (1, None))  # a plan that does not parse: the record is read
        _, carried = inplace.claim_of({"generation": 3, "rank": 1, "plan": plan})
        self.assertIsNone(carried)  # a plan of another generation than the claim's
        _, carried = inplace.claim_of({"generation": 2, "rank": 1, "plan": plan})
        self.assertEqual(carried.generation, 2)

    def test_unreachable_mailbox_leaves_the_claim_file(self):
        spare, box = self.spare("n4", slow_poll_s=0.05)
        box.close()  # the root cannot reach it
        root = self.members()
        plan = root.write_plan(plan_of(2, lost=[1], takeover={1: "n4.0"}), claims=[("n4.0", 1)])
        self.assertEqual(root.deliver_claims(plan, [("n4.0", 1)]), ["n4.0"])
        claim, through_mailbox = spare.wait_claim()
        self.assertEqual((claim.generation, claim.rank, through_mailbox), (2, 1, None))

    def test_a_message_without_the_token_is_ignored(self):
        _, box = self.spare("n4", slow_poll_s=0.05)
        forged = dict(box.address, token="0" * 32)
        self.assertTrue(inplace.send_to_spare(forged, {"generation": 1, "rank": 0}))
        with socket.create_connection(("127.0.0.1", box.address["port"])) as c:
            c.sendall(b"not json\n")
        self.assertIsNone(box.receive(0.3))
        self.assertTrue(inplace.send_to_spare(box.address, {"generation": 1, "rank": 3}))
        self.assertEqual(box.receive(2), {"generation": 1, "rank": 3})

    def test_hostile_bytes_leave_the_mailbox_ready(self):
        """Deep nesting (RecursionError in json), an endless line, a drip and non-UTF-8: each is dropped within
        the per-connection bound, nothing raises, and the next real claim still comes through."""
        _, box = self.spare("n4", slow_poll_s=0.05)
        port = box.address["port"]
        payloads = [b"[" * 5000 + b"\n", b"{\"a\":" * 3000 + b"1\n", b"\xff\xfe" * 1000 + b"\n",
                    b"x" * (inplace._MESSAGE_MAX + 65536)]
        for payload in payloads:
            with socket.create_connection(("127.0.0.1", port)) as c:
                try:
                    c.sendall(payload)
                except OSError:  # the spare may close an oversized line before it is all sent
                    pass
                t0 = time.monotonic()
                self.assertIsNone(box.receive(1.0))
                self.assertLess(time.monotonic() - t0, 1.5)
        drip = socket.create_connection(("127.0.0.1", port))
        self.addCleanup(drip.close)

        def dribble():
            for b in b'{"token": "' * 20:
                try:
                    drip.send(bytes([b]))
                except OSError:
                    return
                time.sleep(0.05)
        threading.Thread(target=dribble, daemon=True).start()
        t0 = time.monotonic()
        self.assertIsNone(box.receive(0.6))  # one byte every 50 ms: dropped at the bound, not held for ever
        self.assertLess(time.monotonic() - t0, 1.0)
        self.assertTrue(inplace.send_to_spare(box.address, {"generation": 2, "rank": 1}))
        self.assertEqual(box.receive(2), {"generation": 2, "rank": 1})

    def test_bounded_parse(self):
        self.assertEqual(inplace.parse_bounded(b'{"a": [1, {"b": "[[[["}]}'), {"a": [1, {"b": "[[[["}]})
        self.assertIsNone(inplace.parse_bounded("[" * 100 + "]" * 100))
        self.assertIsNone(inplace.parse_bounded(b"\xff"))
        self.assertIsNone(inplace.parse_bounded(b" " * (inplace._MESSAGE_MAX + 1)))
        secret = b"s" * 32
        self.assertIsNone(inplace.unseal(secret, "plan", json.dumps({"body": "[" * 9000, "mac": "x"})))

    def test_idle_spare_with_a_mailbox_leaves_when_training_ends(self):
        spare, box = self.spare("n4", slow_poll_s=0.05)
        threading.Timer(0.05, lambda: self.members().mark("abandoned")).start()
        self.assertIsNone(spare.wait_claim(box))

    def test_rank_mailbox_is_published(self):
        m = self.members()
        self.assertIsNone(m.mailbox(2))
        m.publish_mailbox(2, 1, "10.0.0.7", 4242)
        box = m.mailbox(2)
        self.assertEqual((box.rank, box.generation, box.addr, box.port, box.pid), (2, 1, "10.0.0.7", 4242, os.getpid()))
        self.assertEqual(m.free_spares(), [])


if __name__ == "__main__":
    unittest.main(verbosity=2)
