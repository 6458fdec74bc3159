"""The PyTorch helper, in one process: bitwise restore of model, optimizer, RNG and extras; a resumed loop ends
equal to an uninterrupted one; SIGTERM and the time limit stop the loop with a terminal checkpoint; bad settings
raise slurm_ckpt.Error with one "ckpt:" line. Run by tests/integration/test_torch_helper.sh."""
import json
import os
import random
import signal
import sys
import tempfile
import time
import unittest

import torch

import slurm_ckpt
import slurm_ckpt.torch as sct


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 32)
        self.bn = torch.nn.BatchNorm1d(32)  # buffers a forward pass changes
        self.drop = torch.nn.Dropout(0.2)   # consumes the RNG
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.bn(self.a(x)))))


def make(seed=0):
    torch.manual_seed(seed)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def train_step(model, opt, sched, cp, step, extra):
    x = torch.randn(16, 8)
    loss = model(x).pow(2).mean() + random.random() * 0  # python's RNG is part of the state too
    loss.backward()
    cp.before_update()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sched.step()
    extra["pos"] = step + 1
    return cp.after_step(step + 1)


def state_bytes(model, opt):
    parts = [t.detach().numpy().tobytes() for t in model.state_dict().values()]
    for entry in opt.state_dict()["state"].values():
        parts += [v.numpy().tobytes() for v in entry.values() if torch.is_tensor(v)]
    return b"".join(parts)


def manifest(root, step):
    with open(os.path.join(root, f"{step:012d}", "MANIFEST.json")) as f:
        return json.load(f)


class TorchHelperTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name

    def tearDown(self):
        self._tmp.cleanup()

    def test_restore_is_bitwise(self):
        model, opt, sched = make()
        extra = {"pos": 0, "sched": sched, "note": "hello"}
        cp = sct.Checkpointer(model, opt, extra=extra, dir=self.dir, interval="5steps", signals=False)
        self.assertEqual(cp.restore(), 0)
        for step in range(10):
            self.assertFalse(train_step(model, opt, sched, cp, step, extra))
            if step + 1 == 10:  # what the checkpoint of step 10 must hold
                saved = (state_bytes(model, opt), torch.get_rng_state().clone(), random.getstate(),
                         sched.state_dict(), opt.param_groups[0]["lr"])
        cp.close()
        self.assertEqual(cp.stats()["committed"], 2)

        model2, opt2, sched2 = make(seed=99)  # other weights, no optimizer state yet
        extra2 = {"pos": -1, "sched": sched2}
        torch.manual_seed(12345)
        random.seed(5)
        cp2 = sct.Checkpointer(model2, opt2, extra=extra2, dir=self.dir, interval="5steps", signals=False)
        self.assertEqual(cp2.restore(), 10)
        self.assertEqual(state_bytes(model2, opt2), saved[0])
        self.assertTrue(torch.equal(torch.get_rng_state(), saved[1]))
        self.assertEqual(random.getstate(), saved[2])
        self.assertEqual(sched2.state_dict(), saved[3])
        self.assertEqual(opt2.param_groups[0]["lr"], saved[4])
        self.assertEqual(extra2["pos"], 10)
        self.assertEqual(extra2["note"], "hello")
        cp2.close()

    def test_every_tensor_records_its_chunk_and_replica_group(self):
        """Whole tensors record their own shape as the global one; a declared split (chunks=) records the block's
        place, and the optimizer state of a split parameter the same; a block outside its tensor is refused."""
        model, opt, sched = make()
        split = {"a.weight": {"global_shape": [64, 8], "offset": [32, 0]}}  # rows 32..63 of a 64 x 8 weight
        cp = sct.Checkpointer(model, opt, dir=self.dir, interval="1steps", signals=False, chunks=split)
        self.assertEqual(cp.restore(), 0)
        train_step(model, opt, sched, cp, 0, {})
        cp.close()
        ranges = {s["name"]: s["meta"] for s in manifest(self.dir, 1)["shards"][0]["states"]}
        self.assertEqual(ranges["model/a.weight"]["global_shape"], [64, 8])
        self.assertEqual(ranges["model/a.weight"]["offset"], [32, 0])
        self.assertEqual(ranges["model/a.weight"]["shape"], [32, 8])
        self.assertEqual(ranges["model/b.weight"]["global_shape"], [4, 32])
        self.assertEqual(ranges["model/b.weight"]["offset"], [0, 0])
        exp_avg = [m for name, m in ranges.items() if name.startswith("optim/0/exp_avg")]
        self.assertEqual(len(exp_avg), 2)
        for m in exp_avg:  # parameter 0 is a.weight: its Adam state is split alike
            self.assertEqual((m["global_shape"], m["offset"]), ([64, 8], [32, 0]))
        self.assertTrue(all(m.get("replica_group") == "dp" for m in ranges.values() if "shape" in m))
        with self.assertRaises(Exception) as refused:
            sct.Checkpointer(model, opt, dir=self.dir + "/other", signals=False,
                             chunks={"a.weight": {"global_shape": [64, 8], "offset": [40, 0]}})
        self.assertIn("region 'model/a.weight': metadata: the block of shape [32,8] at 'offset' [40,0] lies outside "
                      "'global_shape' [64,8]", str(refused.exception))

    def test_resumed_loop_ends_equal(self):
        def run(steps, interrupt_at=None):
            model, opt, sched = make()
            extra = {"pos": 0, "sched": sched}
            cp = sct.Checkpointer(model, opt, extra=extra, dir=self.dir, interval="4steps", signals=False)
            start = cp.restore()
            for step in range(start, steps):
                train_step(model, opt, sched, cp, step, extra)
                if step + 1 == interrupt_at:
                    break
            cp.close()
            return start, state_bytes(model, opt)

        _, straight = run(20)
        for name in os.listdir(self.dir):  # start over in an empty dir
            if name[0].isdigit() or name == "latest":
                os.system(f"rm -rf '{os.path.join(self.dir, name)}'")
        torch.manual_seed(777)  # whatever the crashed process did to the RNG must not matter
        run(20, interrupt_at=10)
        start, resumed = run(20)
        self.assertEqual(start, 8)
        self.assertEqual(resumed, straight)

    def test_sigterm_stops_with_a_terminal_checkpoint(self):
        model, opt, sched = make()
        extra = {"pos": 0}
        cp = sct.Checkpointer(model, opt, extra=extra, dir=self.dir, interval="1000steps")
        cp.restore()
        stopped = None
        for step in range(50):
            if step == 6:
                os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it; the process lives on
            if train_step(model, opt, sched, cp, step, extra):
                stopped = step + 1
                break
        self.assertTrue(cp.after_step(8))  # stays stopped
        cp.close()
        self.assertEqual(stopped, 7)
        self.assertEqual(manifest(self.dir, 7)["kind"], "terminal")

    def test_time_limit_stops_with_a_terminal_checkpoint(self):
        model, opt, sched = make()
        extra = {"pos": 0}
        cp = sct.Checkpointer(model, opt, extra=extra, dir=self.dir, interval="1000steps", signals=False,
                              grace="100s", end_time=int(time.time()) + 101)
        cp.restore()
        t0 = time.time()
        stopped = None
        for step in range(100000):
            time.sleep(0.01)
            if train_step(model, opt, sched, cp, step, extra):
                stopped = step + 1
                break
        cp.close()
        self.assertIsNotNone(stopped)
        self.assertLess(time.time() - t0, 10)
        self.assertEqual(manifest(self.dir, stopped)["kind"], "terminal")

    def test_without_a_dir_nothing_happens(self):
        if os.environ.get("CKPT_DIR"):
            self.skipTest("CKPT_DIR is set")
        model, opt, sched = make()
        cp = sct.Checkpointer(model, opt)
        self.assertFalse(cp.enabled)
        self.assertEqual(cp.restore(), 0)
        self.assertFalse(train_step(model, opt, sched, cp, 0, {}))
        cp.close()

    def test_bad_input_raises_one_clear_line(self):
        model, opt, _ = make()
        with self.assertRaises(slurm_ckpt.Error) as e:
            sct.Checkpointer(model, opt, dir=self.dir, intervall="5m")
        self.assertTrue(str(e.exception).startswith("ckpt: unknown setting 'intervall'"))
        with self.assertRaises(slurm_ckpt.Error) as e:
            sct.Checkpointer(model, opt, dir=self.dir, interval="often")
        self.assertTrue(str(e.exception).startswith("ckpt: interval='often': expected"))
        self.assertIsInstance(e.exception, RuntimeError)
        cp = sct.Checkpointer(model, opt, dir=self.dir, interval="5steps", signals=False)
        cp.restore()
        self.assertFalse(cp.after_step(3))
        with self.assertRaises(slurm_ckpt.Error) as e:
            cp.after_step(2)
        self.assertEqual(str(e.exception), "ckpt: step 2 follows step 3: steps must increase")
        cp.close()

    def test_native_api(self):
        data = bytearray(b"x" * 1000)
        import ctypes

        buf = (ctypes.c_char * len(data)).from_buffer(data)
        cp = slurm_ckpt.Checkpointer(dir=self.dir, interval="1steps", signals=False)
        cp.register_host("raw", ctypes.addressof(buf), len(data), meta='{"k": 1}')
        cp.put_blob("tag", b"abc")
        self.assertEqual(cp.restore(), 0)
        self.assertEqual(cp.poll(1), (True, False, "periodic"))
        self.assertFalse(cp.after_step(1))
        cp.close()
        s = cp.stats()
        self.assertEqual((s["committed"], s["state_bytes"], s["blob_bytes"]), (1, 1000, 3))
        cp2 = slurm_ckpt.Checkpointer(dir=self.dir, signals=False)
        self.assertEqual(cp2.restore(copy_into_regions=False), 1)
        got = {name: (json.loads(meta), bytes(view)) for name, meta, view, _ in cp2.restored()}
        self.assertEqual(got["raw"], ({"k": 1}, b"x" * 1000))
        self.assertEqual(got["tag"][1], b"abc")
        cp2.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
