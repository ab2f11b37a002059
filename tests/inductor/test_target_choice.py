"""Which code generator a graph gets. Every value of the graph decides its device, not only its
inputs: the sweep of OpInfo on an H200 found ``torch.zeros(10, device="cuda")`` (a graph with no
input) compiled for the CPU target, which allocated the result on the CPU."""

from __future__ import annotations

import torch
import torch.fx

from ember_inductor.codegen.target import target_for


class _OnCuda(torch.Tensor):
    """A CPU tensor that reports a CUDA device (target_for only reads ``.device``)."""

    @property
    def device(self):  # type: ignore[override]
        return torch.device("cuda", 0)


def _graph(values):
    g = torch.fx.Graph()
    x = g.placeholder("x")
    y = g.call_function(torch.ops.aten.add.Tensor, (x, 1))
    g.output((y,))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    x.meta["val"], y.meta["val"] = values
    return gm


def test_a_cuda_value_made_inside_picks_the_gpu_target():
    made_on_cuda = torch.empty(3).as_subclass(_OnCuda)
    target = target_for(_graph([torch.empty(3), made_on_cuda]), {})
    assert (target.name, target.device) == ("triton", "cuda")


def test_a_cuda_value_in_a_tuple_picks_the_gpu_target():
    made_on_cuda = torch.empty(3).as_subclass(_OnCuda)
    target = target_for(_graph([torch.empty(3), (torch.empty(1), made_on_cuda)]), {})
    assert target.device == "cuda"


def test_cpu_values_keep_the_cpu_target():
    target = target_for(_graph([torch.empty(3), torch.empty(3)]), {})
    assert target.device == "cpu" and target.name != "triton"
