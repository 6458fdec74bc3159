"""The PyTorch helper: checkpoints a model, its optimizer and small extras with libckpt's two-phase save.

What is saved, per rank:
  - every tensor of model.state_dict(): parameters are copied by the asynchronous snapshot (training waits for it
    only in before_update()); buffers, which forward passes may change (BatchNorm statistics), are copied inside
    after_step();
  - every tensor of optimizer.state_dict()["state"] the same way, plus the rest of it (param_groups, scalars);
  - the extras: the step, the RNG states (torch, CUDA, Python's random, NumPy's when loaded) and `extra`.

`extra` is a dict or an object with state_dict()/load_state_dict(). In a dict, a value with
state_dict()/load_state_dict() (an LR scheduler, a sampler) is saved through them; any other value is saved as is
and put back into the dict by restore(). Values must be plain data: None, bools, numbers, strings, bytes, lists,
tuples, dicts, sets, tensors and NumPy arrays (what a state_dict() holds); anything else is refused when saved.

The restore is bitwise: tensors come back byte for byte, RNG states exactly. It never runs code a checkpoint
names: the extras are a pickle that may name only the few globals of _SAFE_GLOBALS (tensors and arrays travel as
raw bytes with their dtype and shape), read by an unpickler that refuses every other one.
"""
import collections
import contextlib
import ctypes
import functools
import io
import json
import os
import math
import pickle
import random
import sys
import time
import types

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

    def __eq__(self, other):
        return isinstance(other, _Ref) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def __setstate__(self, state):
        # The only attribute a _Ref has; a pickle cannot hand it any other.
        if not isinstance(state, dict) or set(state) != {"name"} or not isinstance(state["name"], str):
            raise _Refused("a _Ref with other attributes")
        self.name = state["name"]


# ---- the extras' format ------------------------------------------------------------------------------------------
# A pickle with no code in it. Tensors, NumPy arrays and NumPy scalars are persistent ids holding their raw bytes;
# the globals it may name are these (and torch's dtypes). Checkpoints written before this format pickled tensors
# through torch's storage pickling: its entries below are read with a restricted torch.load, never a full one.


class _Refused(Exception):
    """A pickle named a global that a checkpoint may not name."""


