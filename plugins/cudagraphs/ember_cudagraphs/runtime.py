"""Record a compiled ATen graph's callable into CUDA graphs and replay it, safely.

One :class:`CUDAGraphed` wraps one callable (a forward, backward or inference graph). Per input
signature (shapes, dtypes, devices, int values) it

1. runs the callable eagerly once, on a side stream (the warm-up: lazy library initialisation,
   cuBLAS workspaces, autotuning, all outside the capture), and returns that run's outputs;
2. on the next call with that signature, records it into a ``torch.cuda.CUDAGraph`` and replays;
3. afterwards replays: user inputs are copied into the recording's static buffers, parameters and
   buffers (and outputs of other recordings, e.g. the activations a forward saved for its
   backward) are read in place, their addresses checked on every call.

**Memory.** All recordings of one compiled function (its forward, backward and inference graphs,
every shape) share one memory pool (:class:`Pool`). A recording keeps its output tensors (the
*static* outputs) for its lifetime, so later recordings never reuse their memory; what later
recordings may reuse is the memory an earlier recording used for its temporaries.

**Outputs.** Each replay hands out new tensors over the static outputs' memory, on a storage of
their own that does not own that memory. A replay may overwrite: its own earlier outputs, and the
outputs of recordings made after it (they may sit in its temporaries). Before replaying, those
that are still referenced are handled by generation, as torch's CUDA graph trees do:

* from an earlier *step*: their storage is invalidated, and any later access raises an error that
  says to clone the output or call ``ember.cudagraph_mark_step_begin()``;
* from the current step (a forward called twice before its backward, say): the call runs
  without CUDA graphs instead, so nothing is overwritten.

A step begins at every ``ember.cudagraph_mark_step_begin()``, and when an inference or forward
graph of the pool is called while no backward is pending in it (no activation saved for a
recorded backward is still referenced). Every replay therefore reads current memory and never
hands out a value that can change later: an output is either valid or raises on access.

**Addresses.** A parameter whose address changed (replaced, ``load_state_dict(assign=True)``,
``.to()``, an optimizer swapping tensors) retires the recording and records again; an in-place
input that is another recording's output at a new address (its producer ran without graphs this
time) makes this call run without graphs.

The device-specific calls go through :class:`CudaOps`, which tests replace with a CPU fake to
check this bookkeeping without a GPU.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import weakref
from typing import Any, Callable, Sequence

import torch

log = logging.getLogger("ember.cudagraphs")

__all__ = ["CUDAGraphed", "Pool", "CudaOps", "for_graph", "DEFAULT_MAX_RECORDINGS",
           "OVERWRITTEN_MESSAGE"]

DEFAULT_MAX_RECORDINGS = 16

OVERWRITTEN_MESSAGE = (
    "ember cudagraphs: this tensor is an output of a CUDA graph replay of {graph} and its memory "
    "has since been overwritten by a later replay ({why}). Clone an output you keep across "
    "steps (out.clone()); call ember.cudagraph_mark_step_begin() only where a step really "
    "begins. A parameter's .grad kept from an earlier step: use "
    "optimizer.zero_grad(set_to_none=True) before each backward.")


_api: Any = None


def _global_step() -> int:
    """How many times ``ember.cudagraph_mark_step_begin()`` was called."""
    global _api
    if _api is None:
        from ember import api
        _api = api
    return _api._cudagraph_steps


# ---- device operations ---------------------------------------------------------------------

class CudaOps:
    """The CUDA calls the runtime makes (one place, replaced by a fake in CPU tests)."""

    def __init__(self) -> None:
        self._streams: dict[int, Any] = {}
        self._make = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)

    def new_pool(self, device: torch.device) -> Any:
        with torch.cuda.device(device):
            return torch.cuda.graph_pool_handle()

    def side_stream(self, device: torch.device) -> Any:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        s = self._streams.get(idx)
        if s is None:
            s = self._streams[idx] = torch.cuda.Stream(device=idx)
        return s

    @staticmethod
    def clear_workspaces() -> None:
        """Drop cuBLAS's cached workspaces (one per handle and stream, kept by torch between
        calls). A capture that found one would bake its address into the graph while torch
        still owns it: freed by anyone who clears them (torch's CUDA graph trees do, around each
        of their recordings), it goes back to the allocator, another tensor gets it, and every
        replay writes cuBLAS's scratch over that tensor (the GPT-2 training crash with three
        CUDA-graph backends in one process). Cleared before a warm-up or capture, the capture
        allocates its workspace in the graph's pool; cleared after, that workspace is a
        temporary of the graph, like its other intermediates (what torch's trees do too)."""
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()

    @contextlib.contextmanager
    def warmup(self, device: torch.device) -> Any:
        """Run the body on the side stream (the one captures use), ordered after the work
        queued so far, and make the caller's stream wait for it."""
        s = self.side_stream(device)
        cur = torch.cuda.current_stream(device)
        s.wait_stream(cur)
        try:
            with torch.cuda.stream(s):
                self.clear_workspaces()
                try:
                    yield
                finally:
                    self.clear_workspaces()
        finally:
            cur.wait_stream(s)

    def record(self, fn: Callable[..., Any], args: Sequence[Any], pool: Any,
               device: torch.device, gens: Sequence[torch.Generator]) -> tuple[Any, Any]:
        """Capture ``fn(*args)``; returns (graph, outputs). The outputs hold garbage until the
        first replay."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.device(device):
            for g in gens:
                graph.register_generator_state(g)
            self.clear_workspaces()
            try:
                with torch.cuda.graph(graph, pool=pool, stream=self.side_stream(device),
                                      capture_error_mode="thread_local"):
                    outs = fn(*args)
            finally:
                self.clear_workspaces()
        return graph, outs

    def replay(self, graph: Any) -> None:
        graph.replay()

    def ptrs_equal(self, args: Sequence[Any], ptrs: list[int], idx: list[int]) -> bool:
        """``args[i].data_ptr() == ptrs[i]`` for every i in idx (in C++ where torch has it)."""
        same = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
        if same is not None:
            return same(list(args), ptrs, idx)
        return all(args[i].data_ptr() == ptrs[i] for i in idx)

    def is_capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def tensor(self, storage: Any, meta: dict[str, Any]) -> torch.Tensor:
        """A tensor over ``storage`` with the geometry in ``meta``."""
        make = self._make
        if make is not None and meta["device"].type == "cuda":
            return make(meta, storage)
        t = torch.empty(0, dtype=meta["dtype"], device=meta["device"])
        return t.set_(storage, meta["storage_offset"], meta["size"], meta["stride"])

    def alias_storage(self, static: torch.UntypedStorage, device: torch.device) -> Any:
        """A storage over ``static``'s memory that does not own it."""
        return torch._C._construct_storage_from_data_pointer(static.data_ptr(), device,
                                                             static.nbytes())

    def kill(self, cdata: int, message: str) -> None:
        """Make every access to the storage (weak cdata) raise ``message``."""
        torch._C._set_storage_data_ptr_access_error_msg(cdata, message)

    def available(self) -> str | None:
        for name in ("_construct_storage_from_data_pointer",
                     "_set_storage_data_ptr_access_error_msg"):
            if not hasattr(torch._C, name):
                return f"this torch build has no torch._C.{name}"
        return None


_OPS: list[Any] = [None]


def ops() -> Any:
    if _OPS[0] is None:
        _OPS[0] = CudaOps()
    return _OPS[0]


def set_ops(o: Any) -> Any:
    """Replace the device operations (tests); returns the previous ones."""
    prev, _OPS[0] = _OPS[0], o
    return prev


# ---- pools, live outputs ---------------------------------------------------------------------

class _Live:
    """One handed-out storage: which recording and static storage it views, and when."""

    __slots__ = ("ref", "rec", "group", "step", "gen", "graph")

    def __init__(self, ref: Any, rec: "Recording", group: int, step: int, gen: int):
        self.ref, self.rec, self.group, self.step, self.gen = ref, rec, group, step, gen
        self.graph = rec.name

    def alive(self) -> bool:
        return not self.ref.expired()


def _kill_all(live: list[_Live], ops_: Any, why: str) -> None:
    for e in live:
        if e.alive():
            with contextlib.suppress(Exception):
                ops_.kill(e.ref.cdata, OVERWRITTEN_MESSAGE.format(graph=e.graph, why=why))
    live.clear()


class Pool:
    """The memory pool shared by one compiled function's recordings, and the outputs its
    replays handed out that may still be referenced."""

    def __init__(self, name: str, device: torch.device):
        self.name = name
        self.device = device
        self.handle: Any = None  # created on the first recording
        self.live: list[_Live] = []
        self.order = itertools.count()
        self.gen = 0
        self.step = _global_step()
        # memory of the storages we point at must outlive them: if the pool goes away (reset,
        # garbage collection), what is still referenced is invalidated, never left dangling
        weakref.finalize(self, _kill_all, self.live, ops(),
                         "the compiled function was freed (ember.reset() or garbage collection)")

    def get_handle(self) -> Any:
        if self.handle is None:
            self.handle = ops().new_pool(self.device)
        return self.handle

    def prune(self) -> None:
        if self.live and not all(e.alive() for e in self.live):
            self.live[:] = [e for e in self.live if e.alive()]

    def pending_backward(self) -> bool:
        """Is an activation saved for a recorded backward still referenced?"""
        return any(e.group in e.rec.saved_groups and e.alive() for e in self.live)

    def begin_step_if_needed(self, kind: str) -> None:
        self.prune()
        g = _global_step()
        if g != self.step:
            self.step = g
            self.gen += 1
        elif kind in ("inference", "forward") and not self.pending_backward():
            self.gen += 1

    def conflicts(self, rec: "Recording") -> list[_Live]:
        """Referenced outputs a replay of ``rec`` may overwrite: its own, and those of every
        recording made after it (they may lie in its temporaries)."""
        return [e for e in self.live if (e.rec is rec or e.rec.order > rec.order) and e.alive()]

    def current(self, e: _Live) -> bool:
        return e.gen == self.gen and e.step == self.step


#: every live CUDAGraphed (tests, debugging: their ``stats`` say how each call ran)
ALL: "weakref.WeakSet[CUDAGraphed]" = weakref.WeakSet()

#: (forward graph id, device) -> weakref to its CUDAGraphed: the backward compiled right after
#: it (AOT autograd compiles a training variant's two graphs together) shares its pool
_FORWARDS: dict[tuple[str, str], Any] = {}
_FORWARDS_LOCK = threading.Lock()


def _forward_id(backward_id: str) -> str | None:
    head, _, last = backward_id.rpartition(".")
    if not head or not last.startswith("backward"):
        return None
    return f"{head}.forward{last[len('backward'):]}"


def for_graph(fn: Callable[..., Any], *, name: str, kind: str, device: torch.device,
              inputs: Sequence[Any] = (), **kw: Any) -> "CUDAGraphed":
    """A :class:`CUDAGraphed` for one ATen graph named ``name`` (its CompileContext graph id) of
    ``kind`` "inference", "forward" or "backward", whose placeholders are described by
    ``inputs`` (InputInfos). A backward shares the pool of its forward (compiled just before
    it) and tells it which of its outputs are saved activations (the last ones); every other
    graph gets a pool of its own."""
    sibling = None
    if kind == "backward":
        fid = _forward_id(name)
        ref = _FORWARDS.get((fid, str(device))) if fid else None
        sibling = ref() if ref is not None else None
    pool = sibling.pool if sibling is not None else Pool(name.rpartition(".")[0] or name, device)
    static = [i for i, inf in enumerate(inputs) if getattr(inf, "stable_address", False)]
    g = CUDAGraphed(fn, name=name, kind=kind, pool=pool, static_inputs=static, **kw)
    if kind == "forward":
        with _FORWARDS_LOCK:
            for k in [k for k, r in _FORWARDS.items() if r() is None]:
                del _FORWARDS[k]
            _FORWARDS[(name, str(device))] = weakref.ref(g)
    if sibling is not None and inputs:
        sibling.saved_tail = sum(1 for inf in inputs if inf.kind != "tangent")
        g.sibling = weakref.ref(sibling)
    return g


#: static output storage data_ptr -> (weakref to its Recording, group): lets a graph whose
#: input is another recording's output (a backward reading saved activations) read it in place
_STATIC: dict[int, tuple[Any, int]] = {}


def _static_owner(t: torch.Tensor) -> tuple["Recording", int] | None:
    try:
        ptr = t.untyped_storage().data_ptr()
    except Exception:
        return None
    hit = _STATIC.get(ptr)
    if hit is None:
        return None
    rec = hit[0]()
    if rec is None or rec.retired:
        return None
    return rec, hit[1]


# ---- one recording ---------------------------------------------------------------------------

class Recording:
    """One CUDA graph: static inputs, static outputs, how outputs are handed out."""

    def __init__(self, name: str, key: Any, order: int):
        self.name = name
        self.key = key
        self.order = order
        self.graph: Any = None
        self.retired = False
        # (input index, data_ptr, stride, kind, shape) for inputs read in place ("param"/"pool")
        self.in_place: list[tuple[int, int, tuple[int, ...], str, Any]] = []
        # as checked per call: the parameters' positions, the positions of every input read in
        # place (parameters, then other recordings' outputs), and data_ptr by position
        self.param_idx: list[int] = []
        self.ptr_idx: list[int] = []
        self.ptrs: list[int] = []
        # (input index, data_ptr, stride, shape, weakref to the producing Recording)
        self.pool_in_place: list[tuple[int, int, tuple[int, ...], Any, Any]] = []
        # (input index, static buffer) for inputs copied before each replay
        self.copied: list[tuple[int, torch.Tensor]] = []
        self.static_outs: list[Any] = []
        # per output: ("const", v) | ("arg", j) | ("argview", j, size, stride, delta, astride)
        #             | ("pool", group, {size, stride, storage_offset, dtype, device, ...})
        self.plan: list[tuple[Any, ...]] = []
        self.groups: list[torch.UntypedStorage] = []  # static storages (owning), by group
        self.saved_groups: set[int] = set()  # groups a recorded backward reads in place
        self.saved_kinds: list[str] = []  # plan tags of the outputs saved for the backward
        self.argview_checks: list[tuple[int, tuple[int, ...]]] = []

    def retire(self) -> None:
        self.retired = True
        self.graph = None
        for st in self.groups:
            hit = _STATIC.get(st.data_ptr())
            if hit is not None and hit[0]() is self:
                del _STATIC[st.data_ptr()]


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (an ``empty_strided`` of its strides can be copied into)."""
    try:
        return t._is_non_overlapping_and_dense() if hasattr(t, "_is_non_overlapping_and_dense") \
            else t.is_contiguous()
    except Exception:
        return t.is_contiguous()


def _key(args: Sequence[Any], idx: Sequence[int] | None = None) -> Any:
    """What selects a recording: shapes, dtypes, devices of the inputs at ``idx`` (default
    all) and values of the scalars. Parameters and buffers are left out: Ember's guards check
    them, and the recording checks their addresses."""
    k: list[Any] = []
    for i in (range(len(args)) if idx is None else idx):
        a = args[i]
        if isinstance(a, torch.Tensor):
            k.append((tuple(a.shape), a.dtype, a.device))
        elif isinstance(a, (int, float, bool, str)) or a is None:
            k.append((type(a).__name__, a))
        else:
            k.append(type(a).__name__)
    return tuple(k)


def _warm_key(key: Any) -> Any:
    """A recording key without devices: what the warm-up is for (library state for these
    shapes) does not depend on where an input is. A backward gets SDPA's philox seed and offset
    on the CPU from an eager forward and on the GPU from a recorded one (a new key), and needs
    no second warm-up for that."""
    return tuple(k[:2] if isinstance(k, tuple) and len(k) == 3 and isinstance(k[2], torch.device)
                 else k for k in key)


class CUDAGraphed:
    """The callable the cudagraphs backend (and ``mode="reduce-overhead"``) returns."""

    _ember_cudagraphs = True

    def __init__(self, fn: Callable[..., Any], *, name: str, kind: str, pool: Pool,
                 static_inputs: Sequence[int] = (), max_recordings: int = DEFAULT_MAX_RECORDINGS,
                 refused: str | None = None, generators: Sequence[torch.Generator] = (),
                 constants: Sequence[torch.Tensor] = ()):
        self.fn = fn
        self.name = name
        self.kind = kind
        self.pool = pool
        self.static_inputs = frozenset(static_inputs)
        self.max_recordings = max_recordings
        self.refused = refused
        self.generators = list(generators)
        self.constant_ptrs = {c.untyped_storage().data_ptr() for c in constants
                              if isinstance(c, torch.Tensor)}
        self.recordings: dict[Any, Recording] = {}
        self._key_idx: Any = None  # (a list as long as the inputs, positions in the key)
        #: forward: how many trailing outputs are saved for the backward (set by the backward)
        self.saved_tail = 0
        #: backward: its forward (weakref); its first inputs are that forward's saved outputs
        self.sibling: Any = None
        self.warmed: set[Any] = set()
        self._deferred = 0  # backward: calls run as is, waiting for in-place activations
        self.failed: dict[Any, str] = {}  # key -> why it runs without graphs
        self.n_recorded = 0
        self._warned: set[str] = set()
        #: counters (tests and logs): calls per way of running
        self.stats = {"warmup": 0, "record": 0, "replay": 0, "eager": 0, "killed": 0}
        if refused:
            log.info("ember cudagraphs: %s runs without CUDA graphs: %s", name, refused)
        ALL.add(self)

    # -- helpers --------------------------------------------------------------------------
    def _once(self, tag: str, level: int, msg: str, *args: Any) -> None:
        if tag not in self._warned:
            self._warned.add(tag)
            log.log(level, msg, *args)

    def _eager(self, args: Sequence[Any]) -> Any:
        self.stats["eager"] += 1
        return self.fn(*args)

    # -- the call -------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        if self.refused is not None:
            return self._eager(args)
        try:
            return self._call(args)
        except Exception as e:
            return self._internal_failure(e, args)

    def _internal_failure(self, e: Exception, args: Sequence[Any]) -> Any:
        """Something failed on the graphed path: run as is. If that works, the failure was
        ours: this graph runs without CUDA graphs from now on, with the reason logged; if it
        fails too, it is the program's error and propagates."""
        out = self._eager(args)
        self.refused = f"internal error: {type(e).__name__}: {e}"
        log.warning("ember cudagraphs: %s runs without CUDA graphs from now on after an internal "
                    "error: %s: %s", self.name, type(e).__name__, e,
                    exc_info=log.isEnabledFor(logging.DEBUG))
        for rec in list(self.recordings.values()):
            self._retire(rec)
        return out

    def _call(self, args: Sequence[Any]) -> Any:
        o = ops()
        if o.is_capturing():  # inside the user's own capture: be captured as ordinary work
            return self.fn(*args)
        if self._key_idx is None or len(self._key_idx[0]) != len(args):
            self._key_idx = ([None] * len(args),
                             [i for i in range(len(args)) if i not in self.static_inputs])
        key = _key(args, self._key_idx[1])
        rec = self.recordings.get(key)
        if rec is not None:
            status = self._check_inputs(rec, args)
            if status == "ok":
                return self._replay(rec, args)
            if status == "pool":  # a producer ran without graphs: its outputs moved
                self._once("moved", logging.DEBUG, "ember cudagraphs: %s: an input that is "
                           "another graph's output is not where it was recorded; running "
                           "without CUDA graphs for this call", self.name)
                return self._eager(args)
            # a parameter or buffer moved: the recording reads stale memory; record again
            log.info("ember cudagraphs: %s: %s; recording again", self.name, status)
            self._retire(rec)
            return self._record_or_eager(key, args)
        if key in self.failed:
            return self._eager(args)
        if _warm_key(key) not in self.warmed:
            if self.n_recorded >= self.max_recordings:
                return self._over_limit(key, args)
            return self._warmup(key, args)
        return self._record_or_eager(key, args)

    def _over_limit(self, key: Any, args: Sequence[Any]) -> Any:
        self.failed[key] = "recording limit"
        self._once("limit", logging.WARNING,
                   "ember cudagraphs: %s has recorded %d CUDA graphs (max_recordings=%d: one "
                   "per input shape, and again when a parameter moves); new shapes run without "
                   "CUDA graphs. Ways out: mark the varying dimension dynamic "
                   "(ember.mark_dynamic) or pad inputs to a few sizes, or raise the limit with "
                   "ember.compile(..., options={'max_recordings': N}).",
                   self.name, self.n_recorded, self.max_recordings)
        return self._eager(args)

    def _warmup(self, key: Any, args: Sequence[Any]) -> Any:
        self.stats["warmup"] += 1
        self.warmed.add(_warm_key(key))
        dev = self.pool.device
        with ops().warmup(dev):
            return self.fn(*args)

    def _retire(self, rec: Recording) -> None:
        rec.retire()
        self.recordings.pop(rec.key, None)

    def _check_inputs(self, rec: Recording, args: Sequence[Any]) -> str:
        """Parameters and buffers: their addresses (their shapes are Ember's guards'); other
        recordings' outputs read in place: address, geometry, and that they are still ours."""
        # every address at once (one C++ call): parameters, then other recordings' outputs
        if rec.ptr_idx and ops().ptrs_equal(args, rec.ptrs, rec.ptr_idx):
            # all where they were recorded: the outputs read in place need their geometry and
            # a producer still live (its storages are then still its own, so still ours)
            for i, _, stride, shape, producer in rec.pool_in_place:
                a = args[i]
                p = producer()
                if p is None or p.retired:
                    return (f"input {i} came from a recording that was since replaced (its "
                            "parameters moved)")
                if a.stride() != stride or a.shape != shape:
                    return "pool"
            return "ok"
        if rec.param_idx and not ops().ptrs_equal(args, rec.ptrs, rec.param_idx):
            moved = [i for i in rec.param_idx if args[i].data_ptr() != rec.ptrs[i]]
            return (f"input {moved[0] if moved else '?'} (a parameter or buffer) moved since "
                    "the recording (replaced, .to(), load_state_dict(assign=True), or an "
                    "optimizer that swaps tensors)")
        for i, ptr, stride, shape, producer in rec.pool_in_place:
            a = args[i]
            if a.data_ptr() != ptr or a.stride() != stride or a.shape != shape or \
                    _static_owner(a) is None:
                p = producer()
                if p is None or p.retired:
                    return (f"input {i} came from a recording that was since replaced (its "
                            "parameters moved)")
                return "pool"
        return "ok"

    # -- recording ------------------------------------------------------------------------
    def _record_or_eager(self, key: Any, args: Sequence[Any]) -> Any:
        if self.n_recorded >= self.max_recordings:
            return self._over_limit(key, args)
        if self._deferred < 3 and self._activations_elsewhere(args):
            # its forward is recorded but ran without graphs this time: record when the saved
            # activations are the forward's outputs (read in place, not copied every call);
            # after a few such calls, record anyway (copying them)
            self._deferred += 1
            return self._eager(args)
        try:
            rec = self._record(key, args)
        except Exception as e:  # capture failed: this signature runs as it is from now on
            self.failed[key] = f"{type(e).__name__}: {e}"
            log.warning("ember cudagraphs: recording %s failed; it runs without CUDA graphs for "
                        "these input shapes: %s: %s", self.name, type(e).__name__, e)
            return self._eager(args)
        return self._replay(rec, args, first=True)

    def _activations_elsewhere(self, args: Sequence[Any]) -> bool:
        """Backward: are saved activations that the recorded forward keeps in its pool
        somewhere else this time (that forward ran without graphs)?"""
        fw = self.sibling() if self.sibling is not None else None
        if fw is None or not fw.recordings or fw.refused is not None:
            return False
        kinds = next(iter(fw.recordings.values())).saved_kinds
        # (an empty tensor has no memory to find: cuDNN batch norm's reserve space)
        elsewhere = [i for i, kind in enumerate(kinds)
                     if kind == "pool" and i < len(args) and isinstance(args[i], torch.Tensor)
                     and args[i].numel() > 0 and _static_owner(args[i]) is None]
        if elsewhere:
            log.debug("ember cudagraphs: %s: saved activations %s are not in the forward's "
                      "recording; running as is for this call", self.name, elsewhere[:8])
        return bool(elsewhere)

    def _record(self, key: Any, args: Sequence[Any]) -> Recording:
        o = ops()
        dev = self.pool.device
        rec = Recording(self.name, key, -1)
        static_args: list[Any] = []
        for i, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                static_args.append(a)
                continue
            if a.device != dev and not (a.device.type == dev.type and dev.index is None):
                raise RuntimeError(f"input {i} is on {a.device}, the graph on {dev}")
            owner = _static_owner(a)
            if i in self.static_inputs or owner is not None:
                kind = "param" if owner is None else "pool"
                rec.in_place.append((i, a.data_ptr(), a.stride(), kind, a.shape))
                if owner is not None:
                    rec.pool_in_place.append((i, a.data_ptr(), a.stride(), a.shape,
                                              weakref.ref(owner[0])))
                if owner is not None and self.kind == "backward" and not owner[0].saved_kinds:
                    owner[0].saved_groups.add(owner[1])  # (no word from AOT on what is saved)
                static_args.append(a)
            else:
                # not an inference tensor even under inference_mode: later calls copy into it
                with torch.inference_mode(False), torch.no_grad():
                    buf = (torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                           if _dense(a) else torch.empty(a.shape, dtype=a.dtype, device=a.device))
                    buf.copy_(a)
                rec.copied.append((i, buf))
                static_args.append(buf)
        rec.param_idx = [r[0] for r in rec.in_place if r[3] == "param"]
        rec.ptr_idx = rec.param_idx + [r[0] for r in rec.pool_in_place]
        rec.ptrs = [0] * len(args)
        for r in rec.in_place:
            rec.ptrs[r[0]] = r[1]
        graph, outs = o.record(self.fn, static_args, self.pool.get_handle(), dev, self.generators)
        rec.graph = graph
        rec.order = next(self.pool.order)
        self._plan_outputs(rec, outs, static_args)
        self.n_recorded += 1
        self.stats["record"] += 1
        self.recordings[key] = rec
        log.debug("ember cudagraphs: recorded %s for %s (%d in place, %d copied inputs, "
                  "%d outputs)", self.name, key, len(rec.in_place), len(rec.copied),
                  len(rec.plan))
        return rec

    def _plan_outputs(self, rec: Recording, outs: Any, static_args: Sequence[Any]) -> None:
        if not isinstance(outs, (tuple, list)):
            raise TypeError(f"the compiled graph returned {type(outs).__name__}, expected a "
                            "tuple or list")
        rec.out_type = type(outs)  # type: ignore[attr-defined]
        arg_storage: dict[int, int] = {}
        for j, a in enumerate(static_args):
            if isinstance(a, torch.Tensor):
                arg_storage.setdefault(a.untyped_storage().data_ptr(), j)
        # outputs saved for the backward get storages of their own even where they share
        # memory with outputs the caller gets: a kept output then does not look like a
        # pending backward (and both are invalidated together: they conflict alike)
        group_of: dict[tuple[int, bool], int] = {}
        saved_from = len(outs) - self.saved_tail if self.saved_tail else len(outs)
        for k, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                rec.plan.append(("const", o))
                continue
            j = next((j for j, a in enumerate(static_args) if a is o), None)
            if j is not None:
                rec.plan.append(("arg", j))
                continue
            sptr = o.untyped_storage().data_ptr()
            if sptr in arg_storage:
                j = arg_storage[sptr]
                a = static_args[j]
                rec.plan.append(("argview", j, tuple(o.shape), tuple(o.stride()),
                                 o.storage_offset() - a.storage_offset(), tuple(a.stride())))
                continue
            if sptr in self.constant_ptrs:
                rec.plan.append(("const", o))
                continue
            if o.device != self.pool.device and not (
                    o.device.type == self.pool.device.type and self.pool.device.index is None):
                # made on the host during the capture: a replay would not make it again
                raise RuntimeError(f"output {k} is a {o.device} tensor made while recording; a "
                                   "replay would not compute it again")
            saved = k >= saved_from
            g = group_of.get((sptr, saved))
            if g is None:
                g = group_of[(sptr, saved)] = len(rec.groups)
                rec.groups.append(o.untyped_storage())
            if saved:
                rec.saved_groups.add(g)
            st = o.untyped_storage()
            rec.plan.append(("pool", g, {
                "nbytes": st.nbytes(), "data_ptr": st.data_ptr(), "size": o.shape,
                "stride": o.stride(), "dtype": o.dtype, "device": o.device,
                "storage_offset": o.storage_offset()}))
        rec.static_outs = [o for o in outs if isinstance(o, torch.Tensor)]
        rec.saved_kinds = [p[0] for p in rec.plan[saved_from:]]
        rec.argview_checks = [(p[1], p[5]) for p in rec.plan if p[0] == "argview"]
        for g, st in enumerate(rec.groups):
            if st.nbytes():  # (empty storages all sit at address 0)
                _STATIC[st.data_ptr()] = (weakref.ref(rec), g)

    # -- replay ---------------------------------------------------------------------------
    def _replay(self, rec: Recording, args: Sequence[Any], first: bool = False) -> Any:
        o = ops()
        pool = self.pool
        pool.begin_step_if_needed(self.kind)
        conflicts = pool.conflicts(rec)
        busy = [e for e in conflicts if pool.current(e)]
        if busy:
            self._once("busy", logging.WARNING,
                       "ember cudagraphs: %s runs without CUDA graphs for this call (and others "
                       "like it): outputs of an earlier call in the same step are still "
                       "referenced and a replay would overwrite them: a forward called again "
                       "before its backward ran (gradient accumulation, or a forward under grad "
                       "mode that is never differentiated: use torch.no_grad()). Call "
                       "ember.cudagraph_mark_step_begin() where a step begins if those outputs "
                       "are no longer needed.", self.name)
            return self._eager(args)
        # argview outputs of copied inputs need the caller's tensor laid out as the buffer
        for j, astride in rec.argview_checks:
            if args[j].stride() != astride:
                self._once("argview", logging.DEBUG, "ember cudagraphs: %s: an output views an "
                           "input whose strides differ from the recording's; running without "
                           "CUDA graphs for this call", self.name)
                return self._eager(args)
        with torch.no_grad():  # first: an input may be an output the replay overwrites
            for i, buf in rec.copied:
                buf.copy_(args[i])
        for e in conflicts:  # from earlier steps: invalidate, so access raises, not misreads
            if e.alive():
                o.kill(e.ref.cdata, OVERWRITTEN_MESSAGE.format(
                    graph=e.graph, why=f"a replay of {self.name}"))
                self.stats["killed"] += 1
        if conflicts:
            dead = set(map(id, conflicts))
            pool.live[:] = [e for e in pool.live if id(e) not in dead]
        o.replay(rec.graph)
        if not first:
            self.stats["replay"] += 1
        return self._hand_out(rec, args)

    def _hand_out(self, rec: Recording, args: Sequence[Any]) -> Any:
        o = ops()
        dev = self.pool.device
        step, gen = self.pool.step, self.pool.gen
        aliases = []
        for g, st in enumerate(rec.groups):
            alias = o.alias_storage(st, dev)
            aliases.append(alias)
            self.pool.live.append(_Live(_weak(alias), rec, g, step, gen))
        out: list[Any] = []
        for p in rec.plan:
            tag = p[0]
            if tag == "pool":
                out.append(o.tensor(aliases[p[1]], p[2]))
            elif tag == "arg":
                out.append(args[p[1]])
            elif tag == "argview":
                a = args[p[1]]
                out.append(a.as_strided(p[2], p[3], a.storage_offset() + p[4]))
            else:
                out.append(p[1])
        return rec.out_type(out) if rec.out_type is not list else out  # type: ignore[attr-defined]


_StorageWeakRef: Any = None


def _weak(storage: Any) -> Any:
    global _StorageWeakRef
    if _StorageWeakRef is None:
        from torch.multiprocessing.reductions import StorageWeakRef
        _StorageWeakRef = StorageWeakRef
    return _StorageWeakRef(storage)
