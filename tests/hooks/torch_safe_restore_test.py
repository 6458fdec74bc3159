"""What a checkpoint holds cannot make the restore run code, and last words know a DDP job's layout. Run by
tests/integration/test_torch_safe_restore.sh.

- A checkpoint whose extras or optimizer state is a pickle naming os.system (directly, or hidden in a tensor
  storage of the earlier format) is refused with one "ckpt:" line, the command never runs and the model is left
  as it was.
- Extras round-trip (RNG states, NumPy state, tensors, an LR scheduler, plain values); extras written in the
  earlier format (plain pickles) still restore; a value whose restore would need code is refused when saved.
- A DistributedDataParallel model declares dp=<world> by itself (last words armed, no warning); a plain model
  with last words on and no layout gets one warning, from rank 0 only."""
import ctypes
import os
import pickle
import random
import subprocess
import sys
import tempfile
import unittest

import numpy
import torch

import slurm_ckpt
import slurm_ckpt.torch as sct


def make(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def train(model, opt, cp, steps, start=0):
    for step in range(start, start + steps):
        model(torch.randn(3, 4)).pow(2).mean().backward()
        cp.before_update()
        opt.step()
        opt.zero_grad(set_to_none=True)
        cp.after_step(step + 1)


def weights(model):
    return [t.clone() for t in model.state_dict().values()]


class Payload:
    """Runs a shell command when unpickled."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class HiddenInStorage:
    """The earlier format's tensor storage: torch.storage._load_from_bytes(<a legacy torch.save of Payload>)."""

    def __init__(self, command):
        import io

        buf = io.BytesIO()
        torch.save(Payload(command), buf, _use_new_zipfile_serialization=False)
        self.data = buf.getvalue()

    def __reduce__(self):
        return (torch.storage._load_from_bytes, (self.data,))


class Planting(sct.Checkpointer):
    """Saves `blob` in place of one of the helper's own blobs."""

    def __init__(self, *args, name, blob, **kwargs):
        self.plant = (name, blob)
        super().__init__(*args, **kwargs)

    def _put_extras(self, step):
        super()._put_extras(step)
        self._native.put_blob(*self.plant)


class SafeRestore(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = os.path.join(self.tmp.name, "ck")
        self.marker = os.path.join(self.tmp.name, "ran")

    def tearDown(self):
        self.tmp.cleanup()

    def planted(self, name, blob_of):
        model, opt = make()
        cp = Planting(model, opt, dir=self.root, interval="1000steps", name=name, blob=blob_of(3))
        train(model, opt, cp, 3)
        cp.save(3)
        cp.close()

    def assert_refused(self, what):
        model, opt = make(seed=1)
        before = weights(model)
        cp = sct.Checkpointer(model, opt, dir=self.root, interval="1000steps")
        with self.assertRaises(slurm_ckpt.Error) as caught:
            cp.restore()
        message = str(caught.exception)
        self.assertTrue(message.startswith("ckpt: refusing the checkpoint of step 3"), message)
        self.assertIn(what, message)
        self.assertNotIn("\n", message)
        self.assertFalse(os.path.exists(self.marker), "the planted command ran")
        for a, b in zip(before, weights(model)):
            self.assertTrue(torch.equal(a, b), "a refused checkpoint changed the model")
        cp.close()

    def test_extras_naming_os_system_are_refused(self):
        cmd = f"touch {self.marker}"
        self.planted("extra", lambda step: pickle.dumps({"step": step, "rng": None, "user": Payload(cmd)}))
        self.assert_refused("system")

    def test_optimizer_state_naming_os_system_is_refused(self):
        cmd = f"touch {self.marker}"
        self.planted("optim.meta", lambda step: pickle.dumps({"state": Payload(cmd), "param_groups": []}))
        self.assert_refused("optimizer state")

    def test_code_hidden_in_an_earlier_format_tensor_is_refused(self):
        cmd = f"touch {self.marker}"
        self.planted("extra", lambda step: pickle.dumps({"step": step, "rng": HiddenInStorage(cmd), "user": None}))
        self.assert_refused("system")

    def test_a_manifest_shape_larger_than_its_bytes_allocates_nothing(self):
        """A region whose manifest claims 64 GiB over 4 bytes, or names no dtype, is refused before any tensor is
        made of it (it once allocated the manifest's shape first, then compared sizes)."""
        view = memoryview(bytearray(4))
        address = ctypes.addressof(ctypes.c_char.from_buffer(bytearray(4)))
        for meta in ({"dtype": "float32", "shape": [2 ** 34]}, {"dtype": "float32", "shape": [2 ** 40, 2 ** 40]},
                     {"dtype": "load", "shape": [1]}, {"dtype": "float32", "shape": [-1]},
                     {"dtype": "float32", "shape": "4"}, {"dtype": "float32", "shape": [True]}, ["float32"]):
            with self.subTest(meta=meta):
                with self.assertRaises(slurm_ckpt.Error):
                    sct._tensor_from((meta, view, address))
        self.assertEqual(sct._tensor_from(({"dtype": "float32", "shape": [1]}, view, address)).shape, (1,))

    def test_extras_round_trip(self):
        model, opt = make()
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=100)  # keeps a method in its state
        extra = {"sched": sched, "pos": 0, "name": "run", "mask": torch.arange(5) % 2 == 0,
                 "table": numpy.arange(6, dtype=numpy.float32).reshape(2, 3), "seen": {1, 2}, "pair": (1.5, None)}
        cp = sct.Checkpointer(model, opt, extra=extra, dir=self.root, interval="1000steps")
        train(model, opt, cp, 3)
        sched.step()
        extra["pos"] = 3
        numpy.random.seed(7)
        random.seed(9)
        torch.manual_seed(11)
        cp.save(3)
        expected = (torch.rand(3), random.random(), numpy.random.rand(), weights(model), sched.state_dict()["_step_count"])
        cp.close()

        model2, opt2 = make(seed=5)
        sched2 = torch.optim.lr_scheduler.OneCycleLR(opt2, max_lr=0.1, total_steps=100)
        extra2 = {"sched": sched2}
        cp2 = sct.Checkpointer(model2, opt2, extra=extra2, dir=self.root, interval="1000steps")
        self.assertEqual(cp2.restore(), 3)
        self.assertTrue(torch.equal(torch.rand(3), expected[0]))
        self.assertEqual(random.random(), expected[1])
        self.assertEqual(numpy.random.rand(), expected[2])
        for a, b in zip(weights(model2), expected[3]):
            self.assertTrue(torch.equal(a, b))
        self.assertEqual(sched2.state_dict()["_step_count"], expected[4])
        self.assertEqual(extra2["pos"], 3)
        self.assertEqual(extra2["name"], "run")
        self.assertTrue(torch.equal(extra2["mask"], torch.arange(5) % 2 == 0))
        self.assertTrue(numpy.array_equal(extra2["table"], numpy.arange(6, dtype=numpy.float32).reshape(2, 3)))
        self.assertEqual(extra2["seen"], {1, 2})
        self.assertEqual(extra2["pair"], (1.5, None))
        cp2.close()

    def test_earlier_format_still_restores(self):
        # What the helper wrote before: plain pickles, tensors through torch's storage pickling.
        def earlier(step):
            return pickle.dumps({"step": step, "rng": sct._rng_state(), "user": {"pos": step}}, protocol=4)

        model, opt = make()
        cp = Planting(model, opt, dir=self.root, interval="1000steps", name="extra", blob=None)
        cp.plant = ("extra", None)
        train(model, opt, cp, 3)
        torch.manual_seed(4)
        cp.plant = ("extra", earlier(3))
        cp.save(3)
        expected = torch.rand(2)
        cp.close()
        model2, opt2 = make(seed=5)
        extra2 = {}
        cp2 = sct.Checkpointer(model2, opt2, extra=extra2, dir=self.root, interval="1000steps")
        self.assertEqual(cp2.restore(), 3)
        self.assertTrue(torch.equal(torch.rand(2), expected))
        self.assertEqual(extra2["pos"], 3)
        cp2.close()

    def test_a_value_that_needs_code_is_refused_when_saved(self):
        model, opt = make()
        cp = sct.Checkpointer(model, opt, extra={"bad": Payload("true")}, dir=self.root, interval="1000steps")
        with self.assertRaises(slurm_ckpt.Error) as caught:
            cp.save(1)
        self.assertIn("cannot save a", str(caught.exception))
        cp.close()


def ddp_rank(rank, port, root, wrap):
    """One rank of a two-rank gloo job; prints the layout its checkpointer resolved."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model, opt = make()
    if wrap:
        model = torch.nn.parallel.DistributedDataParallel(model)
    cp = sct.Checkpointer(model, opt, dir=root, interval="1000steps", rank=rank, world_size=2, last_words=True,
                          run_id=f"ddp{int(wrap)}", log="info")
    c = cp.config
    print(f"layout_declared={c['layout_declared']} dp={c['layout']['dp']} coord_dp={c['coord']['dp']}", flush=True)
    cp.close()
    dist.destroy_process_group()


class DdpLayout(unittest.TestCase):
    def run_job(self, wrap):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory() as tmp:
            procs = [subprocess.Popen([sys.executable, __file__, "ddp-rank", str(r), str(port), tmp, str(int(wrap))],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
            outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        return outs

    def test_ddp_declares_data_parallel_layout(self):
        outs = self.run_job(wrap=True)
        for rank, (out, err) in enumerate(outs):
            self.assertIn(f"layout_declared=True dp=2 coord_dp={rank}", out)
            self.assertNotIn("declared no layout", err)
        self.assertIn("last words armed", outs[0][1])

    def test_other_jobs_get_one_warning_from_rank_0(self):
        outs = self.run_job(wrap=False)
        for out, _ in outs:
            self.assertIn("layout_declared=False", out)
        self.assertEqual(outs[0][1].count("declared no layout"), 1, outs[0][1])
        self.assertNotIn("declared no layout", outs[1][1])
        self.assertIn("CKPT_LAYOUT=dp=", outs[0][1])


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "ddp-rank":
        ddp_rank(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "1")
    else:
        unittest.main(verbosity=2)