def _legacy_storage(data):
    """torch.storage._load_from_bytes, through torch's own restricted unpickler (weights_only). Not through
    pickle_module=: torch 1.13 ignores it unless weights_only is set, and unpickles with the full pickle."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise _Refused(f"a tensor storage that is not only data ({str(e).rsplit(': ', 1)[-1][:80]})") from None


_SAFE_GLOBALS = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "complex"): complex,
    ("builtins", "slice"): slice,
    ("builtins", "range"): range,
    ("builtins", "bytearray"): bytearray,
    ("torch", "device"): torch.device,
    ("torch", "Size"): torch.Size,
    (_Ref.__module__, "_Ref"): _Ref,
    # the earlier format
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch.storage", "_load_from_bytes"): _legacy_storage,
}
_SAFE_NUMPY = {
    ("numpy", "ndarray"): "ndarray",
    ("numpy", "dtype"): "dtype",
    ("numpy.core.multiarray", "_reconstruct"): "core.multiarray._reconstruct",
    ("numpy.core.multiarray", "scalar"): "core.multiarray.scalar",
}


def _safe_global(module, name):
    """The object a pickle may name as module.name, or None."""
    if (module, name) in _SAFE_GLOBALS:
        return _SAFE_GLOBALS[(module, name)]
    if module == "torch" and isinstance(name, str):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype) or (name.endswith("Storage") and isinstance(value, type)):
            return value
    if (module, name) in _SAFE_NUMPY:
        import numpy  # named by a checkpoint of a run that had it loaded

        value = numpy
        for part in _SAFE_NUMPY[(module, name)].split("."):
            value = getattr(value, part)
        return value
    return None


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        value = _safe_global(module, name)
        if value is None:
            raise _Refused(f"{module}.{name}")
        return value

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or not pid or pid[0] not in ("tensor", "ndarray", "npscalar"):
            raise _Refused(f"persistent id {pid!r:.60}")
        kind, dtype, shape, data = pid
        if kind == "tensor":
            out = torch.empty(tuple(shape), dtype=getattr(torch, dtype))
            if not isinstance(getattr(torch, dtype), torch.dtype) or out.numel() * out.element_size() != len(data):
                raise _Refused(f"a tensor of {len(data)} bytes as {dtype} {list(shape)}")
            if data:
                ctypes.memmove(out.data_ptr(), data, len(data))
            return out
        import numpy

        array = numpy.frombuffer(data, dtype=numpy.dtype(dtype))
        if array.dtype.hasobject:
            raise _Refused(f"an array of dtype {dtype}")
        return array[0] if kind == "npscalar" else array.reshape(tuple(shape)).copy()


# Instances the reader can rebuild from the globals above.
_SAFE_TYPES = (torch.device, torch.Size, _Ref, collections.OrderedDict, set, frozenset, complex, slice, range,
               bytearray)


def _is_numpy(obj):
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(obj, (numpy.ndarray, numpy.generic)) and not obj.dtype.hasobject \
        and obj.dtype.fields is None


class _StatePickler(pickle.Pickler):
    """Pickles plain data, tensors and arrays; refuses anything whose restore would have to run code."""

    def persistent_id(self, obj):
        if torch.is_tensor(obj):
            t = obj.detach().to("cpu").contiguous()
            nbytes = t.numel() * t.element_size()
            return ("tensor", str(t.dtype).replace("torch.", ""), tuple(t.shape),
                    ctypes.string_at(t.data_ptr(), nbytes) if nbytes else b"")
        if _is_numpy(obj):
            numpy = sys.modules["numpy"]
            kind = "ndarray" if isinstance(obj, numpy.ndarray) else "npscalar"
            return (kind, obj.dtype.str, tuple(numpy.shape(obj)), numpy.ascontiguousarray(obj).tobytes())
        return None

    def reducer_override(self, obj):
        if type(obj) in _SAFE_TYPES or isinstance(obj, torch.dtype):
            return NotImplemented
        module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(name, str) and _safe_global(module, name) is obj:
            return NotImplemented  # a global the reader allows
        what = f"{module}.{name}" if name is not None else f"{type(obj).__module__}.{type(obj).__qualname__}"
        raise Error(f"ckpt: cannot save a {what} in a checkpoint (extras hold plain values, tensors and arrays; "
                    f"give the object state_dict()/load_state_dict() instead)")


def _dumps(value):
    out = io.BytesIO()
    _StatePickler(out, protocol=4).dump(value)
    return out.getvalue()


def _loads(data, what, step):
    """Reads extras written by _dumps (or the earlier format); a pickle naming anything else is refused."""
    try:
        return _SafeUnpickler(io.BytesIO(data)).load()
    except _Refused as e:
        raise Error(f"ckpt: refusing the checkpoint of step {step}: its {what} names {e}, which a checkpoint may not "
                    f"name (only plain values, tensors and arrays are restored)") from None
    except Exception as e:  # noqa: BLE001 - a damaged pickle: one line, whatever broke
        raise Error(f"ckpt: the checkpoint of step {step} has a damaged {what}: {type(e).__name__}: {e}") from None


def _without_code(state):
    """A state_dict() without its functions (OneCycleLR keeps its annealing method there): code is not state, and
    the live object keeps its own through load_state_dict()."""
    if not isinstance(state, dict):
        return state
    code = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, functools.partial)
    return type(state)((k, v) for k, v in state.items() if not isinstance(v, code))


def _meta(t, kind, group, chunk=None, like=None):
    """A region's metadata: its dtype and shape, and where its block lies in the whole tensor (`chunk`: a dict of
    global_shape and offset, as the program declared it; none: the region is the whole tensor) and who else holds
    it (`group`: "dp", every data-parallel replica; "rank", this rank alone). Core checks it (store::tensor_chunk).
    `like`: the region of the parameter an optimizer state tensor is shaped like, whose split a restore onto
    another split gives it too (store::plan_relayout)."""
    shape, chunk = list(t.shape), chunk or {}
    meta = {"dtype": str(t.dtype).replace("torch.", ""), "shape": shape, "kind": kind, "replica_group": group,
            "global_shape": [int(d) for d in chunk.get("global_shape", shape)],
            "offset": [int(d) for d in chunk.get("offset", [0] * len(shape))]}
    if like is not None:
        meta["split_like"] = like
    return json.dumps(meta)


def _stream_of(t):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


_ENV = _native.env_names()  # setting key -> variable (ckpt/env_contract.hpp)


def _state_from_memory():
    """CKPT_INPLACE_STATE: `memory` (the default): a restart in place takes the state from the survivors' memory,
    checked against the checkpoint's checksums; `files`: every rank reads its shard, as after a requeue."""
    value = os.environ.get(_ENV["inplace_state"], "memory")
    if value not in ("memory", "files"):
        raise Error(f"ckpt: {_ENV['inplace_state']}={value[:100]!r}: expected memory or files")
    return value == "memory"


