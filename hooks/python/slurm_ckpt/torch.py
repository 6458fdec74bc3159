"""The PyTorch helper: checkpoints a model, its optimizer and small extras with libckpt's two-phase save.

What is saved, per rank:
  - every tensor of model.state_dict(): parameters are copied by the asynchronous snapshot (training waits for it
    only in before_update()); buffers, which forward passes may change (BatchNorm statistics), are copied inside
    after_step();
  - every tensor of optimizer.state_dict()["state"] the same way, plus the rest of it (param_groups, scalars);
  - the extras: the step, the RNG states (torch, CUDA, Python's random, NumPy's when loaded) and `extra`.

`extra` is a dict or an object with state_dict()/load_state_dict(). In a dict, a value with
state_dict()/load_state_dict() (an LR scheduler, a sampler) is saved through them; any other picklable value is
saved as is and put back into the dict by restore().

The restore is bitwise: tensors come back byte for byte, RNG states exactly.
"""
import ctypes
import json
import pickle
import random
import sys

import torch

from . import _native

Error = _native.Error

_MODEL = "model/"
_OPTIM = "optim/"
_OPTIM_META = "optim.meta"
_EXTRA = "extra"


class _Ref:
    """Stands for an optimizer-state tensor saved as its own region."""

    def __init__(self, name):
        self.name = name


