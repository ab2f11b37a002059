"""What the interpreter does with a callable it meets: put it in the graph, fold it to a constant,
inline it, or break. Kept in one table-like module so that supporting a new function is a local
change."""

from __future__ import annotations

import operator
import types
from typing import Any

import torch

#: Python modules whose attributes are read without guards (their members are not rebound by
#: user code in practice; guarding them would cost every call).
TRUSTED_MODULE_PREFIXES = ("torch", "math", "operator", "builtins", "functools", "itertools",
                           "collections", "typing", "numbers", "enum", "dataclasses", "warnings",
                           "inspect", "abc", "copy", "contextlib", "logging", "re", "string",
                           "transformers.utils", "numpy")

#: Calls that answer "is a compiler tracing me?": Ember is.
def _compiling_fns() -> set[Any]:
    out: set[Any] = set()
    for path in ("torch.compiler.is_compiling", "torch.compiler.is_dynamo_compiling",
                 "torch._utils.is_compiling"):
        mod, _, name = path.rpartition(".")
        try:
            obj = __import__(mod, fromlist=[name])
            out.add(getattr(obj, name))
        except Exception:
            pass
    return out


COMPILING_TRUE = _compiling_fns()
COMPILING_TRUE_NAMES = {"is_torchdynamo_compiling", "is_compiling", "is_dynamo_compiling",
                        "is_torchdynamo_exporting"}

CONST_RESULTS: dict[Any, Any] = {
    torch.jit.is_scripting: False,
    torch.jit.is_tracing: False,
    torch._C._get_tracing_state: None,
    torch.is_grad_enabled: None,  # special-cased: the current grad mode
    torch.get_default_dtype: None,  # special-cased
    torch._C._has_torch_function: False,
    torch._C._has_torch_function_unary: False,
    torch._C._has_torch_function_variadic: False,
    torch.overrides.has_torch_function: False,
    torch.overrides.has_torch_function_unary: False,
    torch.overrides.has_torch_function_variadic: False,
    torch.is_autocast_enabled: None,  # special-cased
}
for _name in ("is_fx_tracing",):
    try:
        CONST_RESULTS[getattr(torch.fx._symbolic_trace, _name)] = False
    except AttributeError:
        pass
try:
    CONST_RESULTS[torch.fx._symbolic_trace.is_fx_symbolic_tracing] = False  # type: ignore[attr-defined]
except AttributeError:
    pass

#: torch functions that read global state (set by ``torch.use_deterministic_algorithms``,
#: ``manual_seed``, ``set_num_threads``, ...): evaluated while tracing, and the value they returned
#: is guarded (the call is repeated by the entry), so a program that branches on one recompiles
#: when the state changes. (Grad mode, the default dtype and autocast are guarded for every graph.)
STATE_QUERIES: set[Any] = {f for f in (getattr(torch, n, None) for n in (
    "are_deterministic_algorithms_enabled", "is_deterministic_algorithms_warn_only_enabled",
    "get_deterministic_debug_mode", "initial_seed", "get_num_threads", "get_num_interop_threads",
    "is_anomaly_enabled", "is_anomaly_check_nan_enabled", "get_float32_matmul_precision",
    "is_inference_mode_enabled", "is_warn_always_enabled", "get_default_device",
    "get_autocast_dtype", "get_autocast_cpu_dtype", "get_autocast_gpu_dtype",
    "is_autocast_cache_enabled")) if f is not None}

def _state_changers() -> set[Any]:
    out: set[Any] = set()
    for path in ("torch.manual_seed", "torch.seed", "torch.get_rng_state", "torch.set_rng_state",
                 "torch.random.manual_seed", "torch.random.seed", "torch.random.get_rng_state",
                 "torch.random.set_rng_state", "torch.cuda.manual_seed",
                 "torch.cuda.manual_seed_all", "torch.cuda.seed", "torch.cuda.seed_all",
                 "torch.cuda.get_rng_state", "torch.cuda.set_rng_state",
                 "torch.cuda.get_rng_state_all", "torch.cuda.set_rng_state_all",
                 "torch.set_default_dtype", "torch.set_default_tensor_type",
                 "torch.set_default_device", "torch.set_grad_enabled",
                 "torch.use_deterministic_algorithms", "torch.set_deterministic_debug_mode",
                 "torch.set_num_threads", "torch.set_num_interop_threads",
                 "torch.set_float32_matmul_precision", "torch.set_warn_always",
                 "torch.set_printoptions", "torch.set_anomaly_enabled",
                 "torch._C._set_deterministic_algorithms", "torch.set_autocast_enabled",
                 "torch.set_autocast_dtype", "torch.set_autocast_cache_enabled"):
        mod, _, name = path.rpartition(".")
        try:
            obj = getattr(__import__(mod, fromlist=[name]), name)
        except (ImportError, AttributeError):
            continue
        out.add(_innermost(obj))
    return out


