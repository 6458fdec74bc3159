"""slurm_ckpt.inplace, the files of a recovery in place, alone (no torch, no Slurm): who is a spare, claims,
plans, the markers that release idle spares, and refusals of bad launcher input. Run by
tests/integration/test_inplace_local.sh."""
import json
import os
import tempfile
import threading
import time
import unittest

from slurm_ckpt import inplace


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

    def members(self, **extra):
        return inplace.Membership(inplace.Launch(env(self.root, **extra)), poll_s=0.001)

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
        plan = root.write_plan(1, {"world": 4, "lost": [2], "takeover": {"2": "n4.0"}}, claims=[("n4.0", 2)])
        self.assertEqual(plan["generation"], 1)
        self.assertEqual(root.free_spares(), ["n5.0"])
        self.assertEqual(a.wait_claim(), {"generation": 1, "rank": 2})
        self.assertEqual(root.wait_plan(1, 1)["lost"], [2])

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

    def test_phases_are_recorded(self):
        m = self.members()
        m.write_phases(2, {"generation": 2, "detect": 1.0, "first_step": 2.0})
        with open(os.path.join(m.dir, "gen-2.phases")) as f:
            self.assertEqual(json.load(f)["first_step"], 2.0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