def _meta(t, kind):
    return json.dumps({"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "kind": kind})


def _stream_of(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _tensor_from(region):
    """A new CPU tensor holding a region's bytes, with its recorded dtype and shape."""
    meta, view, address = region
    out = torch.empty(meta["shape"], dtype=getattr(torch, meta["dtype"]))
    nbytes = out.numel() * out.element_size()
    if nbytes != len(view):
        raise Error(f"ckpt: region of {len(view)} bytes does not hold a {meta['dtype']} tensor of shape {meta['shape']}")
    if nbytes:
        ctypes.memmove(out.data_ptr(), address, nbytes)
    return out


def _rng_state():
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def _set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy  # saved by a run that had it loaded

        numpy.random.set_state(state["numpy"])


def _pairs(value):
    """layout=dict(dp=2, tp=2, pp=1, zero1=False) as "dp=2,tp=2,pp=1,zero1=off"; a string passes through."""
    if isinstance(value, str):
        return value
    return ",".join(f"{k}={('on' if v else 'off') if isinstance(v, bool) else int(v)}" for k, v in value.items())


def _has_state_dict(obj):
    return hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")


class Checkpointer:
    """Checkpoints `model`, `optimizer` and `extra` every CKPT_INTERVAL, restores them, and stops on notice.

    dir and interval override CKPT_DIR and CKPT_INTERVAL: interval is "auto", a duration ("15m", "900s") or
    "<N>steps"; a number means seconds. Other keyword settings (keep, grace, rank, world_size, coordinator, ...)
    override their CKPT_* variables too; see slurm_ckpt.option_keys().
    """

    def __init__(self, model, optimizer=None, extra=None, dir=None, interval=None, layout=None, coord=None,
                 **settings):
        if layout is not None:
            settings["layout"] = _pairs(layout)
        if coord is not None:
            settings["coord"] = _pairs(coord)
        if dir is not None:
            settings["dir"] = str(dir)
        if interval is not None:
            settings["interval"] = interval if isinstance(interval, str) else f"{int(interval)}s"
        self._native = _native.Checkpointer(**settings)
        self.model = model
        self.optimizer = optimizer
        self.extra = extra
        self._signature = None
        self._first_step = True
        # Last words write the live state of a step from another thread: the extras (optimizer metadata, RNG
        # states, `extra`) must then be current at every step, not only at checkpoint steps.
        config = self._native.config if self._native.enabled else {}
        self._extras_every_step = bool(config.get("last_words") and config.get("layout_declared")
                                       and self._native.world_size > 1)
        if self._native.enabled:
            self._register()  # the model's staging is allocated and faulted in now, in the background

    # ---- what the native side sees --------------------------------------------------------------------------

    @property
    def enabled(self):
        """False without a checkpoint dir: every call is then a cheap no-op."""
        return self._native.enabled

    @property
    def rank(self):
        return self._native.rank

    @property
    def world_size(self):
        return self._native.world_size

    @property
    def config(self):
        """The resolved settings, as a dict."""
        return self._native.config

    def stats(self):
        """Counters: snapshots, commits, stalls, back-pressure waits, staging and state bytes."""
        return self._native.stats()

    def _regions(self):
        regions = []
        params = {id(p) for p in self.model.parameters()}
        for name, t in self.model.state_dict(keep_vars=True).items():
            is_param = id(t) in params
            regions.append(self._region(_MODEL + name, t.detach(), sync=not is_param,
                                        kind="param" if is_param else "buffer"))
        if self.optimizer is not None:
            for index, entry in self.optimizer.state_dict()["state"].items():
                for key, value in entry.items():
                    if torch.is_tensor(value):
                        # Small tensors (Adam's step) are copied inside after_step: cheaper than a copy task.
                        regions.append(self._region(f"{_OPTIM}{index}/{key}", value.detach(),
                                                    sync=value.numel() * value.element_size() < 4096, kind="optim"))
        return regions

    @staticmethod
    def _region(name, t, sync, kind):
        if not t.is_contiguous():
            raise Error(f"ckpt: tensor '{name}' is not contiguous; its storage cannot be saved as one region")
        return (name, t.data_ptr(), t.numel() * t.element_size(), t.is_cuda, sync, _meta(t, kind), _stream_of(t))

    def _register(self):
        regions = self._regions()
        signature = tuple(r[:5] for r in regions)
        if signature != self._signature:
            self._native.set_regions(regions)
            self._signature = signature

    def _optimizer_meta(self):
        sd = self.optimizer.state_dict()
        state = {index: {key: (_Ref(f"{_OPTIM}{index}/{key}") if torch.is_tensor(value) else value)
                         for key, value in entry.items()}
                 for index, entry in sd["state"].items()}
        return {"state": state, "param_groups": sd["param_groups"]}

    def _user_extra(self):
        if self.extra is None:
            return None
        if _has_state_dict(self.extra):
            return self.extra.state_dict()
        return {key: (value.state_dict() if _has_state_dict(value) else value) for key, value in self.extra.items()}

    def _put_extras(self, step):
        if self.optimizer is not None:
            self._native.put_blob(_OPTIM_META, pickle.dumps(self._optimizer_meta(), protocol=4))
        extras = {"step": step, "rng": _rng_state(), "user": self._user_extra()}
        self._native.put_blob(_EXTRA, pickle.dumps(extras, protocol=4))

    # ---- the loop ---------------------------------------------------------------------------------------------

    def restore(self):
        """Loads the newest complete checkpoint that verifies (walking back past bad ones) into the model, the
        optimizer, the RNGs and `extra`. Returns the step to resume from: the loop runs `range(start, total)`.
        Returns 0 when there is no checkpoint. Call it once, before the first step."""
        n = self._native
        if not n.enabled:
            return 0
        step = n.restore(copy_into_regions=False)
        if step == 0:
            self._register()
            return 0
        regions = {name: (json.loads(meta), view, address) for name, meta, view, address in n.restored()}

        def need(name):
            if name not in regions:
                raise Error(f"ckpt: the checkpoint of step {step} has no '{name}'")
            return regions[name]

        target = self.model.state_dict(keep_vars=True)
        loaded = {name: _tensor_from(need(_MODEL + name)) for name in target}
        self.model.load_state_dict(loaded)
        if self.optimizer is not None:
            meta = pickle.loads(bytes(need(_OPTIM_META)[1]))
            state = {index: {key: (_tensor_from(need(value.name)) if isinstance(value, _Ref) else value)
                             for key, value in entry.items()}
                     for index, entry in meta["state"].items()}
            self.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        extras = pickle.loads(bytes(need(_EXTRA)[1]))
        if extras["step"] != step:
            raise Error(f"ckpt: the checkpoint of step {step} holds extras of step {extras['step']}")
        _set_rng_state(extras["rng"])
        user = extras["user"]
        if self.extra is not None and user is not None:
            if _has_state_dict(self.extra):
                self.extra.load_state_dict(user)
            else:
                for key, value in user.items():
                    current = self.extra.get(key)
                    if _has_state_dict(current):
                        current.load_state_dict(value)
                    else:
                        self.extra[key] = value
        self._register()  # the optimizer's state tensors are new
        return step

    def before_update(self):
        """The guard: call right before optimizer.step() (and any other in-place change of saved state). Blocks
        only while the snapshot of the previous checkpoint is still copying."""
        self._native.before_update()

    def after_step(self, step):
        """Call after each optimizer.step() with the number of completed steps. Takes a checkpoint when one is due
        (every rank at the same step). Returns True when the loop should stop: a terminal checkpoint was taken
        because the job is within CKPT_GRACE of its time limit, or SIGTERM/SIGUSR1/SIGUSR2 arrived (on any rank).
        Then leave the loop, call close(), and exit normally."""
        n = self._native
        if not n.enabled:
            return False
        snapshot, _, _ = n.poll(step)
        if self._first_step or snapshot:
            self._first_step = False
            self._register()  # the optimizer's state exists after its first step: staging grows in the background
        if snapshot or self._extras_every_step:
            self._put_extras(step)
        return n.after_step(step)

    def save(self, step, terminal=False):
        """Takes a checkpoint of `step` now. Collective: every rank must call it at the same step."""
        if not self._native.enabled:
            return
        self._register()
        self._put_extras(step)
        self._native.save(step, terminal)

    def close(self):
        """Waits for the last persist and commit; raises if a persist failed."""
        self._native.close()

    def abort(self):
        """After a training error (a collective failed because a peer died): closes without waiting for other
        ranks. With last words on, it first lets this rank take part in the survivors' terminal checkpoint."""
        self._native.abort()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