def _innermost(fn: Any) -> Any:
    """``fn`` without its ``functools.wraps`` wrappers (torch rebinds ``torch.manual_seed`` to a
    new wrapper of it when one of its own modules is imported lazily, mid-process)."""
    seen = 0
    while seen < 16:
        inner = getattr(fn, "__wrapped__", None) if isinstance(fn, types.FunctionType) else None
        if inner is None:
            return fn
        fn, seen = inner, seen + 1
    return fn


def changes_state(fn: Any) -> bool:
    """``fn`` is one of :data:`STATE_CHANGERS` (through any wrappers)."""
    try:
        return _innermost(fn) in STATE_CHANGERS
    except TypeError:  # unhashable
        return False


#: torch functions that change (or read, as a tensor: the RNG state) global state. They are no
#: operators: tracing would run them once, for real, and the graph replayed on later calls would
#: not (``torch.manual_seed(0)`` inside the region reseeded only while tracing). A graph break:
#: they run eagerly on every call.
STATE_CHANGERS: set[Any] = _state_changers()


GRAD_MODE_CLASSES = {torch.no_grad: False, torch.enable_grad: True}
AUTOCAST_CLASSES = {torch.autocast, torch.amp.autocast, torch.cpu.amp.autocast}

#: Tensor attributes answered from FakeTensor metadata (Python constants in the graph's world).
TENSOR_META_ATTRS = {"shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "layout",
                     "is_sparse", "is_quantized", "is_meta", "is_leaf", "itemsize", "nbytes"}
TENSOR_META_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "stride",
                       "is_floating_point", "is_complex", "is_contiguous", "element_size",
                       "get_device", "is_signed", "type" }
#: Tensor attributes that are graph operations.
TENSOR_GRAPH_ATTRS = {"T", "mT", "H", "mH", "real", "imag", "data"}
#: Tensor methods that force a value out of the graph: a graph break.
TENSOR_BREAK_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__",
                        "__index__", "data_ptr", "backward", "register_hook", "cpu_",
                        "untyped_storage", "storage", "_typed_storage",
                        # autograd metadata of a tensor changed in place: AOT graphs drop it
                        "requires_grad_", "retain_grad", "detach_"}

#: Pure Python callables safe to evaluate on constant arguments at trace time.
PURE_BUILTINS = {
    abs, all, any, bin, bool, callable, chr, divmod, float, format, frozenset, hash, hex, int,
    isinstance, issubclass, len, max, min, oct, ord, pow, repr, round, sorted, str, sum, tuple,
    type, list, dict, set, slice, range, reversed, enumerate, zip, map, filter, getattr, hasattr,
    iter, next, id,
}


def is_pure_const_callable(fn: Any) -> bool:
    if fn in PURE_BUILTINS:
        return True
    mod = getattr(fn, "__module__", None)
    if mod in ("math", "_operator", "operator"):
        return True
    if isinstance(fn, (types.BuiltinMethodType, types.MethodWrapperType)):
        owner = getattr(fn, "__self__", None)
        return isinstance(owner, (str, int, float, tuple, bytes, frozenset, bool, type(None),
                                  torch.dtype, torch.device, torch.Size))
    return False


