"""The instruction set the C++ target builds for (option ``cpu_isa``, ``EMBER_CPU_ISA``).

Light on purpose (no sympy): every compile asks, a warm start included."""

from __future__ import annotations

from typing import Any

__all__ = ["CPU_ISAS", "cpu_isa"]

#: x86-64 micro-architecture levels: the CPU flags each needs (besides "native": the machine's).
CPU_ISAS: dict[str, tuple[str, ...]] = {
    "native": (),
    "x86-64": ("sse2",),
    "x86-64-v2": ("sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16"),
    "x86-64-v3": ("sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "avx", "avx2", "fma",
                  "bmi1", "bmi2", "f16c", "movbe"),
    "x86-64-v4": ("sse2", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "avx", "avx2", "fma",
                  "bmi1", "bmi2", "f16c", "movbe", "avx512f", "avx512bw", "avx512cd", "avx512dq",
                  "avx512vl"),
}


def cpu_isa(options: dict[str, Any] | None = None) -> str:
    """The instruction set to build for: ``options["cpu_isa"]``, else ``ember.config.cpu_isa``
    (``EMBER_CPU_ISA``), else "native". Raises ValueError for a name not in :data:`CPU_ISAS` or
    one this CPU cannot run (its code would die of an illegal instruction)."""
    value = (options or {}).get("cpu_isa")
    where = "options={'cpu_isa': ...}"
    if value is None:
        import ember

        value = getattr(ember.config, "cpu_isa", "native") or "native"
        where = "ember.config.cpu_isa (EMBER_CPU_ISA)"
    value = str(value)
    if value not in CPU_ISAS:
        raise ValueError(f"ember-inductor: {where} is {value!r}; valid values: "
                         f"{', '.join(map(repr, CPU_ISAS))}")
    if value != "native":
        import platform

        from ember.precompile.runtime import cpu_flags

        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise ValueError(f"ember-inductor: {where} is {value!r}, an x86-64 level, but this "
                             f"machine is {platform.machine()}; use 'native'")
        have = set(cpu_flags().split())
        missing = [f for f in CPU_ISAS[value] if f not in have]
        if have and missing:
            raise ValueError(f"ember-inductor: {where} is {value!r}, but this CPU lacks "
                             f"{', '.join(missing)} (code built for it would not run here); "
                             "use 'native' or a lower level")
    return value
