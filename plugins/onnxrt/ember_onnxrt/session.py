"""ONNX Runtime sessions: options, the on-disk cache, and calls bound to torch's memory.

* Session options are set deliberately: graph optimization level ``ORT_ENABLE_ALL`` (option
  ``optimization_level``: ``"disable"``, ``"basic"``, ``"extended"``, ``"all"``), intra-op
  threads = ``torch.get_num_threads()`` (so ORT and the ATen ops between its subgraphs use the
  cores torch was told to use), one inter-op thread, sequential execution, the CPU memory arena
  on (option ``arena``), and the ONNX file's name in the log.
* Cache: the ONNX model and the model ORT optimized from it live in Ember's store
  (``<cache dir>/onnxrt/<sha256 of the key>.onnx`` and ``.opt.onnx``, each written atomically
  and described by a text-store record holding the key and the file's sha256, checked on read:
  never unpickled, a corrupt entry is a miss and is rewritten). A warm start opens the
  optimized model with optimizations off, so no session is optimized from scratch.
* Calls: :class:`OrtCall` binds every input by its data pointer (no copy: ``bind_input`` on
  the tensor's memory; a non-contiguous input is made contiguous first) and every output to a
  tensor allocated by torch (static shapes, or sizes computable from the inputs'), or lets ORT
  allocate it and hands it to torch through DLPack where a size depends on the data.
  CUDA tensors go to the CUDA execution provider when ``onnxruntime-gpu`` provides it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pathlib
from typing import Any, Sequence

import torch

log = logging.getLogger("ember.onnxrt")

#: cache-entry format: bump when what an entry means changes
CACHE_FORMAT = 1


def ort() -> Any:
    """onnxruntime, or an error naming the package to install."""
    try:
        import onnxruntime
    except ImportError as e:
        from ember.exc import BackendCompilerFailed

        raise BackendCompilerFailed(
            "backend 'onnxrt' needs the onnxruntime package, which is not installed: "
            "pip install onnxruntime (CPU) or onnxruntime-gpu (CUDA), or reinstall the plugin "
            f"with its dependencies (pip install ./plugins/onnxrt). ({e})") from e
    return onnxruntime


def runtime_info() -> str:
    """``onnxruntime 1.32.0, providers: CPUExecutionProvider, ...`` (for ``python -m ember
    backends``)."""
    try:
        rt = ort()
    except Exception as e:  # noqa: BLE001
        return f"onnxruntime not installed ({type(e).__name__})"
    return f"onnxruntime {rt.__version__}, providers: {', '.join(rt.get_available_providers())}"


_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
           "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


def providers_for(device: str) -> list[str]:
    avail = ort().get_available_providers()
    if device.startswith("cuda") and "CUDAExecutionProvider" in avail:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session_options(options: dict[str, Any], optimized_path: str | None = None,
                    optimize: bool = True) -> Any:
    rt = ort()
    so = rt.SessionOptions()
    level = str(options.get("optimization_level", "all"))
    if level not in _LEVELS:
        raise ValueError(f"onnxrt option optimization_level={level!r}: expected one of "
                         f"{sorted(_LEVELS)}")
    so.graph_optimization_level = getattr(rt.GraphOptimizationLevel,
                                          _LEVELS[level] if optimize else "ORT_DISABLE_ALL")
    threads = int(options.get("intra_op_threads") or torch.get_num_threads())
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
    so.enable_cpu_mem_arena = bool(options.get("arena", True))
    so.enable_mem_pattern = True
    so.log_severity_level = 3
    if threads == 1:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if optimized_path is not None:
        so.optimized_model_filepath = optimized_path
    return so


# -- the store ---------------------------------------------------------------------------------

def _root() -> pathlib.Path:
    from ember._store import cache_dir

    return cache_dir() / "onnxrt"


def _blob_get(key: str, suffix: str) -> pathlib.Path | None:
    """The file stored under ``key`` (checked against its record), or None."""
    from ember._store import get_text, unlink

    h = hashlib.sha256(key.encode()).hexdigest()
    path = _root() / f"{h}{suffix}"
    rec = get_text("onnxrt", key + suffix)
    if rec is None:
        return None
    try:
        meta = json.loads(rec)
        data = path.read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("format") != CACHE_FORMAT or hashlib.sha256(data).hexdigest() != meta.get("sha256"):
        log.warning("onnxrt cache entry %s is corrupt; rebuilt", path)
        unlink(path)
        return None
    return path


def _blob_put(key: str, suffix: str, data: bytes) -> pathlib.Path | None:
    from ember._store import atomic_write, put_text

    h = hashlib.sha256(key.encode()).hexdigest()
    path = _root() / f"{h}{suffix}"
    try:
        atomic_write(path, data)
    except OSError as e:
        log.warning("could not write onnxrt cache entry %s: %s", path, e)
        return None
    put_text("onnxrt", key + suffix, json.dumps(
        {"format": CACHE_FORMAT, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}))
    return path


#: ``built``: sessions optimized from an ONNX model; ``warm``: sessions opened from ORT's
#: cached optimized model; ``translated``: models built from a graph (cache misses)
counters: dict[str, int] = {"built": 0, "warm": 0, "translated": 0}


def open_session(key: str, model_bytes: Any, options: dict[str, Any], device: str,
                 use_cache: bool = True) -> tuple[Any, bytes]:
    """A session for the model stored under ``key`` (``model_bytes()`` builds its ONNX bytes on
    a miss). Returns (session, ONNX model bytes)."""
    rt = ort()
    providers = providers_for(device)
    full_key = f"{key}|ort={rt.__version__}|{providers}|{_opts_key(options)}"
    if use_cache:
        opt = _blob_get(full_key, ".opt.onnx")
        src = _blob_get(full_key, ".onnx")
        if opt is not None and src is not None:
            try:
                sess = rt.InferenceSession(str(opt), session_options(options, optimize=False),
                                           providers=providers)
                counters["warm"] += 1
                log.debug("onnxrt: warm start from %s", opt)
                return sess, src.read_bytes()
            except Exception as e:  # noqa: BLE001  a stale or broken entry: rebuild
                log.warning("onnxrt: cached optimized model %s did not load (%s); rebuilt",
                            opt, e)
    data = model_bytes()
    counters["translated"] += 1
    if use_cache:
        src = _blob_put(full_key, ".onnx", data)
        tmp = _root() / f".opt-{os.getpid()}-{hashlib.sha256(full_key.encode()).hexdigest()[:16]}"
        try:
            tmp.parent.mkdir(parents=True, exist_ok=True)
            sess = rt.InferenceSession(data, session_options(options, str(tmp)),
                                       providers=providers)
            if tmp.exists():
                _blob_put(full_key, ".opt.onnx", tmp.read_bytes())
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass
        del src
    else:
        sess = rt.InferenceSession(data, session_options(options), providers=providers)
    counters["built"] += 1
    return sess, data


def _opts_key(options: dict[str, Any]) -> str:
    return ",".join(f"{k}={options.get(k)}" for k in ("optimization_level", "arena"))


# -- calls -------------------------------------------------------------------------------------

@functools.cache
def _np_dtype(dtype: torch.dtype) -> Any:
    import numpy as np

    return {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16,
            torch.int64: np.int64, torch.int32: np.int32, torch.int16: np.int16,
            torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_}.get(dtype)


class OrtCall:
    """Runs one ORT session on torch tensors: inputs and outputs bound to torch's memory.

    ``input_index``: which positional arguments feed the session's inputs (in order);
    ``out_meta``: one (shape, dtype) per output, shapes as ints or sympy expressions over the
    inputs' symbolic sizes (``sym_dims`` maps a symbol's name to (input position, dim))."""

    def __init__(self, sess: Any, input_names: Sequence[str], input_index: Sequence[int],
                 output_names: Sequence[str], out_meta: Sequence[tuple[Any, torch.dtype]],
                 device: str, sym_dims: dict[str, tuple[int, int]] | None = None):
        self.sess = sess
        self.input_names = list(input_names)
        self.input_index = list(input_index)
        self.output_names = list(output_names)
        self.out_meta = list(out_meta)
        self.sym_dims = dict(sym_dims or {})
        self.static = all(all(isinstance(d, int) for d in shape) for shape, _ in out_meta)
        if self.static:
            self.out_meta = [(tuple(shape), dtype) for shape, dtype in self.out_meta]
        self.device = torch.device(device)
        self.ort_device = "cuda" if self.device.type == "cuda" else "cpu"
        self.device_id = self.device.index or 0
        self.calls = 0

    def _shape(self, shape: Any, args: Sequence[Any]) -> tuple[int, ...] | None:
        if all(isinstance(d, int) for d in shape):
            return tuple(shape)
        env = {}
        for name, (pos, dim) in self.sym_dims.items():
            a = args[pos]
            env[name] = a.shape[dim] if dim >= 0 else int(a)
        out = []
        for d in shape:
            if isinstance(d, int):
                out.append(d)
                continue
            try:
                v = d.subs({s: env[s.name] for s in d.free_symbols if s.name in env})
                out.append(int(v))
            except Exception:  # noqa: BLE001  data-dependent: ORT allocates it
                return None
        return tuple(out)

    def __call__(self, *args: Any) -> list[torch.Tensor]:
        self.calls += 1
        binding = self.sess.io_binding()
        dev, dev_id = self.ort_device, self.device_id
        keep = []
        for name, i in zip(self.input_names, self.input_index):
            a = args[i]
            if not isinstance(a, torch.Tensor):
                a = torch.tensor(int(a), dtype=torch.int64)
            elif not a.is_contiguous():
                a = a.contiguous()
            keep.append(a)
            binding.bind_input(name, dev, dev_id, _np_dtype(a.dtype), a.shape,
                               a.data_ptr() if a.numel() else _EMPTY.data_ptr())
        outs: list[Any] = []
        missing = False
        static = self.static
        for name, (shape, dtype) in zip(self.output_names, self.out_meta):
            s = shape if static else self._shape(shape, args)
            if s is None:
                binding.bind_output(name, dev, dev_id)
                outs.append(None)
                missing = True
                continue
            t = torch.empty(s, dtype=dtype, device=self.device)
            binding.bind_output(name, dev, dev_id, _np_dtype(dtype), s,
                                t.data_ptr() if t.numel() else _EMPTY.data_ptr())
            outs.append(t)
        self.sess.run_with_iobinding(binding)
        if missing:
            ort_outs = binding.get_outputs()
            for k, o in enumerate(outs):
                if o is None:
                    outs[k] = _from_ort(ort_outs[k], self.out_meta[k][1])
        del keep
        return outs


_EMPTY = torch.empty(8, dtype=torch.float64)  # a valid pointer for empty tensors


def _from_ort(v: Any, dtype: torch.dtype) -> torch.Tensor:
    try:
        return torch.from_dlpack(v.to_dlpack())
    except Exception:  # noqa: BLE001  builds without DLPack: one copy through NumPy
        return torch.from_numpy(v.numpy()).to(dtype)


# -- precompiled artifacts ---------------------------------------------------------------------

def artifact_subgraph(data: bytes, spec: dict[str, Any], options: dict[str, Any]) -> Any:
    """An ORT subgraph of a precompiled artifact: a session on ``data`` (ONNX bytes) called as
    the compiled graph called it (inputs bound by pointer, outputs allocated by torch)."""
    rt = ort()
    device = "cpu"
    sess = rt.InferenceSession(data, session_options(options), providers=providers_for(device))
    out_meta = [(tuple(s), getattr(torch, d)) for s, d in spec["out_meta"]]
    call = OrtCall(sess, spec["input_names"], spec["input_index"], spec["output_names"],
                   out_meta, device)
    single = spec["single"]

    def run(*args: Any) -> Any:
        outs = call(*args)
        return outs[0] if single else tuple(outs)

    return run


def artifact_call(graph_fn: Any, consts: Any, subs: list[Any],
                  restride: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> Any:
    """The compiled graph's callable in an artifact: the partitioned graph with its ORT
    subgraphs, outputs given their traced strides (as ``Compiled.__call__`` does)."""

    def call(*args: Any) -> Any:
        out = graph_fn(consts, *args, *subs)
        if restride:
            out = list(out)
            for k, (shape, stride) in restride.items():
                r = out[k]
                if tuple(r.stride()) != tuple(stride) and tuple(r.shape) == tuple(shape):
                    t = torch.empty_strided(shape, stride, dtype=r.dtype, device=r.device)
                    t.copy_(r)
                    out[k] = t
        return out

    return call