def is_torch_op(fn: Any) -> bool:
    """A torch callable that becomes one graph node (not inlined)."""
    if isinstance(fn, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        return True
    mod = getattr(fn, "__module__", None) or ""
    if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        self_obj = getattr(fn, "__self__", None)
        if self_obj is not None and not isinstance(self_obj, (types.ModuleType, type)) and \
                type(self_obj).__module__.startswith("torch") and \
                not isinstance(self_obj, torch.Tensor):
            # a method of a real torch object (a storage, a Generator): its answer depends on
            # that object's state, which no guard checks; not an operator of the graph
            return False
        if mod.startswith("torch") or (self_obj is not None and
                                       type(self_obj).__module__.startswith("torch")):
            return True
        if isinstance(self_obj, types.ModuleType) and self_obj.__name__.startswith("torch"):
            return True
        return False
    if isinstance(fn, types.FunctionType):
        if mod.startswith("torch.nn.functional"):
            # One node per functional call, as torch.compile records them; the few that are
            # only argument checks around one builtin are inlined to that builtin.
            return fn.__name__ not in INLINED_FUNCTIONALS
        if mod.startswith("torch.nn.modules"):
            return False
        if fn.__name__ == "<lambda>" or "<locals>" in getattr(fn, "__qualname__", ""):
            return False  # made at run time (a lambda, a property a parametrization injects)
        return mod.startswith("torch.") and not mod.startswith(NOT_OP_MODULES)
    return False


#: torch.* modules whose Python functions are helpers, not operators: they are inlined (traced
#: into) like user code, as torch.compile does.
NOT_OP_MODULES = ("torch.utils", "torch.fx", "torch.jit", "torch._jit", "torch.nn.init",
                  "torch.overrides", "torch.testing", "torch.nn.utils", "torch.distributions")


#: torch.nn.functional functions traced into rather than recorded as one call: their bodies
#: reduce to one builtin (so the graph is the same size) or depend on Python-level arguments.
INLINED_FUNCTIONALS = {"relu", "relu6", "elu", "selu", "celu", "leaky_relu", "hardtanh",
                       "dropout", "layer_norm", "group_norm", "batch_norm", "instance_norm",
                       "softmax", "log_softmax", "softmin", "embedding", "silu", "mish",
                       "hardswish", "hardsigmoid", "tanh", "sigmoid", "pad", "linear",
                       "_canonical_mask", "_none_or_dtype", "_get_softmax_dim", "_verify_batch_size",
                       "_verify_spatial_size", "gelu", "softplus", "glu", "logsigmoid",
                       "interpolate", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
                       "max_pool1d", "adaptive_max_pool2d", "_max_pool2d", "_max_pool1d",
                       "dropout1d", "dropout2d", "alpha_dropout", "threshold", "rms_norm",
                       "normalize_shape"}


def is_tensor_method(fn: Any) -> str | None:
    """``torch.Tensor.add`` and friends called unbound: the method name."""
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        if getattr(fn, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor):
            return fn.__name__
    if isinstance(fn, types.FunctionType) and getattr(torch.Tensor, fn.__name__, None) is fn:
        return fn.__name__
    return None


BINARY_OPS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "@": operator.matmul,
    "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift,
    ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
COMPARE_OPS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
               ">": operator.gt, ">=": operator.ge}
INPLACE_TO_OUT = {operator.iadd: operator.add, operator.isub: operator.sub,
                  operator.imul: operator.mul, operator.itruediv: operator.truediv,
                  operator.ifloordiv: operator.floordiv, operator.imod: operator.mod,
                  operator.ipow: operator.pow, operator.imatmul: operator.matmul,
                  operator.iand: operator.and_, operator.ior: operator.or_,
                  operator.ixor: operator.xor, operator.ilshift: operator.lshift,
                  operator.irshift: operator.rshift}

#: Functions of these modules run for real on real (non-tensor) values while tracing: they are
#: introspection or environment reads whose results are constants of the traced program.
REAL_EVAL_MODULES = {"inspect", "os", "posixpath", "genericpath", "warnings", "typing"}

#: Standard-library modules Ember never traces into: a call into them is a graph break and the
#: callee runs as plain Python (as torch.compile's skip files do).
SKIPPED_MODULES = ("logging", "json", "threading", "re", "pickle", "io", "traceback", "random",
                   "time", "datetime", "socket", "subprocess", "unittest", "pdb", "concurrent",
                   "asyncio", "multiprocessing", "queue", "weakref", "tempfile", "shutil",
                   "pathlib", "zipfile", "gzip", "csv", "sqlite3", "urllib", "http", "email",
                   "pprint", "textwrap", "tqdm", "numpy")


def is_skipped_module(mod: str) -> bool:
    return mod.split(".", 1)[0] in SKIPPED_MODULES