def _tensor_from(region, copy=True):
    """A new CPU tensor holding a region's bytes, with its recorded dtype and shape. The size the manifest's shape
    and dtype imply is checked against the region's bytes before anything is allocated: a manifest cannot make the
    restore allocate more than the checkpoint holds. Without `copy`, a tensor over the bytes where restored()
    holds them, valid until the next snapshot or restore: only for a load that copies it (load_state_dict)."""
    meta, view, address = region
    dtype = getattr(torch, str(meta.get("dtype")), None) if isinstance(meta, dict) else None
    shape = meta.get("shape") if isinstance(meta, dict) else None
    if not isinstance(dtype, torch.dtype) or not isinstance(shape, list) or len(shape) > 64 or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise Error(f"ckpt: region metadata {str(meta)[:200]} names no tensor (dtype, shape)")
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes != len(view):
        raise Error(f"ckpt: region of {len(view)} bytes does not hold a {meta['dtype']} tensor of shape {shape}")
    if not copy and nbytes:
        return torch.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype=torch.uint8).view(
            dtype).reshape(shape)
    out = torch.empty(shape, dtype=dtype)
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


def _ddp_layout(model, settings):
    """dp=<world size> for a DistributedDataParallel model (pure data parallelism: every rank holds the whole
    state), so that last words know a complete copy when they see one; None for any other model."""
    if not isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return None
    world = settings.get("world_size")
    if world is None:
        world = torch.distributed.get_world_size(model.process_group)
    return f"dp={int(world)}"


def _zero(optimizer):
    """The ZeroRedundancyOptimizer (ZeRO-1) `optimizer` is, else None. Its module is looked up, never imported: a
    program that made one has imported it, and importing it costs 0.16 s (a spare's restore in place paid it)."""
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    cls = getattr(module, "ZeroRedundancyOptimizer", None)
    return optimizer if cls is not None and isinstance(optimizer, cls) else None


def _layout_of(model, optimizer, settings):
    """The layout a program need not declare: ZeRO-1 over the optimizer's world (each rank holds the state of its
    own partition of the parameters, and only that), else what _ddp_layout finds."""
    zero = _zero(optimizer)
    if zero is not None:
        return f"dp={int(zero.world_size)},zero1=on"
    return _ddp_layout(model, settings)


def _has_state_dict(obj):
    return hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")


