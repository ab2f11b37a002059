"""Persisted captures: a warm start's first call without tracing (on by default).

Capturing a frame builds FakeTensors, and torch's FakeTensorMode loads a large part of torch on
first use (about 1.3 s on a quiet 2-core machine): a fresh process pays that on its first
call even when every kernel and every AOT result is in the on-disk cache. This module stores what
a capture produced (the entry function's source: guards, graph call, result; the torch-level
graph; a *process-independent recipe* for every object the entry's namespace refers to) and on
the first call of a later process rebuilds the entry from it without tracing.

Recipes (found after a capture, by searching the call's arguments and the namespace):

* objects reached from an argument: a submodule by its path (``blocks.0.fc1``), its
  ``__dict__``, a parameter or buffer by name, a tensor argument; checked at load: the object's
  type (module and qualified name, and the live type must be the class importable under that
  name: a same-named class made by ``type()`` is another class) and, for tensors, shape,
  stride, storage offset, dtype, device, requires_grad;
* functions, classes, builtins, Python modules and module globals by importable name, checked to
  resolve to themselves; a class or builtin found under the name must still call itself by it
  (``torch.relu = torch.tanh`` is a miss); a decorated function through its wrapper's closure
  cells. A function is compared by its code (a deterministic text of bytecode, constants and
  names, nested code included), its defaults, the module whose globals it reads and what its
  closure holds (constants with their type: ``1`` is not ``True``); every non-torch,
  non-standard-library source file that defines one of these objects must hash the same
  (editing the model's file is a miss);
* functions' ``__defaults__``/``__kwdefaults__`` (constants by type and value, dtypes, devices,
  tuples of them, functions and classes by their fingerprint), closure cells and code objects of
  those functions; the function's globals; Ember's entry helpers; dtypes, devices and plain
  constants by value; a function met again inside its own closure by which enclosing one it is;
* an object bound to a global of an imported module whose functions the namespace holds
  (transformers' output-recording registry), by the module's and the global's names: its type
  must be importable as itself (a function: the same fingerprint), the module's file hashes the
  same, and what the capture read from it is guarded as in the first process;
* a snapshot of plain data (an object's whole ``__dict__``, guarded equal to it), rebuilt equal.

An object the namespace holds that neither the guards nor the graph call read (an
``inspect.signature`` result, a constant of the traced program) needs no recipe. Anything else in
the namespace (an arbitrary object, a resume function after a graph break, a
symbolic size), or an entry with a prologue, means the capture is not persisted. On load every
recipe is resolved and checked, then the entry's own guards run on the live arguments; any
failure is a miss, and the frame is captured as usual. Rebinding makes identity guards trivially
true, so everything else the guards check (values of attributes and globals read, hooks, grad
mode, ...) still runs as generated.

Only a function's first capture in a process is stored, and only a function's first compile in
a process looks for one (a recompile after a guard miss captures as usual).

Graph targets are torch's, Python's or ``aten``/``prims`` operators (a user's custom operator
is refused: its Python code is not hashed). A rebuilt capture is reported as a traced one is
(graph counters, ``graph_captured``/``entry_guards`` events, ``ember.last_capture()``).

Keyed by the function's code, the arguments' types and tensor metadata, grad mode, backend and
options, what ``ember.disable``/``allow_in_graph`` marked and ``config.max_inline_depth``,
Ember's capture/AOT sources and the torch and Python versions; stored as JSON in the
text store (``<cache dir>/text/capture/``). On unless ``ember.config.persist_capture`` is False
(``EMBER_PERSIST_CAPTURE=0``).
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import pathlib
import re
import sys
import time
import types
from typing import Any, Callable

import torch
import torch.fx as fx

from .._fxjson import decode_arg, encode_arg
from . import lifetime, tensor_check

__all__ = ["enabled", "save", "load", "counters"]

log = logging.getLogger("ember.capture.persist")

FORMAT_VERSION = 5
NAMESPACE = "capture"

#: ``hits`` (entries rebuilt without tracing), ``saved``, ``misses`` (no entry, or one that did not
#: check out), ``refused`` (captures that cannot be persisted).
counters: dict[str, int] = {"hits": 0, "saved": 0, "misses": 0, "refused": 0}


class _Refuse(Exception):
    pass


def enabled() -> bool:
    """``ember.config.persist_capture`` (``EMBER_PERSIST_CAPTURE=0`` turns it off)."""
    from .. import config

    return bool(getattr(config, "persist_capture", True))


# --------------------------------------------------------------------------------------------
# fingerprints


def _file_hash(path: str) -> str:
    from ..aot.cache import _file_hash as fh

    return fh(path)


def _ember_fingerprint() -> str:
    root = pathlib.Path(__file__).parent.parent
    h = hashlib.sha256(f"persist={FORMAT_VERSION}".encode())
    for p in sorted(list(root.glob("*.py")) + list((root / "capture").glob("*.py"))
                    + list((root / "aot").glob("*.py"))):
        h.update(p.name.encode())
        h.update(_file_hash(str(p)).encode())
    return h.hexdigest()


_STDLIB = (sys.base_prefix, sys.prefix)


def _needs_file_hash(mod: str) -> str | None:
    """The source file of a non-torch, non-standard-library module (hashed into the check)."""
    if mod == "torch" or mod.startswith("torch.") or mod in sys.builtin_module_names:
        return None
    m = sys.modules.get(mod)
    file = getattr(m, "__file__", None)
    if not file:
        raise _Refuse(f"module {mod} has no source file")
    if "site-packages" not in file and file.startswith(sys.base_prefix):
        return None  # the standard library: the Python version is in the key
    return file


def _code_text(code: types.CodeType) -> str:
    """A deterministic text of a code object (``marshal.dumps`` is not: its reference flags
    depend on reference counts, which differ between processes)."""
    consts = [_code_text(c) if isinstance(c, types.CodeType) else f"{type(c).__name__}:{c!r}"
              for c in code.co_consts]
    return repr((code.co_filename, code.co_name, code.co_qualname, code.co_firstlineno,
                 code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                 code.co_flags, code.co_code.hex(), consts, code.co_names, code.co_varnames,
                 code.co_freevars, code.co_cellvars))


def _code_hash(code: types.CodeType) -> str:
    return hashlib.sha256(_code_text(code).encode()).hexdigest()


def _tensor_meta(t: torch.Tensor) -> list[Any]:
    return [f"{type(t).__module__}.{type(t).__qualname__}", list(t.shape), list(t.stride()),
            t.storage_offset(), str(t.dtype), str(t.device), bool(t.requires_grad)]


def _type_name(obj: Any) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _args_key(args: tuple, kwargs: dict) -> list[Any]:
    out = []
    for a in list(args) + [kwargs[k] for k in sorted(kwargs)]:
        if isinstance(a, torch.Tensor):
            out.append(_tensor_meta(a))
        else:
            out.append(_type_name(a))
    return out + sorted(kwargs)


def _marks() -> str:
    """What ``ember.disable`` / ``ember.allow_in_graph`` marked in this process (they change
    what a capture inlines): by code location or import name."""
    from . import frame
    from .. import config

    def name(k: Any) -> str:
        if isinstance(k, types.CodeType):
            return f"{k.co_filename}:{k.co_firstlineno}:{k.co_qualname}"
        try:
            return ".".join(_import_name(k))
        except _Refuse:
            return f"<{type(k).__name__} {id(k)}>"  # never equal in another process

    return repr((sorted(map(name, frame._disabled)), sorted(map(name, frame._allow_in_graph)),
                 config.max_inline_depth))


def _key(cf: Any, args: tuple, kwargs: dict) -> str:
    from ..aot.cache import _canon

    fn = cf.fn
    h = hashlib.sha256()
    for part in (_ember_fingerprint(), f"torch={torch.__version__}",
                 f"python={sys.version}", _code_hash(fn.__code__), _marks(),
                 f"{cf.backend.name} {_canon(dict(sorted(cf.options.items())))}",
                 f"fullgraph={cf.fullgraph} dynamic={cf.dynamic} root={cf._root_module}",
                 f"grad={torch.is_grad_enabled()}", json.dumps(_args_key(args, kwargs))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# recipes


def _resolve_name(mod: str, qual: str) -> Any:
    obj: Any = sys.modules.get(mod)
    if obj is None:
        return None
    for part in qual.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _import_name(obj: Any) -> tuple[str, str]:
    mod = getattr(obj, "__module__", None)
    if mod == "_operator":
        mod = "operator"
    qual = getattr(obj, "__qualname__", None)
    name = getattr(obj, "__name__", None)
    if not isinstance(mod, str):
        raise _Refuse(f"{obj!r} has no module")
    for q in (qual, name):
        if isinstance(q, str) and "<" not in q and _resolve_name(mod, q) is obj:
            return mod, q
    raise _Refuse(f"{obj!r} is not importable by name")


def _check_named(obj: Any, mod: str, qual: str) -> None:
    """``obj``, found under ``mod.qual``, is the object of that name (not another one assigned
    there since: ``torch.relu = torch.tanh`` rebinds the name, not the object's own name)."""
    try:
        ok = _import_name(obj) == (mod, qual)
    except _Refuse:
        ok = False
    if not ok:
        raise _Refuse(f"{mod}.{qual} is now {obj!r}")


def _consts(values: Any, finder: "_Finder") -> str:
    """A function's defaults as text: constants by type and repr, functions and classes by
    what they are (:meth:`_Finder.default`)."""
    if isinstance(values, dict):
        return json.dumps({k: finder.default(v) for k, v in values.items()}, sort_keys=True)
    return json.dumps([finder.default(v) for v in values])


def _code_path(code: types.CodeType, target: Any, depth: int = 4) -> list[int] | None:
    """Indices into nested ``co_consts`` leading from ``code`` to ``target`` ([] for itself)."""
    if code is target:
        return []
    if depth == 0:
        return None
    for i, c in enumerate(code.co_consts):
        if isinstance(c, types.CodeType):
            rest = _code_path(c, target, depth - 1)
            if rest is not None:
                return [i, *rest]
    return None


def _cell_path(start: Any, target: Any, depth: int = 3) -> list[int] | None:
    """Closure-cell indices leading from function ``start`` to ``target``."""
    if not isinstance(start, types.FunctionType) or depth == 0:
        return None
    for i, c in enumerate(start.__closure__ or ()):
        try:
            v = c.cell_contents
        except ValueError:
            continue
        if v is target:
            return [i]
        rest = _cell_path(v, target, depth - 1)
        if rest is not None:
            return [i, *rest]
    return None


class _Finder:
    """Recipes for the objects an entry's namespace holds."""

    def __init__(self, fn: Any, roots: dict[str, Any], ns: dict[str, Any] | None = None):
        self.fn = fn
        self.ns = ns or {}
        self.paths: dict[int, list[Any]] = {}
        self.files: dict[str, str] = {}
        self._stack: list[int] = []  # ids of the functions being fingerprinted, outermost first
        for name, root in roots.items():
            if isinstance(root, torch.nn.Module):
                for path, m in root.named_modules(remove_duplicate=False):
                    self.paths.setdefault(id(m), ["mod", name, path])
                    self.paths.setdefault(id(m.__dict__), ["dict", name, path])
                    for k, p in m._parameters.items():
                        if p is not None:
                            self.paths.setdefault(id(p), ["param", name, path, k])
                    for k, b in m._buffers.items():
                        if b is not None:
                            self.paths.setdefault(id(b), ["buffer", name, path, k])
            elif isinstance(root, torch.Tensor):
                self.paths.setdefault(id(root), ["arg", name])

    def _file(self, mod: str) -> None:
        file = _needs_file_hash(mod)
        if file is not None:
            self.files[file] = _file_hash(file)

    def fingerprint(self, obj: Any, depth: int = 0) -> list[Any]:
        """What a function is, compared (not resolved) at load: its code, defaults and the
        values its closure holds (a decorator's wrapper holds the function it wraps)."""
        if depth > 8:
            raise _Refuse("closures nested too deep")
        if obj is None or type(obj) in (bool, int, str):
            return ["const", type(obj).__name__, obj]  # the type: JSON's 1 == True in Python
        if type(obj) is float:
            return ["float", obj.hex()]
        if isinstance(obj, type):
            mod, qual = _import_name(obj)
            self._file(mod)
            return ["class", mod, qual]
        if not isinstance(obj, types.FunctionType):
            raise _Refuse(f"closure holds a {type(obj).__name__}")
        # a function met again on the way down (one whose closure holds itself, as
        # transformers' ``forward_with_checkpointing`` does): which of the enclosing ones it is
        if id(obj) in self._stack:
            return ["again", self._stack.index(id(obj))]
        mod = obj.__module__
        if isinstance(mod, str):
            self._file(mod)
        self._stack.append(id(obj))
        try:
            return ["fn", _code_hash(obj.__code__),
                    [self.default(d, depth) for d in obj.__defaults__ or ()],
                    {k: self.default(d, depth) for k, d in (obj.__kwdefaults__ or {}).items()},
                    self._globals_of(obj),
                    [self.fingerprint(c.cell_contents, depth + 1) for c in obj.__closure__ or ()]]
        finally:
            self._stack.pop()

    def default(self, d: Any, depth: int = 0) -> list[Any]:
        """A function's default value, compared at load: a constant by its type and repr, a
        dtype or device by name, a tuple item by item, a function or class (``mask_function=
        causal_mask_function``) by its fingerprint; anything else is refused."""
        if d is None or type(d) in (bool, int, str, float):
            return ["const", type(d).__name__, repr(d)]
        if isinstance(d, (torch.dtype, torch.device)):
            return [type(d).__name__, str(d)]
        if type(d) is tuple:
            return ["tuple", [self.default(e, depth) for e in d]]
        if isinstance(d, (types.FunctionType, type)):
            return self.fingerprint(d, depth + 1)
        raise _Refuse(f"default of type {type(d).__name__}")

    def _globals_of(self, fn: types.FunctionType) -> str:
        """The module whose namespace ``fn`` reads its globals from (a decorator's wrapper
        names the wrapped function's module but reads its own module's globals)."""
        name = fn.__globals__.get("__name__")
        m = sys.modules.get(name) if isinstance(name, str) else None
        if m is None or m.__dict__ is not fn.__globals__:
            # a module imported under another name than the one it gives itself
            # (``_collections_abc`` says it is ``collections.abc``)
            name = next((k for k, v in list(sys.modules.items())
                         if getattr(v, "__dict__", None) is fn.__globals__), None)
            if name is None:
                raise _Refuse(f"{fn.__qualname__} reads globals of no imported module")
        self._file(name)
        return name

    def _class_attr(self, obj: Any) -> list[Any] | None:
        """A property, or a classmethod's function, found in a class the namespace holds (guards
        check them by identity: a property replaced on the class recompiles)."""
        if not isinstance(obj, (property, types.FunctionType)):
            return None
        for c in self.ns.values():
            if not isinstance(c, type):
                continue
            for klass in c.__mro__:
                for k, v in vars(klass).items():
                    if isinstance(v, property) and (v is obj or v.fget is obj):
                        through = "" if v is obj else "fget"
                    elif isinstance(v, classmethod) and v.__func__ is obj:
                        through = "__func__"
                    else:
                        continue
                    target = _class_attr_fn(v, through)
                    if isinstance(target, types.FunctionType):
                        mod, qual = _import_name(klass)
                        self._file(mod)
                        return ["class_attr", mod, qual, k, through, self.fingerprint(target)]
        return None

    def recipe(self, name: str, obj: Any) -> list[Any]:
        from .output import ENTRY_HELPERS

        if name in ENTRY_HELPERS and obj is ENTRY_HELPERS[name]:
            return ["helper", name]
        if obj is torch:
            return ["torch"]
        if obj is self.fn.__globals__:
            return ["globals"]
        if obj is _builtins_dict(self.fn):
            return ["builtins"]
        if obj is None or type(obj) in (bool, int, str):
            return ["const", obj]
        if type(obj) is float:
            return ["float", obj.hex()]
        if isinstance(obj, torch.dtype):
            return ["dtype", str(obj).removeprefix("torch.")]
        if isinstance(obj, torch.device):
            return ["device", str(obj)]
        path = self.paths.get(id(obj))
        if path is not None:
            meta = _tensor_meta(obj) if isinstance(obj, torch.Tensor) else _type_name(obj)
            if not isinstance(obj, (torch.Tensor, dict)):
                mod, _ = _import_name(type(obj))  # the live type is checked to be this one
                self._file(mod)
            return ["path", path, meta]
        if type(obj) is tuple and name.startswith(f"___{tensor_check.NS_HINT}_"):
            # the parameters' and buffers' metadata that ___tensors_ok compares (plain data)
            return ["plain", _enc_plain(obj)]
        if type(obj) in (tuple, dict):  # a function's __defaults__ / __kwdefaults__
            for attr in ("__defaults__", "__kwdefaults__"):
                if getattr(self.fn, attr) is obj:
                    return ["fn_attr", attr, _consts(obj, self)]
                for fname, f in self.ns.items():
                    if isinstance(f, types.FunctionType) and getattr(f, attr) is obj:
                        return ["attr_of", fname, attr, _consts(obj, self)]
        if isinstance(obj, types.CellType):  # a closure cell (its contents are guarded)
            for fname, f in [("", self.fn), *self.ns.items()]:
                if isinstance(f, types.FunctionType):
                    for i, c in enumerate(f.__closure__ or ()):
                        if c is obj:
                            return ["attr_of", fname, "cell", i]
            raise _Refuse(f"closure cell {name} of no known function")
        if isinstance(obj, types.CodeType):  # a function's code, or a nested one in its constants
            for fname, f in [("", self.fn), *self.ns.items()]:
                if isinstance(f, types.FunctionType):
                    path = _code_path(f.__code__, obj)
                    if path is not None:
                        return ["attr_of", fname, "code", path]
            raise _Refuse(f"code object {name} of no known function")
        if type(obj) is dict:  # another module's globals (a function inlined from it)
            for mname, m in list(sys.modules.items()):
                if getattr(m, "__dict__", None) is obj:
                    self._file(mname)
                    return ["moddict", mname]
            # a registry bound to a global of a module whose functions the capture ran (Hugging
            # Face transformers 5.17's ``_CAN_RECORD_REGISTRY``): the live object, by name
            found = self._module_global(obj)
            if found is not None:
                return found
            # a snapshot of plain data (an object's whole state, guarded equal to it): rebuilt
            # equal; a dict guarded by identity then misses, as it should
            try:
                return ["plain", _enc_plain(obj)]
            except _Refuse:
                raise _Refuse(f"namespace dict {name}") from None
        if isinstance(obj, types.ModuleType):
            if sys.modules.get(obj.__name__) is not obj:
                raise _Refuse(f"module {obj.__name__} is not in sys.modules")
            return ["pymodule", obj.__name__]
        found = self._class_attr(obj)
        if found is not None:
            return found
        if isinstance(obj, types.FunctionType):
            try:
                mod, qual = _import_name(obj)
            except _Refuse:  # a decorated function: reached through its wrapper's closure
                mod, qual = obj.__module__, obj.__qualname__
                cells = _cell_path(_resolve_name(mod, qual), obj)
                if cells is None:
                    found = self._module_global(obj)  # a module's global made by a factory
                    if found is None:
                        raise
                    return found
                return ["wrapped", mod, qual, cells, self.fingerprint(obj)]
            return ["function", mod, qual, self.fingerprint(obj)]
        if isinstance(obj, type):
            mod, qual = _import_name(obj)
            self._file(mod)
            return ["class", mod, qual]
        if isinstance(obj, (types.BuiltinFunctionType, types.BuiltinMethodType,
                            types.MethodDescriptorType, types.WrapperDescriptorType)):
            mod, qual = _import_name(obj)
            return ["builtin", mod, qual]
        found = self._module_global(obj)
        if found is not None:
            return found
        raise _Refuse(f"namespace object {name} of type {type(obj).__name__}")

    def _module_global(self, obj: Any) -> list[Any] | None:
        """An object bound to a global of an imported module (not ``__main__``) whose functions
        the namespace holds (transformers' output-recording registry): by the module's and the
        global's names. What the capture read from it is guarded; its type must be importable
        as itself, and the module's source file hashes the same."""
        seen: set[int] = set()
        for f in (self.fn, *self.ns.values()):
            g = getattr(f, "__globals__", None)
            if not isinstance(g, dict) or id(g) in seen:
                continue
            seen.add(id(g))
            mname = g.get("__name__")
            mod = sys.modules.get(mname) if isinstance(mname, str) else None
            if mname == "__main__" or mod is None or getattr(mod, "__dict__", None) is not g:
                continue
            for key, value in list(g.items()):
                if value is obj:
                    fp = None
                    if isinstance(obj, types.FunctionType):  # compared by what it is
                        fp = self.fingerprint(obj)
                    else:  # the live type is checked to be this one
                        tmod, _ = _import_name(type(obj))
                        self._file(tmod)
                    self._file(mname)
                    return ["modglobal", mname, key, _type_name(obj), fp]
        return None


_PLAIN_TAGS = {list: "L", tuple: "T", set: "S", frozenset: "FS"}


def _enc_plain(x: Any, depth: int = 8) -> Any:
    """Plain data (constants, dtypes, devices; dicts, lists, tuples and sets of them, in any
    nesting, keys of any such type) as JSON that :func:`_dec_plain` rebuilds equal, with the
    same container types."""
    if depth == 0:
        raise _Refuse("plain data nested too deep")
    if type(x) is dict:
        return {"D": [[_enc_plain(k, depth - 1), _enc_plain(v, depth - 1)] for k, v in x.items()]}
    tag = _PLAIN_TAGS.get(type(x))
    if tag is not None:
        return {tag: [_enc_plain(v, depth - 1) for v in x]}
    if x is None or type(x) in (bool, int, str, float) or isinstance(x, (torch.dtype,
                                                                          torch.device)):
        return _enc(x)
    raise _Refuse(f"plain data of type {type(x).__name__}")


def _dec_plain(x: Any) -> Any:
    if not isinstance(x, dict):
        return x
    (tag, v), = x.items()
    if tag == "D":
        return {_dec_plain(k): _dec_plain(e) for k, e in v}
    for cls, t in _PLAIN_TAGS.items():
        if tag == t:
            return cls(_dec_plain(e) for e in v)
    return decode_arg(x, {})


def _class_attr_fn(attr: Any, through: str) -> Any:
    """The function a class attribute runs (a property's getter, a classmethod's function)."""
    return getattr(attr, through or "fget", None)


def _builtins_dict(fn: Any) -> dict[str, Any]:
    """The builtins a function's global names fall back to."""
    b = fn.__globals__.get("__builtins__", __builtins__)
    return b if isinstance(b, dict) else b.__dict__


def _resolve(recipe: list[Any], fn: Any, roots: dict[str, Any], files: dict[str, str]) -> Any:
    """The live object a recipe names, or raises _Refuse."""
    from .output import ENTRY_HELPERS

    kind = recipe[0]
    if kind == "helper":
        return ENTRY_HELPERS[recipe[1]]
    if kind == "torch":
        return torch
    if kind == "globals":
        return fn.__globals__
    if kind == "builtins":
        return _builtins_dict(fn)
    if kind == "fn_attr":
        obj = getattr(fn, recipe[1])
        if _consts(obj, _Finder(fn, {})) != recipe[2]:
            raise _Refuse(f"{recipe[1]} changed")
        return obj
    if kind == "const":
        return recipe[1]
    if kind == "float":
        return float.fromhex(recipe[1])
    if kind == "dtype":
        dt = getattr(torch, recipe[1])
        if not isinstance(dt, torch.dtype):
            raise _Refuse("dtype")
        return dt
    if kind == "device":
        return torch.device(recipe[1])
    if kind == "path":
        path, meta = recipe[1], recipe[2]
        what, root = path[0], roots.get(path[1])
        if what == "arg":
            obj = root
        else:
            if not isinstance(root, torch.nn.Module):
                raise _Refuse("root is not a module")
            m = root.get_submodule(path[2]) if path[2] else root
            if what == "mod":
                obj = m
            elif what == "dict":
                obj = m.__dict__
            elif what == "param":
                obj = m._parameters.get(path[3])
            elif what == "buffer":
                obj = m._buffers.get(path[3])
            else:
                raise _Refuse(what)
        live = _tensor_meta(obj) if isinstance(obj, torch.Tensor) else _type_name(obj)
        if live != meta:
            raise _Refuse(f"{path}: {live} != {meta}")
        if not isinstance(obj, (torch.Tensor, dict)):
            # a class of the same name (made by type(), or defined twice) is another class
            tp = type(obj)
            if _resolve_name(tp.__module__, tp.__qualname__) is not tp:
                raise _Refuse(f"{path}: its type is not {meta}")
        return obj
    if kind == "moddict":
        m = sys.modules.get(recipe[1])
        if m is None:
            raise _Refuse(f"module {recipe[1]} not imported")
        return m.__dict__
    if kind == "plain":
        return _dec_plain(recipe[1])
    if kind == "modglobal":
        _, mname, key, meta, fp = recipe
        g = getattr(sys.modules.get(mname), "__dict__", None)
        if not isinstance(g, dict) or key not in g:
            raise _Refuse(f"{mname}.{key} not found")
        obj = g[key]
        tp = type(obj)
        if _type_name(obj) != meta or fp is None and \
                _resolve_name(tp.__module__, tp.__qualname__) is not tp:
            raise _Refuse(f"{mname}.{key} is now of type {_type_name(obj)}")
        if fp is not None:  # a function: the same code, defaults and closure
            try:
                same = _Finder(fn, {}).fingerprint(obj) == fp
            except (_Refuse, ValueError):
                same = False
            if not same:
                raise _Refuse(f"function {mname}.{key} changed")
        return obj
    if kind == "pymodule":
        obj = sys.modules.get(recipe[1])
        if obj is None:
            raise _Refuse(f"module {recipe[1]} not imported")
        return obj
    if kind == "class_attr":  # a property, or a classmethod's function (guards: identity)
        _, mod, qual, name, through, fp = recipe
        cls = _resolve_name(mod, qual)
        if not isinstance(cls, type):
            raise _Refuse(f"{mod}.{qual} not found")
        _check_named(cls, mod, qual)
        import inspect
        attr = inspect.getattr_static(cls, name, None)
        if not isinstance(attr, classmethod if through == "__func__" else property):
            attr = None
        target = _class_attr_fn(attr, through) if attr is not None else None
        try:
            same = target is not None and _Finder(fn, {}).fingerprint(target) == fp
        except (_Refuse, ValueError):
            same = False
        if not same:
            raise _Refuse(f"{mod}.{qual}.{name} changed")
        return target if through else attr
    if kind in ("function", "class", "builtin", "wrapped"):
        obj = _resolve_name(recipe[1], recipe[2])
        if obj is None:
            raise _Refuse(f"{recipe[1]}.{recipe[2]} not found")
        if kind in ("class", "builtin"):
            _check_named(obj, recipe[1], recipe[2])
        if kind == "wrapped":
            try:
                for i in recipe[3]:
                    obj = obj.__closure__[i].cell_contents
            except (AttributeError, IndexError, TypeError, ValueError) as e:
                raise _Refuse(f"{recipe[2]}: no such closure cell") from e
            kind, recipe = "function", [kind, recipe[1], recipe[2], recipe[4]]
        if kind == "function":
            try:
                same = _Finder(fn, {}).fingerprint(obj) == recipe[3]
            except (_Refuse, ValueError):  # ValueError: an empty closure cell
                same = False
            if not same:
                raise _Refuse(f"function {recipe[2]} changed")
        return obj
    raise _Refuse(f"unknown recipe {kind}")


# --------------------------------------------------------------------------------------------
# the torch-level graph <-> JSON





def _enc(x: Any) -> Any:
    return encode_arg(x, _Refuse)


_dec = decode_arg


def _target(t: Any) -> list[Any]:
    if isinstance(t, torch._ops.OpOverload):
        if t.namespace not in ("aten", "prims"):  # a user's op: its Python code is not hashed
            raise _Refuse(f"graph target {t.name()}")
        return ["op", t.name()]
    mod, qual = _import_name(t)
    if not (mod in ("operator", "builtins", "math") or mod == "torch" or mod.startswith("torch.")):
        raise _Refuse(f"graph target {mod}.{qual}")
    return ["fn", mod, qual]


def _dumps_graph(gm: fx.GraphModule) -> list[Any]:
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "call_function":
            target: Any = _target(n.target)
        elif n.op in ("placeholder", "call_method", "output"):
            target = n.target
        else:
            raise _Refuse(f"{n.op} node in the captured graph")
        if "ember_recompute" in n.meta.get("custom", ()):
            # the format does not carry the recompute tag: such a capture is traced again
            raise _Refuse("an activation-checkpointed region (torch.utils.checkpoint)")
        nodes.append([n.op, n.name, target, _enc(n.args), _enc(dict(n.kwargs)),
                      n.meta.get("stack_trace")])
    return nodes


def _loads_graph(nodes: list[Any]) -> fx.GraphModule:
    g = fx.Graph()
    env: dict[str, fx.Node] = {}
    for op, name, target, args, kwargs, trace in nodes:
        a, k = _dec(args, env), _dec(kwargs, env)
        if op == "placeholder":
            n = g.placeholder(target)
        elif op == "output":
            n = g.output(a[0])
        else:
            if op == "call_function":
                if target[0] == "op":
                    ns, _, rest = target[1].partition("::")
                    opname, _, overload = rest.partition(".")
                    t = getattr(getattr(getattr(torch.ops, ns), opname), overload or "default")
                else:
                    t = _resolve_name(target[1], target[2])
                    if t is None:
                        raise _Refuse(f"target {target} not found")
                    _check_named(t, target[1], target[2])
            else:
                t = target
            n = g.create_node(op, t, tuple(a), k, name=name)
        if n.name != name:
            raise _Refuse(f"node {name} rebuilt as {n.name}")
        if isinstance(trace, str):
            n.meta["stack_trace"] = trace  # the user's file and line, as a capture sets it
        env[name] = n
    return fx.GraphModule(torch.nn.Module(), g, class_name="EmberGraph")


# --------------------------------------------------------------------------------------------
# save and load


def _roots(fn: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    code = fn.__code__
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    roots = dict(zip(names, args))
    roots.update({k: v for k, v in kwargs.items() if k in names})
    return roots


_SKIP = ("__builtins__", "___entry", "___failed_guard", "___MISS", "___compiled")
_GRAPH_CALL = "    ___o = ___compiled("


def save(cf: Any, entry: Any, args: tuple, kwargs: dict) -> None:
    """After a capture: store ``entry`` if everything it refers to has a recipe."""
    try:
        _save(cf, entry, args, kwargs)
    except _Refuse as e:
        counters["refused"] += 1
        log.debug("capture of %s not persisted: %s", getattr(cf.fn, "__qualname__", "?"), e)
    except Exception as e:  # never let the cache break a compile
        counters["refused"] += 1
        log.debug("capture not persisted (%s: %s)", type(e).__name__, e)


def _save(cf: Any, entry: Any, args: tuple, kwargs: dict) -> None:
    from .._store import put_text

    if cf.cache.entries:
        raise _Refuse("a recompile (only a process's first capture of a function is stored)")
    cap = getattr(entry, "capture", None)
    gm = getattr(entry, "graph_module", None)
    src = getattr(entry, "source", None)
    if cap is None or gm is None or not isinstance(src, str):
        raise _Refuse("no graph")
    if cap.break_reason is not None:
        raise _Refuse("graph break")
    after_guards = src.split("    except Exception:\n        return ___MISS\n", 1)
    if len(after_guards) != 2 or not after_guards[1].startswith(_GRAPH_CALL):
        raise _Refuse("entry has a prologue")
    if any(i.kind not in ("user", "parameter", "buffer") for i in cap.inputs):
        raise _Refuse("symbolic inputs")
    if any(i.kind != "user" and not i.stable_address for i in cap.inputs):
        raise _Refuse("a module guarded by class (its parameters are read on every call)")
    if _symbolic_sizes(gm):
        # a rebuilt graph carries no FakeTensorMode: AOT autograd would trace it with the
        # example sizes while the guards admit every size
        raise _Refuse("symbolic sizes")
    fn = cf.fn
    ns = lifetime.namespace(entry)  # the objects themselves, not the weak references
    finder = _Finder(fn, _roots(fn, args, kwargs), ns)
    guards_text = "\n".join(entry.guards)
    recipes = {}
    for name, obj in ns.items():
        if name in _SKIP:
            continue
        if not re.search(rf"\b{re.escape(name)}\b", src):
            # held by the capture but read by neither the guards nor the graph call (a
            # constant of the traced program, such as an ``inspect.signature`` result); one
            # that only the explanation of a miss reads (the devices of the parameters'
            # metadata that ___tensors_ok compares) is kept where it has a recipe
            recipes[name] = ["unused"]
            if re.search(rf"\b{re.escape(name)}\b", guards_text):
                try:
                    r = finder.recipe(name, obj)
                except _Refuse:
                    continue
                if r[0] in ("device", "dtype", "const", "float"):  # never refused at load
                    recipes[name] = r
            continue
        recipes[name] = finder.recipe(name, obj)
    record = {"format": FORMAT_VERSION, "source": src, "guards": list(entry.guards),
              "graph": _dumps_graph(gm), "recipes": recipes, "files": finder.files,
              "graph_id": cap.graph_id, "weak": lifetime.weak_of(entry),
              "inputs": [[i.kind, i.source, i.stable_address, i.fetch, i.module_path]
                         for i in cap.inputs]}
    if cf.dynamic is None:
        # automatic dynamic: every size and int this first capture saw (tensors it guarded but
        # that are not graph inputs, such as one whose ``size(0)`` alone is read, included), so
        # that a rebuilt entry's next recompile knows them as a traced one would
        state = cf.cache.frame_state
        record["seen"] = {"shapes": {k: list(v) for k, v in state.shapes.items()},
                          "ints": dict(state.ints)}
    put_text(NAMESPACE, _key(cf, args, kwargs), json.dumps(record))
    counters["saved"] += 1


class _Probe(Exception):
    def __init__(self, inputs: tuple):
        self.inputs = inputs


def load(cf: Any, args: tuple, kwargs: dict,
         compile_graph: Callable[..., Any]) -> Callable[..., Any] | None:
    """An entry rebuilt from a persisted capture of ``cf.fn`` whose recipes and guards hold for
    these arguments; None otherwise (capture as usual)."""
    from .._store import get_text

    if cf.cache.entries:  # a recompile in this process: captured as usual (what is stored
        return None       # and rebuilt is a function's first capture in a process)
    t0 = time.perf_counter()
    try:
        text = get_text(NAMESPACE, _key(cf, args, kwargs))
    except Exception as e:  # an argument the key cannot describe
        log.debug("no persisted capture: %s", e)
        return None
    if text is None:
        counters["misses"] += 1
        return None
    try:
        entry = _load(cf, json.loads(text), args, kwargs, compile_graph)
    except Exception as e:
        counters["misses"] += 1
        log.debug("persisted capture of %s not used: %s: %s",
                  getattr(cf.fn, "__qualname__", "?"), type(e).__name__, e)
        return None
    if entry is None:
        counters["misses"] += 1
        return None
    counters["hits"] += 1
    from .. import events

    # the capture's share only: compiling the graph (AOT, backend) reports its own timings
    events.emit("timing", stage="capture", function=cf.fn.__code__.co_name,
                seconds=time.perf_counter() - t0 - entry.compile_seconds, persisted=True)
    return entry


def _load(cf: Any, rec: dict[str, Any], args: tuple, kwargs: dict,
          compile_graph: Callable[..., Any]) -> Callable[..., Any] | None:
    from ..context import InputInfo
    from .frame import MISS
    from .output import signature_source

    if rec.get("format") != FORMAT_VERSION:
        return None
    for file, digest in rec["files"].items():
        if _file_hash(file) != digest:
            raise _Refuse(f"{file} changed")
    fn = cf.fn
    roots = _roots(fn, args, kwargs)
    recipes = rec["recipes"]
    ns: dict[str, Any] = {name: _resolve(r, fn, roots, rec["files"])
                          for name, r in recipes.items() if r[0] not in ("attr_of", "unused")}
    for name, r in recipes.items():  # defaults of functions resolved above
        if r[0] == "attr_of":
            owner = ns[r[1]] if r[1] else fn
            if r[2] == "cell":
                ns[name] = owner.__closure__[r[3]]
                continue
            if r[2] == "code":  # the owner's code was checked (its hash) when it was resolved
                code = owner.__code__
                for i in r[3]:
                    code = code.co_consts[i]
                ns[name] = code
                continue
            obj = getattr(owner, r[2])
            if _consts(obj, _Finder(fn, {})) != r[3]:
                raise _Refuse(f"{r[1]}.{r[2]} changed")
            ns[name] = obj
    ns["___MISS"] = MISS

    def probe(*inputs: Any) -> Any:
        raise _Probe(inputs)

    ns["___compiled"] = probe
    code = fn.__code__
    filename = f"<ember entry for {code.co_name} at {code.co_filename}:{code.co_firstlineno}>"
    sig = signature_source(code)
    sig = f"___fn, {sig}" if sig else "___fn"
    explain = [f"def ___failed_guard({sig}):"]
    for g in rec["guards"]:
        explain += ["    try:", f"        if not ({g}):", f"            return {g!r}",
                    "    except Exception as e:",
                    f"        return {g!r} + ' (raised ' + type(e).__name__ + ')'"]
    explain.append("    return None")
    # what the guards identify is held weakly, as in a traced entry (lifetime.py)
    weak = rec.get("weak")
    weak = [n for n in weak if n in ns] if isinstance(weak, list) else \
        lifetime.weak_names(ns, rec["guards"])
    entry, explain_fn = lifetime.make_entry(rec["source"], "\n".join(explain) + "\n", ns,
                                            filename, weak)
    ns = entry.__globals__
    for f in (entry, explain_fn):
        f.__defaults__ = fn.__defaults__
        f.__kwdefaults__ = fn.__kwdefaults__
    try:
        out = entry(fn, *args, **kwargs)
    except _Probe as p:
        inputs = list(p.inputs)
    else:
        if out is MISS:
            raise _Refuse("a guard fails")
        raise _Refuse("the entry did not call its graph")
    gm = _loads_graph(rec["graph"])
    state = cf.cache.frame_state if cf.dynamic is None else None
    seen = rec.get("seen")
    if state is not None and seen is not None:  # automatic dynamic: as the traced capture saw
        for source, shape in seen["shapes"].items():
            state.see_shape(source, tuple(shape))
        for source, value in seen["ints"].items():
            state.see_int(source, value)
    infos = [InputInfo(k, s, bool(a)) for k, s, a, *_ in rec["inputs"]]
    # named as a traced capture would be here, counting this code's graphs in this process (a
    # recompile after a rebuilt capture gets the next name, not the stored one again)
    from .convert import _next_graph_id
    rec = dict(rec, graph_id=_next_graph_id(fn.__code__))
    t0 = time.perf_counter()
    compiled = compile_graph(gm, inputs, cf.backend, cf.options, inputs=infos,
                             graph_id=rec["graph_id"])
    entry.compile_seconds = time.perf_counter() - t0
    ns["___compiled"] = compiled
    if getattr(compiled, "swap", False) is None:
        compiled.swap = lambda raw: ns.__setitem__("___compiled", raw)
    entry.source = rec["source"]
    entry.guards = list(rec["guards"])
    entry.graph_module = gm
    entry.persisted = True
    entry.capture = _announce(fn, rec, gm)
    return entry


def _origin(text: str, kind: str, module_path: str | None) -> Any:
    """The structured source a capture input's text prints as, for the common shapes (an
    argument, a module child's parameter or buffer); otherwise a stand-in that answers the
    same questions."""
    import re

    from .sources import Buffer, Local, ModuleChild, Param

    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)((?:\._(?:modules|parameters|buffers)"
                     r"\['[^'\\]*'\])*)", text)
    if m is not None:
        src: Any = Local(m.group(1))
        for what, key in re.findall(r"\._(modules|parameters|buffers)\['([^'\\]*)'\]",
                                    m.group(2)):
            cls = {"modules": ModuleChild, "parameters": Param, "buffers": Buffer}[what]
            src = cls(base=src, key=key)
        if str(src) == text:
            return src
    return _Origin(text, kind, module_path)


class _Origin:
    """What a rebuilt capture's inputs can say of their source (the traced structured source is
    not stored): its text, its path below the root module, parameter or buffer."""

    def __init__(self, text: str, kind: str, module_path: str | None):
        self.text, self.kind, self.path = text, kind, module_path

    def __str__(self) -> str:
        return self.text

    def module_path(self) -> str | None:
        return self.path

    def is_parameter(self) -> bool:
        return self.kind == "parameter"

    def is_buffer(self) -> bool:
        return self.kind == "buffer"


def _announce(fn: Any, rec: dict[str, Any], gm: fx.GraphModule) -> Any:
    """What a capture reports (counters, events, logs, ``ember.last_capture()``), reported for
    a rebuilt one too: observers see the same graph whether it was traced or read from disk."""
    from .. import events
    from . import artifact
    from .output import graph_log

    code = fn.__code__
    where = f"{code.co_filename}:{code.co_firstlineno}"
    n_ops = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method"))
    events.counters["stats"]["graphs"] += 1
    events.counters["stats"]["ops"] += n_ops
    if graph_log.isEnabledFor(logging.INFO):
        graph_log.info("captured graph for %s %s (%d ops, rebuilt from the on-disk cache):\n%s",
                       where, code.co_name, n_ops, gm.print_readable(print_output=False))
    events.emit("graph_captured", function=where, name=code.co_name, ops=n_ops, graph=gm)
    inputs = tuple(artifact.CaptureInput(k, s, f, bool(a), origin=_origin(s, k, mp))
                   for k, s, a, f, mp in rec["inputs"])
    cap = artifact.Capture(function=f"{where} in {code.co_name}", graph_id=rec["graph_id"],
                           graph=gm, inputs=inputs, guards=tuple(rec["guards"]),
                           entry_source=rec["source"], break_reason=None)
    artifact.record(cap)
    events.counters["stats"]["entries"] += 1
    from .output import code_log, guard_log

    filename = f"<ember entry for {code.co_name} at {where}>"
    if guard_log.isEnabledFor(logging.INFO):
        guard_log.info("guards for %s:\n  %s", filename, "\n  ".join(rec["guards"]))
    if code_log.isEnabledFor(logging.INFO):
        code_log.info("entry for %s:\n%s", filename, rec["source"])
    events.emit("entry_guards", function=f"{code.co_name} ({where})", guards=list(rec["guards"]))
    return cap


def _symbolic_sizes(gm: Any) -> bool:
    """Does a placeholder of the captured graph have a symbolic size, stride or offset?"""
    import torch

    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        vals = ((*v.shape, *v.stride(), v.storage_offset()) if isinstance(v, torch.Tensor)
                else (v,))
        if any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in vals):
            return True
    return False
