"""FX node arguments as JSON values and back, for the on-disk caches (AOT results, persisted
captures): nodes by name, floats exactly (hex), dtypes/devices/layouts/memory formats by name,
tuples, lists, string-keyed dicts, ``torch.Size``, slices and ``...``. Never pickle."""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx

__all__ = ["encode_arg", "decode_arg"]

_TORCH_NAMED = {"dtype": torch.dtype, "layout": torch.layout, "mf": torch.memory_format}


def encode_arg(x: Any, error: type[Exception] = ValueError) -> Any:
    """``x`` as JSON; anything else raises ``error`` (the caller's "cannot cache this")."""
    if isinstance(x, fx.Node):
        return {"n": x.name}
    if x is None or isinstance(x, (bool, str)) or type(x) is int:
        return x
    if type(x) is float:
        return {"f": x.hex()}
    for tag, cls in _TORCH_NAMED.items():
        if isinstance(x, cls):
            return {tag: str(x).removeprefix("torch.")}
    if isinstance(x, torch.device):
        return {"device": str(x)}
    if isinstance(x, torch.Size):
        return {"size": [encode_arg(v, error) for v in x]}
    if type(x) is tuple:
        return {"t": [encode_arg(v, error) for v in x]}
    if isinstance(x, list):  # fx's immutable_list too
        return [encode_arg(v, error) for v in x]
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):  # and immutable_dict
        return {"d": {k: encode_arg(v, error) for k, v in x.items()}}
    if type(x) is slice:
        return {"slice": [encode_arg(x.start, error), encode_arg(x.stop, error),
                          encode_arg(x.step, error)]}
    if x is Ellipsis:
        return {"ellipsis": 0}
    raise error(f"graph argument of type {type(x).__name__}")


def decode_arg(x: Any, env: dict[str, fx.Node]) -> Any:
    """The inverse of :func:`encode_arg`, nodes looked up in ``env``; raises ValueError on
    anything :func:`encode_arg` does not write."""
    if isinstance(x, list):
        return [decode_arg(v, env) for v in x]
    if not isinstance(x, dict):
        return x
    (tag, v), = x.items()
    if tag == "n":
        return env[v]
    if tag == "f":
        return float.fromhex(v)
    if tag == "t":
        return tuple(decode_arg(e, env) for e in v)
    if tag == "d":
        return {k: decode_arg(e, env) for k, e in v.items()}
    if tag == "size":
        return torch.Size(decode_arg(e, env) for e in v)
    if tag == "slice":
        return slice(*(decode_arg(e, env) for e in v))
    if tag == "ellipsis":
        return Ellipsis
    if tag in _TORCH_NAMED:
        obj = getattr(torch, v)
        if not isinstance(obj, _TORCH_NAMED[tag]):
            raise ValueError(f"not a torch {tag}: {v}")
        return obj
    if tag == "device":
        return torch.device(v)
    raise ValueError(f"unknown tag {tag!r}")
