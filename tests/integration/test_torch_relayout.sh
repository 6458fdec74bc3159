#!/usr/bin/env bash
# A tensor-parallel checkpoint restores onto another split: slurm-examples/train_dp_tp.py (a row-parallel MLP whose
# first weight is split by rows and second by columns, SGD with momentum) trains 20 steps on 2 ranks (tp 2), then
# its checkpoint is restored onto 1 rank (tp 1) and onto 4 (tp 4), each tensor and momentum buffer assembled from
# the saved blocks it intersects (store::plan_relayout).
# - onto tp 1 with no step more: the whole weights are the tp-2 slices joined, bit for bit;
# - onto tp 1 and tp 4, 10 steps on: the losses and weights follow the run that went on at tp 2. Not bit for bit:
#   the forward pass sums the hidden units in tp parts, so another tp rounds otherwise; they must agree to 1e-5,
#   while losing the momentum (the check below proves it) moves them far more;
# - ckpt export of the tp-2 checkpoint: the whole weights, as safetensors (read by export_test.py's reader) and as
#   a torch.save file (stock torch.load), bit for bit.
set -euo pipefail
SRC=${CKPT_SOURCE_DIR:?}
: "${CKPT_BUILD_DIR:?}"
source "$SRC/tests/integration/torch_lib.sh"
have_torch || { echo "test_torch_relayout: needs python3-torch and a built slurm_ckpt" >&2; exit 1; }

ranks_scratch  # $work, and `pids` killed at exit
fail() { echo "test_torch_relayout: $*" >&2; exit 1; }

# run NAME WORLD TP STEPS: train_dp_tp.py on WORLD local ranks from $work/NAME/ckpt; every rank must exit 0.
run() {
  local name=$1 world=$2 tp=$3 steps=$4
  CKPT_INTERVAL=10steps start_local_ranks "$world" "$work/$name/rank" "$SRC/slurm-examples/train_dp_tp.py" \
    --tp "$tp" --steps "$steps" --ckpt-dir "$work/$name/ckpt" --out "$work/$name/final.bin"
  wait_local_ranks "$work/$name/rank" || fail "$name: rank $failed_rank failed"
}

# from NAME: a copy of the tp-2 run's checkpoint dir, to go on from.
from() { mkdir -p "$work/$1" && cp -a "$work/saved/ckpt" "$work/$1/ckpt"; }

mkdir -p "$work/saved"
run saved 2 2 20
[ "$(latest_step "$work/saved/ckpt")" = 20 ] || fail "the tp-2 run committed no checkpoint of step 20"
for name in same tp1-now tp1 tp4; do from "$name"; done
run same 2 2 30      # the reference: on at tp 2
run tp1-now 1 1 20   # restored, no step more
run tp1 1 1 30
run tp4 4 4 30

export CKPT_CLI=$CKPT_BUILD_DIR/cli/ckpt
"$CKPT_CLI" export "$work/saved/ckpt" --format safetensors -o "$work/export-st" ||
  fail "ckpt export of the tp-2 checkpoint as safetensors failed"
"$CKPT_CLI" export "$work/saved/ckpt" --format torch -o "$work/export.pt" ||
  fail "ckpt export of the tp-2 checkpoint as a torch file failed"

for name in tp1-now tp1 tp4; do
  grep -q "^train_dp_tp: resumed from step 20 " "$work/$name/rank0.log" ||
    { cat "$work/$name/rank0.log" >&2; fail "$name did not resume from step 20"; }
done
line=$(grep -o "restored onto tp 1 of 1: .*" "$work/tp1-now/rank0.log") ||
  { cat "$work/tp1-now/rank0.log" >&2; fail "tp1-now: the restore says nothing of another split"; }
echo "test_torch_relayout: tp 2 onto tp 1: $line"

"$PY" - "$work" "$SRC/tests/hooks" <<'PYCHECK' || fail "the restored weights or the trajectory differ (above)"
import re, sys
import torch

work = sys.argv[1]
D_IN, HIDDEN, D_OUT = 32, 64, 8  # train_dp_tp.py's defaults


def weights(name, tp):
    """The whole weights of a run: its tp slices (each W1 rows, then W2 columns) joined."""
    shard = HIDDEN // tp
    w1, w2 = [], []
    for t in range(tp):
        flat = torch.frombuffer(bytearray(open(f"{work}/{name}/final.bin.tp{t}", "rb").read()), dtype=torch.float32)
        w1.append(flat[: shard * D_IN].reshape(shard, D_IN))
        w2.append(flat[shard * D_IN:].reshape(D_OUT, shard))
    return torch.cat(w1, 0), torch.cat(w2, 1)


def losses(name):
    text = open(f"{work}/{name}/rank0.log").read()
    return {int(s): float(v) for s, v in re.findall(r"^train_dp_tp: step (\d+) loss (\S+)", text, re.M)}


saved, now = weights("saved", 2), weights("tp1-now", 1)
assert all(torch.equal(a, b) for a, b in zip(saved, now)), "tp 1 restored other weights than the tp-2 slices joined"
print("test_torch_relayout: tp 2 onto tp 1: the whole weights are the saved slices joined, bit for bit")

sys.path.insert(0, sys.argv[2])
from export_test import read_safetensors  # written from the format's published description, not ours
exported, _ = read_safetensors(f"{work}/export-st/model.safetensors")
loaded = torch.load(f"{work}/export.pt", weights_only=True)
for got in (exported, loaded):
    assert list(sorted(got)) == ["0.weight", "2.weight"], sorted(got)
    assert torch.equal(got["0.weight"], saved[0]) and torch.equal(got["2.weight"], saved[1]), "export differs"
print("test_torch_relayout: ckpt export of the tp-2 checkpoint: the joined weights, as safetensors and as a "
      "torch.save file, bit for bit")

same, ref = weights("same", 2), losses("same")
assert sorted(ref) == list(range(21, 31)), sorted(ref)
for name, tp in (("tp1", 1), ("tp4", 4)):
    got = losses(name)
    assert sorted(got) == sorted(ref), (name, sorted(got))
    worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in ref)
    drift = max((a - b).abs().max().item() for a, b in zip(weights(name, tp), same))
    print(f"test_torch_relayout: tp 2 onto tp {tp}, 10 steps on: losses within {worst:.1e} (relative), "
          f"weights within {drift:.1e} of the run that went on at tp 2")
    assert worst < 1e-5 and drift < 1e-5, name

# The bound can fail: the same 10 steps from the saved weights with the momentum lost.
w1, w2 = (w.clone().requires_grad_() for w in saved)
sgd = torch.optim.SGD([w1, w2], lr=0.05, momentum=0.9)
torch.manual_seed(0)
for step in range(20, 30):
    g = torch.Generator().manual_seed(1234 * 1_000_003 + step * 1009)
    x = torch.randn(16, D_IN, generator=g)
    target = torch.tanh(x @ torch.randn(D_OUT, D_IN, generator=torch.Generator().manual_seed(1234)).t())
    loss = ((torch.relu(x @ w1.t()) @ w2.t() - target) ** 2).mean()
    loss.backward()
    sgd.step()
    sgd.zero_grad()
lost = max((a.detach() - b).abs().max().item() for a, b in zip((w1, w2), same))
print(f"test_torch_relayout: without the momentum the weights would be {lost:.1e} off")
assert lost > 1e-3, lost
PYCHECK
