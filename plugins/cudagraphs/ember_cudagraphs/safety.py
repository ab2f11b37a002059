"""Which ATen graphs may be recorded into a CUDA graph, and why not.

A recorded CUDA graph replays the *device* work of one run: the kernels and copies, at the same
addresses, with the host-side decisions of that run frozen in. So a graph is refused (it runs as
it is, without CUDA graphs, with the reason logged) when a replay could not reproduce eager:

* it reads or makes CPU tensors from its inputs (host work is not replayed; a CPU input's value
  would be baked in), or its inputs are not on CUDA;
* it synchronizes with the host (``.item()``, ``nonzero``, ``masked_select``, data-dependent
  sizes): capture forbids it and the sizes would be frozen anyway;
* it runs on several devices;
* it uses random numbers in a way a replay cannot advance: a CPU generator, RNG-state ops
  (``get_rng_state``/``set_rng_state``/``seed``); a CUDA generator passed explicitly is
  registered with the graph (``CUDAGraph.register_generator_state``) when torch offers it;
* it mutates one of its inputs in place (Ember's AOT graphs are functional: mutations are
  returned and copied back outside the graph, so this only concerns other producers of graphs).

The default CUDA generator needs nothing: a capture registers it, and each replay advances its
philox offset, so dropout draws fresh masks from eager's distribution on every replay.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

__all__ = ["refusal_reason", "generators"]

_aten = torch.ops.aten

#: Ops that read a value back to the host or whose output size depends on tensor data.
_SYNC_OPS = {
    "_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique", "_unique2",
    "unique_consecutive", "unique_dim", "equal", "is_nonzero", "allclose", "bincount",
    "repeat_interleave", "_assert_async", "_assert_scalar", "histogram", "tolist",
    "_nested_tensor_from_mask", "argwhere", "nonzero_numpy",
}
#: RNG-state ops: a replay would not redo what they do on the host.
_RNG_STATE_OPS = {"get_rng_state", "set_rng_state", "seed", "manual_seed", "initial_seed",
                  "run_and_save_rng_state", "run_with_rng_state"}


#: Ops that copy between devices: from host memory they cannot be captured (pageable copies),
#: and a host value would be read once, at recording.
_COPY_OPS = {"_to_copy", "copy", "copy_", "to", "_copy_from", "_copy_from_and_resize",
             "lift_fresh_copy"}


def _cpu_arg(n: torch.fx.Node, scalars_ok: bool) -> bool:
    for a in n.all_input_nodes:
        for t in _tensors(a.meta.get("val")):
            if t.device.type == "cpu" and not (scalars_ok and t.dim() == 0):
                return True
    return False


def _op_name(target: Any) -> str:
    name = getattr(target, "__name__", None) or str(target)
    # OpOverload: "add.Tensor" / packet: "add"
    schema = getattr(target, "_schema", None)
    if schema is not None:
        return schema.name.split("::")[-1]
    return name.split(".")[0]


def _tensors(v: Any) -> list[torch.Tensor]:
    if isinstance(v, torch.Tensor):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors(x)]
    return []


def _unbacked(v: Any) -> bool:
    try:
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    except Exception:  # pragma: no cover - every supported torch has it
        return False
    try:
        return bool(free_unbacked_symbols(v))
    except Exception:
        return False


def generators(gm: torch.fx.GraphModule) -> list[torch.Generator]:
    """The explicit generators the graph's nodes pass (``generator=`` arguments)."""
    out: list[torch.Generator] = []
    for n in gm.graph.nodes:
        for a in list(n.args) + list(n.kwargs.values()):
            if isinstance(a, torch.Generator) and all(a is not g for g in out):
                out.append(a)
    return out


def _where(n: torch.fx.Node) -> str:
    st = n.meta.get("stack_trace")
    if st:
        last = [ln.strip() for ln in st.strip().splitlines() if ln.strip()]
        if last:
            return f" ({last[-2] if len(last) > 1 else last[-1]})"
    return ""


def refusal_reason(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   user_inputs: Sequence[bool] | None = None) -> str | None:
    """Why ``gm`` must not be recorded, or None. ``user_inputs[i]``: placeholder i is a user
    input (not a parameter/buffer), for the mutation check."""
    devices: set[str] = set()
    for i, t in enumerate(example_inputs):
        if isinstance(t, torch.Tensor):
            if t.device.type == "meta":
                # a value whose device is decided at run time (SDPA's philox seed and offset:
                # CUDA tensors inside a capture, CPU ones outside), which a backward receives
                continue
            if t.device.type != "cuda":
                return (f"input {i} is a {t.device.type} tensor {tuple(t.shape)}: a CUDA graph "
                        "replays only device work, so its value would be frozen at recording")
            devices.add(str(t.device))
    if len(devices) > 1:
        return f"its inputs are on several devices ({', '.join(sorted(devices))})"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ph_index = {n: i for i, n in enumerate(placeholders)}
    # which nodes depend on an input (a CPU value made only of constants is baked in correctly)
    dynamic: set[torch.fx.Node] = set(placeholders)
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("val")
            if _unbacked(v):
                return f"input {n.name} has a data-dependent size"
            continue
        if n.op != "call_function":
            continue
        if any(a in dynamic for a in n.all_input_nodes):
            dynamic.add(n)
        name = _op_name(n.target)
        if name in _SYNC_OPS:
            return (f"it synchronizes with the host: {name}{_where(n)} (a value read back or a "
                    "size that depends on tensor data)")
        if name in _RNG_STATE_OPS:
            return f"it reads or sets the RNG state: {name}{_where(n)}"
        for a in list(n.args) + list(n.kwargs.values()):
            if isinstance(a, torch.Generator) and a.device.type != "cuda":
                return (f"{name}{_where(n)} draws from a {a.device.type} generator, which a "
                        "CUDA graph replay cannot advance")
        val = n.meta.get("val")
        if any(t.device.type == "cuda" for t in _tensors(val)) and _cpu_arg(
                n, scalars_ok=name not in _COPY_OPS):
            return (f"{name}{_where(n)} reads a CPU tensor into a CUDA one (host memory is not "
                    "read again when a CUDA graph replays)")
        if _unbacked(val):
            return f"{name}{_where(n)} has a data-dependent size"
        for t in _tensors(val):
            if t.device.type == "cpu" and n in dynamic:
                return (f"{name}{_where(n)} makes a CPU tensor from the inputs (host work is "
                        "not replayed)")
            if t.device.type == "cpu" and t.dim() > 0:
                return f"{name}{_where(n)} makes a CPU tensor {tuple(t.shape)}"
            if t.device.type == "cuda":
                devices.add(str(t.device) if t.device.index is not None else "cuda")
        schema = getattr(n.target, "_schema", None)
        if schema is not None and schema.is_mutable:
            for arg, v in zip(schema.arguments, n.args):
                mutated = arg.alias_info is not None and arg.alias_info.is_write
                if mutated and isinstance(v, torch.fx.Node) and v in ph_index:
                    i = ph_index[v]
                    if user_inputs is None or (i < len(user_inputs) and user_inputs[i]):
                        return (f"{name}{_where(n)} mutates input {v.name} in place inside the "
                                "graph")
    cuda_devices = {d for d in devices if d != "cuda"}
    if len(cuda_devices) > 1:
        return f"it runs on several devices ({', '.join(sorted(cuda_devices))})"
    return None
