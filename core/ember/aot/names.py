"""Readable placeholder names for the ATen graphs: inputs named after where they come from.

A parameter ``self.fc.weight`` becomes ``p_fc_weight``, a buffer ``b_bn_running_mean``, a user
input ``x`` becomes ``l_x``, tangents ``tangents_1``, ... so that the ATen graphs printed by
``EMBER_LOGS=aot`` and the code a backend generates from them read like the model.
"""

from __future__ import annotations

import keyword
import re
from typing import Any, Sequence

import torch.fx as fx

__all__ = ["readable_name", "readable_names", "rename_placeholders"]

_PREFIX = {"parameter": "p_", "buffer": "b_"}

# self._modules['fc']._parameters['weight'] -> self.fc.weight (the dict a module keeps them in)
_MODULE_DICT = re.compile(r"\._(?:modules|parameters|buffers)\[(['\"])(.*?)\1\]")
# L['x'], G['w'], x['key'], x[0] -> .x, .w, .key, .0
_SUBSCRIPT = re.compile(r"\[(['\"]?)(.*?)\1\]")
_MAX_LEN = 80


def readable_name(kind: str, source: str, fallback: str = "") -> str:
    """A valid identifier for an input of kind ``kind`` read from ``source`` (an expression over
    the compiled function's arguments); ``fallback`` (or ``arg``) when it has none."""
    s = source or fallback or "arg"
    s = _MODULE_DICT.sub(r".\2", s)
    s = _SUBSCRIPT.sub(r".\2", s)
    s = re.sub(r"^(?:self|L\.self)\.", "", s)  # the module being compiled is implicit
    s = re.sub(r"\W+", "_", s).strip("_") or "arg"
    prefix = _PREFIX.get(kind, "l_" if source else "")
    name = prefix + s
    if len(name) > _MAX_LEN:  # keep the end (the leaf name) readable; uniqueness comes later
        name = prefix + s[-(_MAX_LEN - len(prefix)):].lstrip("_")
    if name[0].isdigit() or keyword.iskeyword(name):
        name = "_" + name
    return name


def readable_names(infos: Sequence[Any], fallback: Sequence[str]) -> list[str]:
    """Names for the primals of an ATen graph: from their ``InputInfo`` (kind, source) where the
    context gives one, else from the torch-level placeholders' names; unique."""
    names: list[str] = []
    seen: set[str] = set()
    for k, fb in enumerate(fallback):
        info = infos[k] if k < len(infos) else None
        if info is not None and info.source:
            base = readable_name(info.kind, info.source)
        else:
            base = readable_name("", "", fb)
        name, n = base, 1
        while name in seen:
            name = f"{base}_{n}"
            n += 1
        seen.add(name)
        names.append(name)
    return names


def rename_placeholders(gm: fx.GraphModule, names: Sequence[str]) -> fx.GraphModule:
    """A copy of ``gm`` whose first ``len(names)`` placeholders are named ``names`` (other nodes
    keep their names unless one clashes; fx then adds a suffix)."""
    old = gm.graph
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    placeholders = [n for n in old.nodes if n.op == "placeholder"]
    it = iter(names)
    for n in placeholders:
        name = next(it, None)
        new = g.placeholder(name if name is not None else n.name)
        new.meta = dict(n.meta)
        env[n] = new
    for n in old.nodes:
        if n.op != "placeholder":
            env[n] = g.node_copy(n, env.__getitem__)
    out = fx.GraphModule(gm, g)
    if hasattr(gm, "shape_env"):
        out.shape_env = gm.shape_env  # type: ignore[attr-defined]
    return out
