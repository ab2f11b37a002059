"""Ember's inductor backend: ATen graphs lowered to a loop-level IR, fused, and compiled to C++
(OpenMP) for the CPU, with matmul/convolution/attention and ops without a lowering left to ATen.

This module stays light: the compiler is imported when a graph is compiled.
"""

from __future__ import annotations

from typing import Any

import ember

from .precompile import ember_precompile_graph  # noqa: F401  (hookimpl for ember.precompile)

__all__ = ["compile_inductor"]


def compile_inductor(gm: Any, example_inputs: list[Any], *, context: Any = None,
                     **options: Any) -> Any:
    """Compile an ATen graph from Ember's AOT autograd; see :mod:`ember_inductor.compile_fx`.
    ``context`` (an ember CompileContext) is optional."""
    from .compile_fx import compile_inductor as compile_fx

    return compile_fx(gm, example_inputs, context=context, **options)


def _decompositions() -> Any:
    from .decompositions import decompositions

    return decompositions()


#: Every option ``compile_inductor`` reads (``ember.compile(options=...)`` refuses others).
OPTIONS = {
    "freezing": "fold parameter-only computation of inference graphs once (default True)",
    "freezing_check": "how folded parameters are checked per call: 'content' (default) or "
                      "'version' (cheaper; misses .data writes)",
    "fold_conv_bn": "fold BatchNorm into the convolution before it: 'auto' (default), "
                    "'always', or False",
    "layout_opt": "channels-last activations in graphs with convolutions: 'auto' (default: "
                  "timed on this machine for inference graphs, on for training), True, False",
    "onednn_conv": "channels-last float32 convolutions through oneDNN's own entry "
                   "(mkldnn._convolution_pointwise) instead of aten.convolution: 'auto' "
                   "(default: timed on this machine), True, False",
    "layout_weights": "also copy convolution weights channels-last: 'none' (default), "
                      "'backward', 'all'",
    "onednn_linear": "linear layers' kernel: 'auto' (default: ATen/MKL, oneDNN, pre-packed or "
                     "pre-transposed weights, timed on this machine), True/'always' (oneDNN), "
                     "False (eager's addmm)",
    "pad_mm": "GPU matrix multiplies with sizes cuBLAS's fast kernels cannot take: 'auto' "
              "(default: padded to aligned sizes where timing on this GPU says it pays), "
              "'always' (any device, untimed; for testing), False",
    "parallel_min_work": "work (elements) from which a generated loop runs OpenMP-parallel "
                         "(default: calibrated once on this machine, calibrate.py)",
    "buffer_pool": "keep large internal buffers allocated between calls (default True)",
    "buffer_pool_min_bytes": "smallest buffer the pool keeps (default 4 MiB)",
    "debug_fill": "fill every buffer with a NaN pattern before kernels write it and check "
                  "kernel writes, outputs and input strides for it (default: "
                  "ember.config.debug_fill, EMBER_DEBUG_FILL)",
    "cpu_codegen": "code generator of CPU graphs: 'cpp' (default) or 'triton' (Triton kernels "
                   "run by Triton's interpreter; needs TRITON_INTERPRET=1, for testing)",
    "cpu_isa": "instruction set the C++ is built for: 'native' (default; ember.config.cpu_isa, "
               "EMBER_CPU_ISA), 'x86-64-v4', 'x86-64-v3' (AVX2), 'x86-64-v2', 'x86-64'",
    "emulate_precision_casts": "round each float16/bfloat16 op's result to its dtype inside "
                               "fused kernels, as eager stores it (default False: fused "
                               "16-bit chains keep float32 intermediates; ~3x slower bfloat16 "
                               "chains in C++)",
}


@ember.hookimpl
def ember_backends() -> list[ember.Backend]:
    return [ember.Backend(name="inductor", compile=compile_inductor, level="aten",
                          decompositions=_decompositions, devices=("cpu", "cuda"),
                          description="lowering + fusion + C++/OpenMP codegen (CPU), "
                                      "Triton kernels (CUDA)",
                          options=OPTIONS)]
