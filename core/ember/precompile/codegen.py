"""fx graphs as standalone Python source: the function, the imports its globals need, and its
tensor constants as literals (so the artifact needs nothing but torch to run them)."""

from __future__ import annotations

import builtins
import importlib
import math
import operator
import re
from typing import Any

import torch
import torch.fx

from .errors import PrecompileError

__all__ = ["graph_source", "PRELUDE", "tensor_literal"]

#: Names fx's generated code may use besides its recorded globals; defined once per artifact.
PRELUDE = ('inf = float("inf")\n'
           'nan = float("nan")\n'
           "NoneType = type(None)\n"
           "device = torch.device\n")
_PRELUDE_NAMES = {"inf", "nan", "NoneType", "device", "torch"}
#: Modules an artifact may import besides torch: the standard library's pure helpers.
_ALLOWED_MODULES = ("torch", "operator", "math", "builtins", "_operator")
_MAX_CONSTANT = 1 << 16


def _import_expr(name: str, obj: Any) -> str:
    """``name = <expr>`` for one fx global, importing only torch and the standard library."""
    if obj is torch:
        return ""
    if isinstance(obj, type(torch)):  # a module
        mod = obj.__name__
        if not mod.split(".")[0] in _ALLOWED_MODULES:
            raise PrecompileError(f"the graph uses the module {mod}; a precompiled artifact "
                                  "imports only torch and Ember's runtime")
        return f"import {mod} as {name}"
    if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
        return f"{name} = {obj!r}" if str(obj).startswith("torch.") else f"{name} = torch.{obj}"
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None)
    if mod and qual and mod.split(".")[0] in _ALLOWED_MODULES and "<" not in qual:
        try:
            target: Any = importlib.import_module(mod)
            for part in qual.split("."):
                target = getattr(target, part)
        except Exception:
            target = None
        if target is obj:
            return f"import {mod} as _m_{name}\n{name} = _m_{name}.{qual}"
    for mod_obj in (operator, math, builtins):
        for k, v in vars(mod_obj).items():
            if v is obj and not k.startswith("_"):
                return f"import {mod_obj.__name__} as _m_{name}\n{name} = _m_{name}.{k}"
    raise PrecompileError(
        f"the graph calls {obj!r} ({mod}.{qual}), which a precompiled artifact cannot import "
        "(it imports only torch, the standard library and Ember's runtime). Keep such calls "
        "out of the precompiled function.")


def tensor_literal(t: torch.Tensor, what: str) -> str:
    """A tensor constant as a Python expression that rebuilds it exactly."""
    if t.layout is not torch.strided or t.is_quantized or t.is_complex():
        raise PrecompileError(f"{what}: a {t.layout} / {t.dtype} constant cannot be written "
                              "as source")
    if t.numel() > _MAX_CONSTANT:
        raise PrecompileError(f"{what}: a tensor constant of {t.numel()} elements is too large "
                              f"to write into the artifact's source (limit {_MAX_CONSTANT}); "
                              "pass it as an argument or register it as a buffer")
    values = t.detach().cpu().tolist()
    text = repr(values).replace("inf", "float('inf')").replace("nan", "float('nan')")
    return (f"torch.tensor({text}, dtype={t.dtype!r}, device={str(t.device)!r})"
            f".reshape({tuple(t.shape)!r})")


def graph_source(gm: torch.fx.GraphModule, name: str) -> tuple[str, str]:
    """(source of ``def {name}(self, ...)``, expression of its ``self`` holding constants)."""
    if type(gm.graph._codegen) is not torch.fx.graph.CodeGen:
        raise PrecompileError(f"graph {name}: custom fx code generation "
                              f"({type(gm.graph._codegen).__name__}) is not supported")
    pc = gm.graph.python_code(root_module="self")
    src = pc.src
    src, n = re.subn(r"\bdef forward\(", f"def {name}(", src, count=1)
    if n != 1:
        raise PrecompileError(f"graph {name}: unexpected fx code:\n{src[:200]}")
    imports = []
    for gname, obj in pc.globals.items():
        if gname in _PRELUDE_NAMES or gname in ("fx_pytree", "pytree") and gname not in \
                src.replace(f"def {name}(", ""):
            continue
        if gname in ("fx_pytree", "pytree"):
            raise PrecompileError(f"graph {name} uses pytree-structured inputs/outputs")
        line = _import_expr(gname, obj)
        if line:
            imports.append(line)
    consts = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            if "." in node.target:
                raise PrecompileError(f"graph {name}: nested attribute {node.target!r}")
            val = getattr(gm, node.target)
            if not isinstance(val, torch.Tensor):
                raise PrecompileError(f"graph {name} reads {node.target!r} of type "
                                      f"{type(val).__name__}; only tensor constants are "
                                      "supported")
            consts.append(f"{node.target}={tensor_literal(val, f'graph {name}, {node.target}')}")
        elif node.op == "call_module":
            raise PrecompileError(f"graph {name} calls a submodule ({node.target}); "
                                  "precompile needs graphs of tensor operations")
    body = "\n".join(imports + [src.strip("\n")]) + "\n"
    self_expr = f"_rt.Constants({', '.join(consts)})" if consts else "None"
    return body, self_expr
