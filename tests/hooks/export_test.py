"""ckpt export, read back by readers that are not ours. Run by tests/integration/test_export.sh with CKPT_CLI set.

A model with every dtype both formats carry (float32/16/64, bfloat16, int64, int32, int8, uint8, bool), a 0-dim
and an empty tensor, trained a few steps with Adam and checkpointed by slurm_ckpt.torch:
- safetensors: read by the reader below, written from the format's published description (8-byte little-endian
  header length, a JSON header, the tensors' bytes, no holes, no overlaps): every tensor bitwise equal to the
  model's. Split at --max-file-size into model-0000K-of-0000N.safetensors with an index naming every tensor.
- torch: stock torch.load(weights_only=True), then load_state_dict: bitwise equal, keys in the model's order.
- An older step by --step; a byte flipped in a model tensor's bytes refused with one "ckpt:" line and nothing
  written; an existing OUT never replaced; an incomplete step refused.
- Only the weights' own ranges are read, each against its own checksum: a byte flipped in the optimizer state
  does not stop the export (--verify-all does); a checkpoint whose ranges have no checksums is read whole.
- A checkpoint of 290 MiB exports through a process held to 160 MiB of address space (it streams)."""
import ctypes
import glob
import json
import os
import re
import resource
import struct
import subprocess
import sys
import tempfile
import unittest

import torch

import slurm_ckpt.torch as sct

CLI = os.environ["CKPT_CLI"]

SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64,
    "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