class Checkpointer:
    """Checkpoints `model`, `optimizer` and `extra` every CKPT_INTERVAL, restores them, and stops on notice.

    dir and interval override CKPT_DIR and CKPT_INTERVAL: interval is "auto", a duration ("15m", "900s") or
    "<N>steps"; a number means seconds. Other keyword settings (keep, grace, rank, world_size, rendezvous, ...)
    override their CKPT_* variables too; see slurm_ckpt.option_keys().

    chunks: for a program that splits tensors itself (tensor parallelism), where this rank's block of each split
    tensor lies in the whole one: {state_dict name: {"global_shape": [...], "offset": [...]}}; an optimizer state
    tensor shaped like its parameter is split alike. Every region records its block and who else holds it (the
    manifest's tensor chunks, store::tensor_chunk); a block outside its tensor is refused at the start.
    """

    def __init__(self, model, optimizer=None, extra=None, dir=None, interval=None, layout=None, coord=None,
                 chunks=None, **settings):
        if layout is None and "layout" not in settings and not os.environ.get(_native.env_names()["layout"]):
            layout = _layout_of(model, optimizer, settings)
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
        # The optimizer whose state this rank saves and loads: ZeRO-1's local one holds this rank's partition (its
        # state_dict() would need a collective to gather every rank's).
        zero = _zero(optimizer)
        self._state_optimizer = zero.optim if zero is not None else optimizer
        self._global_index = None  # ZeRO-1: each local parameter's index among all of them (_optim_region)
        self.extra = extra
        # A program that splits tensors itself (tensor parallelism) says where each of its blocks lies in the whole
        # tensor: {state_dict name: {"global_shape": [...], "offset": [...]}}; the rest are whole tensors.
        self._chunks = dict(chunks or {})
        self._signature = None
        self._first_step = True
        # Last words write the live state of a step from another thread: the extras (optimizer metadata, RNG
        # states, `extra`) must then be current at every step, not only at checkpoint steps.
        config = self._native.config if self._native.enabled else {}
        self._extras_every_step = bool(config.get("last_words") and config.get("layout_declared")
                                       and self._native.world_size > 1)
        if self._native.enabled:
            self._register()  # its staging is allocated in the background once restore() has loaded the state
            self._time_forward(model)
        _note_checkpointer(self)  # run() reads its last words when train() ends

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
                                        kind="param" if is_param else "buffer", chunk=self._chunks.get(name)))
        if self.optimizer is not None:
            # A state tensor shaped like its parameter is split as the parameter is; a ZeRO-1 partition's state is
            # this rank's alone.
            group = "rank" if _zero(self.optimizer) is not None else "dp"
            names = {id(p): name for name, p in self.model.named_parameters()}
            ordered = [p for g in self._state_optimizer.param_groups for p in g["params"]]
            for index, entry in self._state_optimizer.state_dict()["state"].items():
                param = ordered[index] if index < len(ordered) else None
                for key, value in entry.items():
                    if torch.is_tensor(value):
                        like = (names.get(id(param))
                                if param is not None and value.shape == param.shape else None)
                        # Small tensors (Adam's step) are copied inside after_step: cheaper than a copy task.
                        regions.append(self._region(self._optim_region(index, key), value.detach(),
                                                    sync=value.numel() * value.element_size() < 4096, kind="optim",
                                                    group=group, chunk=self._chunks.get(like),
                                                    like=None if like is None else _MODEL + like))
        return regions

    def _global_indices(self):
        """ZeRO-1: the index among all of the model's parameters of each parameter of this rank's partition."""
        zero = _zero(self.optimizer)
        if self._global_index is None:
            position = {id(p): i for i, p in enumerate(p for g in zero.param_groups for p in g["params"])}
            self._global_index = [position[id(p)] for g in zero.optim.param_groups for p in g["params"]]
        return self._global_index

    def _load_partition(self, meta, regions, step):
        """ZeRO-1: loads this rank's partition of the optimizer state from the ranges named by its parameters'
        global indices, the same whether the checkpoint was written by this many ranks or another number (the
        restore then read them from their old owners' shards). `meta` is the loaded shard's: its non-tensor
        values and its groups' hyperparameters."""
        zero = _zero(self.optimizer)
        values = {}  # global index -> the non-tensor entries the loaded shard's writer held for it
        for entry in meta["state"].values():
            refs = [v.name for v in entry.values() if isinstance(v, _Ref)]
            if refs:
                values[int(refs[0][len(_OPTIM):].split("/", 1)[0])] = {
                    k: v for k, v in entry.items() if not isinstance(v, _Ref)}
        state = {}
        for local, g in enumerate(self._global_indices()):
            prefix = f"{_OPTIM}{g}/"
            # Views, not copies: load_state_dict below copies them.
            entry = {name[len(prefix):]: _tensor_from(region, copy=False) for name, region in regions.items()
                     if name.startswith(prefix)}
            if not entry:
                continue  # no state yet (never updated)
            if g in values:
                entry.update(values[g])
            elif any(values.values()):
                raise Error(f"ckpt: the checkpoint of step {step} holds optimizer values that are not tensors, "
                            f"which another number of ranks cannot take over (parameter {g})")
            state[local] = entry
        groups = self._state_optimizer.state_dict()["param_groups"]
        if len(groups) != len(meta["param_groups"]):
            raise Error(f"ckpt: the checkpoint of step {step} has {len(meta['param_groups'])} parameter groups; "
                        f"the optimizer has {len(groups)}")
        for group, saved in zip(groups, meta["param_groups"]):
            group.update({k: v for k, v in saved.items() if k != "params"})
        self._state_optimizer.load_state_dict({"state": state, "param_groups": groups})
        for exposed, local in zip(zero.param_groups, zero.optim.param_groups):  # what LR schedulers change
            exposed.update({k: v for k, v in local.items() if k != "params"})

    def _optim_region(self, index, key):
        """The region of optimizer state entry `key` of parameter `index` (the state_dict's). Under ZeRO-1 the
        index is the parameter's among all of the model's, not among this rank's partition: the name means the
        same on every rank and at every world size, which a restore onto another partition needs."""
        if _zero(self.optimizer) is not None:
            index = self._global_indices()[index]
        return f"{_OPTIM}{index}/{key}"

    @staticmethod
    def _region(name, t, sync, kind, group="dp", chunk=None, like=None):
        if not t.is_contiguous():
            raise Error(f"ckpt: tensor '{name}' is not contiguous; its storage cannot be saved as one region")
        return (name, t.data_ptr(), t.numel() * t.element_size(), t.is_cuda, sync,
                _meta(t, kind, group, chunk, like), _stream_of(t))

    def _held(self):
        """A survivor of a restart in place offers the state it holds, as (region name, host tensor): the restore
        takes each range whose bytes here match the checkpoint's checksum from here and reads only the others. A
        fresh process (a spare, a requeue) offers nothing: its optimizer has no state yet, and hashing its new
        weights would find nothing."""
        first = os.environ.get(_ENV["inplace_generation_base"], "0")
        if os.environ.get(_ENV["generation"], "0") == first or not _state_from_memory():
            return []
        if self.optimizer is not None and not any(self._state_optimizer.state.values()):
            return []
        held = [(_MODEL + name, t.detach()) for name, t in self.model.state_dict(keep_vars=True).items()]
        if self.optimizer is not None:
            for index, entry in self._state_optimizer.state_dict()["state"].items():
                held += [(self._optim_region(index, key), value.detach()) for key, value in entry.items()
                         if torch.is_tensor(value)]
        return [(name, t) for name, t in held if not t.is_cuda and t.is_contiguous()]

    def _handover(self, held):
        """Restart in place: a survivor sends what it holds to the recipients it is the donor of (the core decides
        who, restart.handover): its own state, or the partner copy it holds of the lost rank's whole shard; a
        recipient (a replacement, or a survivor behind the plan's step) receives its donor's, which restore()
        checks against the checkpoint's checksums as it checks a survivor's own memory. Over the generation's
        process group."""
        if not _state_from_memory():
            _drop_memory_copies()  # gigabytes a survivor would otherwise hold to the end
            return []
        sends, donor = _handover(self._native.config["layout"])
        for to, items in sends:
            items = held if items is None else items
            header = json.dumps([[name, t.numel() * t.element_size()] for name, t in items]).encode()
            torch.distributed.send(torch.tensor([len(header)], dtype=torch.int64), to)
            torch.distributed.send(torch.frombuffer(bytearray(header), dtype=torch.uint8), to)
            for _, t in items:
                if t.numel():
                    torch.distributed.send(t.reshape(-1).view(torch.uint8), to)
        if donor is None:
            return []
        size = torch.zeros(1, dtype=torch.int64)
        torch.distributed.recv(size, donor)
        header = torch.empty(int(size.item()), dtype=torch.uint8)
        torch.distributed.recv(header, donor)
        received = []
        for name, nbytes in json.loads(bytes(header.numpy()).decode()):
            buf = torch.empty(int(nbytes), dtype=torch.uint8)
            if nbytes:
                torch.distributed.recv(buf, donor)
            received.append((str(name), buf))
        return received

    def _register(self, loaded=False):
        """The regions, to the native side when they changed. `loaded`: restore() has loaded the state, and says
        so: staging, held back until then, grows now."""
        regions = self._regions()
        signature = tuple(r[:5] for r in regions)
        if signature != self._signature or loaded:
            self._native.set_regions(regions)
            self._signature = signature

    def _optimizer_meta(self):
        sd = self._state_optimizer.state_dict()
        state = {index: {key: (_Ref(self._optim_region(index, key)) if torch.is_tensor(value) else value)
                         for key, value in entry.items()}
                 for index, entry in sd["state"].items()}
        return {"state": state, "param_groups": sd["param_groups"]}

    def _user_extra(self):
        if self.extra is None:
            return None
        if _has_state_dict(self.extra):
            return _without_code(self.extra.state_dict())
        return {key: (_without_code(value.state_dict()) if _has_state_dict(value) else value)
                for key, value in self.extra.items()}

    def _put_extras(self, step):
        if self.optimizer is not None:
            self._native.put_blob(_OPTIM_META, _dumps(self._optimizer_meta()))
        extras = {"step": step, "rng": _rng_state(), "user": self._user_extra()}
        self._native.put_blob(_EXTRA, _dumps(extras))

    # ---- the loop ---------------------------------------------------------------------------------------------

    def restore(self):
        """Loads the newest complete checkpoint that verifies (walking back past bad ones) into the model, the
        optimizer, the RNGs and `extra`. Returns the step to resume from: the loop runs `range(start, total)`.
        Returns 0 when there is no checkpoint. Call it once, before the first step."""
        n = self._native
        if not n.enabled:
            return 0
        zero = _zero(self.optimizer)
        # ZeRO-1: the ranges of this rank's partition, wherever they lie (another world size: other ranks' shards).
        prefixes = [f"{_OPTIM}{g}/" for g in self._global_indices()] if zero is not None else []
        own = self._held()
        received = self._handover(own)  # what a donor sent: restored() points into it until the state is loaded
        kept = _own_copy() if _state_from_memory() else []  # after `own`: a range comes from there first
        live = [(name, t.data_ptr(), t.numel() * t.element_size()) for name, t in own + kept + received]
        step = n.restore(copy_into_regions=False, reshard_prefixes=prefixes, live=live)
        if step == 0:
            self._register(loaded=True)
            _note_phase("restored", 0)
            return 0
        regions = {name: (json.loads(meta), view, address) for name, meta, view, address in n.restored()}

        def need(name):
            if name not in regions:
                raise Error(f"ckpt: the checkpoint of step {step} has no '{name}'")
            return regions[name]

        # Everything is read and checked before anything is loaded: a refused checkpoint changes nothing.
        meta = _loads(bytes(need(_OPTIM_META)[1]), "optimizer state", step) if self.optimizer is not None else None
        extras = _loads(bytes(need(_EXTRA)[1]), "extras", step)
        if not isinstance(extras, dict) or extras.get("step") != step:
            raise Error(f"ckpt: the checkpoint of step {step} holds extras of step "
                        f"{extras.get('step') if isinstance(extras, dict) else '?'}")
        # A survivor's tensors whose own bytes the restore took (restored() points at them) hold the state already.
        mine = {name for name, t in own if name in regions and regions[name][2] == t.data_ptr()}
        target = self.model.state_dict(keep_vars=True)
        loaded = {name: target[name] if _MODEL + name in mine else _tensor_from(need(_MODEL + name), copy=False)
                  for name in target}
        self.model.load_state_dict(loaded)
        refs = [v.name for entry in meta["state"].values() for v in entry.values()
                if isinstance(v, _Ref)] if meta is not None else []
        # The optimizer (ZeRO-1: this rank's partition) is left as it is when every state tensor is its own and the
        # rest (hyperparameters, values that are no tensor) equals what the checkpoint holds.
        if meta is None or (refs and all(r in mine for r in refs) and meta == self._optimizer_meta()):
            pass
        elif zero is not None:
            self._load_partition(meta, regions, step)
        else:
            state = {index: {key: (_tensor_from(need(value.name), copy=False) if isinstance(value, _Ref)
                                   else value)
                             for key, value in entry.items()}
                     for index, entry in meta["state"].items()}
            self._state_optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        _set_rng_state(extras["rng"])
        self._load_user_extra(extras["user"])
        # The memory the state came from (a survivor's last snapshots, a donor's copy) is let go before staging
        # grows: a survivor never holds both.
        del own, kept, received, regions, loaded
        self._register(loaded=True)  # the optimizer's state tensors may be new
        _note_phase("restored", step)
        return step

    def _load_user_extra(self, user):
        """`extra` as the checkpoint holds it: through load_state_dict where it (or an entry of it) has one."""
        if self.extra is None or user is None:
            return
        if _has_state_dict(self.extra):
            self.extra.load_state_dict(user)
            return
        for key, value in user.items():
            current = self.extra.get(key)
            if _has_state_dict(current):
                current.load_state_dict(value)
            else:
                self.extra[key] = value

    def _time_forward(self, model):
        """A DistributedDataParallel model's own forward pass is local work (DDP's collectives run outside it, in
        its wrapper and in backward): timed for the straggler detection without the program marking it."""
        ddp = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
        if ddp is None or not isinstance(model, ddp):
            return
        started = []

        def pre(_module, _inputs):
            started.append(time.perf_counter())

        def post(_module, _inputs, _output):
            if started:
                self._native.time_section(time.perf_counter() - started.pop())

        model.module.register_forward_pre_hook(pre)
        model.module.register_forward_hook(post)

    @contextlib.contextmanager
    def section(self):
        """Times this step's own work for the straggler detection (CKPT_STRAGGLER): wrap what runs no collective,
        e.g. the forward and backward passes when gradients are all-reduced after them. The update between
        before_update() and after_step() is timed anyway."""
        started = time.perf_counter()
        try:
            yield
        finally:
            if self._native.enabled:
                self._native.time_section(time.perf_counter() - started)

    def before_update(self):
        """The guard: call right before optimizer.step() (and any other in-place change of saved state). Blocks
        only while the snapshot of the previous checkpoint is still copying."""
        self._native.before_update()

    def after_step(self, step):
        """Call after each optimizer.step() with the number of completed steps. Takes a checkpoint when one is due
        (every rank at the same step). Returns True when the loop should stop: a terminal checkpoint was taken
        because the job is within CKPT_GRACE of its time limit, or SIGTERM/SIGUSR1/SIGUSR2 arrived (on any rank).
        Then leave the loop, call close(), and exit normally. (A rank whose request came too late to take that
        checkpoint stops too, and its close() raises saying so.)"""
        n = self._native
        _note_phase("first_step")
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

    def last_words(self):
        """What the last words did on this rank (a dict: triggered, done, lost_peer, lost, committed, step, root,
        detect_unix, ...); any thread may call it."""
        return self._native.last_words() if self._native.enabled else {}

    def abort(self):
        """After a training error (a collective failed because a peer died): closes without waiting for other
        ranks. With last words on, it first lets this rank take part in the survivors' terminal checkpoint."""
        self._native.abort()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# Restart in place (slurm_ckpt/restart.py): imported last, as it reads the Checkpointers this module makes.
from .restart import note_checkpointer as _note_checkpointer  # noqa: E402
from .restart import note_phase as _note_phase  # noqa: E402
from .restart import handover as _handover  # noqa: E402
from .restart import own_copy as _own_copy  # noqa: E402
from .restart import drop_memory_copies as _drop_memory_copies  # noqa: E402
from .restart import init_process_group, run  # noqa: E402,F401