def read_safetensors(path):
    """The tensors of one safetensors file, checked against the format's rules."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header longer than the file"
    header = json.loads(data[8:8 + n].decode("utf-8"))
    assert data[8:9] == b"{", "the header must start with '{'"
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()), meta
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], name) for name, info in header.items())
    at = 0
    for begin, end, name in spans:
        assert begin == at, f"{name}: a hole or an overlap at {begin} (expected {at})"
        at = end
    assert at == len(body), f"{len(body) - at} bytes after the last tensor"
    out = {}
    for name, info in header.items():
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        t = torch.empty(info["shape"], dtype=dtype)
        assert t.numel() * t.element_size() == end - begin, f"{name}: size does not match its shape"
        if end > begin:
            ctypes.memmove(t.data_ptr(), body[begin:end], end - begin)
        out[name] = t
    return out, meta


def raw(t):
    t = t.detach().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""


class Mixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)
        self.norm = torch.nn.BatchNorm1d(5)  # num_batches_tracked: int64
        self.register_buffer("f16", torch.randn(3, 2).half())  # Adam cannot update half on a CPU
        self.f64 = torch.nn.Parameter(torch.randn(4).double())
        self.register_buffer("bf16", torch.randn(7).bfloat16())
        self.register_buffer("i32", torch.arange(5, dtype=torch.int32))
        self.register_buffer("i8", torch.tensor([-3, 4], dtype=torch.int8))
        self.register_buffer("u8", torch.tensor([250, 1, 2], dtype=torch.uint8))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("scalar", torch.tensor(2.5))
        self.register_buffer("empty", torch.empty(0, 3))

    def forward(self, x):
        return self.norm(self.lin(x)).sum() + self.f64.float().sum()


def run_cli(*args, limit_bytes=None):
    def limit():
        if limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))
    return subprocess.run([CLI, *args], capture_output=True, text=True, preexec_fn=limit)


class Export(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.root = os.path.join(cls.tmp, "ckpt")
        torch.manual_seed(1)
        cls.model = Mixed()
        opt = torch.optim.Adam(cls.model.parameters(), lr=1e-2)
        cp = sct.Checkpointer(cls.model, opt, dir=cls.root, interval="1000steps")
        cls.saved = {}
        for step in range(1, 7):
            cls.model(torch.randn(4, 6)).backward()
            cp.before_update()
            opt.step()
            opt.zero_grad(set_to_none=True)
            cp.after_step(step)
            if step in (3, 6):
                cp.save(step)
                cls.saved[step] = {k: v.detach().clone() for k, v in cls.model.state_dict().items()}
        cp.close()

    def out(self, name):
        return os.path.join(self.tmp, name)

    def assert_bitwise(self, got, step):
        want = self.saved[step]
        self.assertEqual(set(got), set(want))
        for name, t in want.items():
            self.assertEqual(got[name].dtype, t.dtype, name)
            self.assertEqual(tuple(got[name].shape), tuple(t.shape), name)
            self.assertEqual(raw(got[name]), raw(t), name)

    def test_safetensors_one_file(self):
        r = run_cli("export", self.root, "--format", "safetensors", "-o", self.out("st"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("exported step 6:", r.stdout)
        self.assertEqual(os.listdir(self.out("st")), ["model.safetensors"])
        tensors, meta = read_safetensors(os.path.join(self.out("st"), "model.safetensors"))
        self.assert_bitwise(tensors, 6)
        self.assertEqual(meta.get("step"), "6")

    def test_safetensors_split_with_an_index(self):
        r = run_cli("export", self.root, "--format", "safetensors", "--max-file-size", "64B", "-o", self.out("split"))
        self.assertEqual(r.returncode, 0, r.stderr)
        files = sorted(glob.glob(os.path.join(self.out("split"), "model-*-of-*.safetensors")))
        self.assertGreater(len(files), 2)
        with open(os.path.join(self.out("split"), "model.safetensors.index.json")) as f:
            index = json.load(f)
        got = {}
        for path in files:
            tensors, _ = read_safetensors(path)
            for name in tensors:
                self.assertEqual(index["weight_map"][name], os.path.basename(path))
            got.update(tensors)
        self.assert_bitwise(got, 6)
        self.assertEqual(index["metadata"]["total_size"], sum(len(raw(t)) for t in got.values()))

    def test_torch_load_weights_only(self):
        r = run_cli("export", self.root, "--format", "torch", "-o", self.out("model.pt"))
        self.assertEqual(r.returncode, 0, r.stderr)
        state = torch.load(self.out("model.pt"), weights_only=True)
        self.assertEqual(list(state), list(self.saved[6]))
        self.assert_bitwise(state, 6)
        fresh = Mixed()
        fresh.load_state_dict(state)
        self.assert_bitwise(fresh.state_dict(), 6)

    def test_an_older_step(self):
        r = run_cli("export", self.root, "--step", "3", "--format", "torch", "-o", self.out("step3.pt"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_bitwise(torch.load(self.out("step3.pt"), weights_only=True), 3)

    def test_refusals_write_nothing(self):
        existing = self.out("exists")
        os.mkdir(existing)
        r = run_cli("export", self.root, "--format", "safetensors", "-o", existing)
        self.assertEqual(r.returncode, 2)
        self.assertIn("ckpt: export: ", r.stderr)
        self.assertIn("exists", r.stderr)
        self.assertEqual(os.listdir(existing), [])
        r = run_cli("export", self.root, "--step", "4", "--format", "torch", "-o", self.out("none.pt"))
        self.assertEqual(r.returncode, 1)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertTrue(r.stderr.startswith("ckpt: export: step 4"), r.stderr)
        r = run_cli("export", self.root, "--format", "onnx", "-o", self.out("x"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("--format 'onnx'", r.stderr)

    def test_a_flipped_byte_is_refused(self):
        root, _ = self.flipped_copy("flipped", "model/lin.weight")
        for fmt, out in (("safetensors", "flip-st"), ("torch", "flip.pt")):
            r = run_cli("export", root, "--step", "6", "--format", fmt, "-o", self.out(out))
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn("checksum mismatch", r.stderr)
            self.assertIn("nothing written", r.stderr)
            self.assertFalse(os.path.exists(self.out(out)))
            self.assertEqual(glob.glob(self.out(out) + ".partial-*"), [])

    def flipped_copy(self, name, region_name):
        """A copy of the checkpoint with one byte of `region_name` in rank 0's shard of step 6 flipped."""
        root = os.path.join(self.tmp, name)
        subprocess.run(["cp", "-a", self.root, root], check=True)
        step_dir = os.path.join(root, "%012d" % 6)
        with open(os.path.join(step_dir, "MANIFEST.json")) as f:
            shard = json.load(f)["shards"][0]
        region = next(s for s in shard["states"] if s["name"] == region_name)
        with open(os.path.join(step_dir, shard["file"]), "r+b") as f:
            f.seek(region["offset"] + region["length"] // 2)
            b = f.read(1)
            f.seek(region["offset"] + region["length"] // 2)
            f.write(bytes([b[0] ^ 0x10]))
        return root, shard

    def test_only_the_weights_are_read(self):
        """Each tensor's range is checked on its own: the optimizer state is not read, and a byte flipped there
        does not stop an export of intact weights; --verify-all refuses it."""
        optim = next(s["name"] for s in self.flipped_copy("probe", "model/lin.weight")[1]["states"]
                     if s["name"].startswith("optim/") and s["length"] > 16)
        root, shard = self.flipped_copy("optim-flipped", optim)
        r = run_cli("export", root, "--format", "torch", "-o", self.out("intact.pt"))
        self.assertEqual(r.returncode, 0, r.stderr)
        read, total = map(int, re.search(r"read (\d+) of the checkpoint's (\d+) bytes", r.stdout).groups())
        weights = sum(len(raw(t)) for t in self.saved[6].values())
        self.assertEqual(read, weights)
        self.assertLess(read, total)
        self.assert_bitwise(torch.load(self.out("intact.pt"), weights_only=True), 6)
        r = run_cli("export", root, "--verify-all", "--format", "torch", "-o", self.out("all.pt"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("checksum mismatch", r.stderr)
        self.assertFalse(os.path.exists(self.out("all.pt")))

    def test_a_checkpoint_without_range_checksums_is_read_whole(self):
        root = os.path.join(self.tmp, "older")
        subprocess.run(["cp", "-a", self.root, root], check=True)
        step_dir = os.path.join(root, "%012d" % 6)
        for name in os.listdir(step_dir):
            if name == "MANIFEST.json" or name.endswith(".rec"):
                path = os.path.join(step_dir, name)
                with open(path) as f:
                    doc = json.load(f)
                for shard in doc.get("shards", [doc]):
                    for s in shard["states"]:
                        s.pop("checksum", None)
                with open(path, "w") as f:
                    json.dump(doc, f)
        r = run_cli("export", root, "--step", "6", "--format", "torch", "-o", self.out("older.pt"))
        self.assertEqual(r.returncode, 0, r.stderr)
        read, _ = map(int, re.search(r"read (\d+) of the checkpoint's (\d+) bytes", r.stdout).groups())
        with open(os.path.join(step_dir, "MANIFEST.json")) as f:
            self.assertEqual(read, json.load(f)["shards"][0]["size"])
        self.assert_bitwise(torch.load(self.out("older.pt"), weights_only=True), 6)

    def test_larger_than_its_address_space(self):
        """About 290 MiB of weights through an export held to 160 MiB of address space."""
        root = os.path.join(self.tmp, "big")
        torch.manual_seed(2)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(18)])
        cp = sct.Checkpointer(model, None, dir=root, interval="1000steps")
        cp.save(1)
        cp.close()
        want = {k: raw(v) for k, v in model.state_dict().items()}
        total = sum(len(v) for v in want.values())
        self.assertGreater(total, 280 << 20)
        del model, cp
        r = run_cli("export", root, "--format", "safetensors", "--max-file-size", "128MiB", "-o", self.out("big-st"),
                    limit_bytes=160 << 20)
        self.assertEqual(r.returncode, 0, r.stderr)
        got = {}
        for path in sorted(glob.glob(os.path.join(self.out("big-st"), "*.safetensors"))):
            tensors, _ = read_safetensors(path)
            got.update({k: raw(v) for k, v in tensors.items()})
        self.assertEqual(got.keys(), want.keys())
        self.assertTrue(all(got[k] == want[k] for k in want))


if __name__ == "__main__":
    unittest.main(verbosity=2)
