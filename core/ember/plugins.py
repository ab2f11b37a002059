"""The backend registry: pluggy plugins found through ``ember.plugins`` entry points.

Discovery is eager and cheap (entry-point metadata only); importing a plugin happens the first
time its backends are needed. A plugin's top-level module must stay light (no triton, no CUDA
initialisation): heavy imports belong inside its ``compile`` function. A plugin that fails to
import is remembered with its error and reported by name; the others keep working.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from typing import Any, Callable, Iterable, Mapping

import pluggy

from . import hookspecs
from .exc import BackendConflict, BackendLoadError, BackendNotFound

try:  # Python 3.11's stdlib lacks the `packages_distributions` conveniences; prefer the backport.
    import importlib_metadata as metadata
except ImportError:  # pragma: no cover
    from importlib import metadata  # type: ignore[no-redef]

__all__ = [
    "Backend",
    "ENTRY_POINT_GROUP",
    "plugin_manager",
    "register_backend",
    "get_backend",
    "list_backends",
    "backend_table",
]

log = logging.getLogger("ember.plugins")

ENTRY_POINT_GROUP = "ember.plugins"

#: Where each first-party backend comes from, for "pip install ..." hints.
KNOWN_PROVIDERS = {
    "eager": "plugins/eager (ember-eager)",
    "aot_eager": "plugins/aot_eager (ember-aot-eager)",
    "inductor": "plugins/inductor (ember-inductor)",
    "cudagraphs": "plugins/cudagraphs (ember-cudagraphs)",
}


@dataclasses.dataclass(frozen=True)
class Backend:
    """A backend declaration.

    ``compile(gm, example_inputs, **options) -> callable`` receives a torch-level
    ``fx.GraphModule`` (``level="torch"``) or, for ``level="aten"``, the forward and backward
    ATen graphs produced by Ember's AOT autograd, one call each. ``decompositions`` (aten level
    only) is a dict ``{OpOverload: fn}`` or a zero-argument callable returning one (called lazily).
    ``training=False`` marks an inference-only backend: Ember refuses graphs that need grad.
    """

    name: str
    compile: Callable[..., Any]
    level: str = "torch"
    decompositions: Mapping[Any, Callable[..., Any]] | Callable[[], Mapping[Any, Any]] | None = None
    training: bool = True
    devices: tuple[str, ...] = ("cpu", "cuda")
    tags: tuple[str, ...] = ()
    description: str = ""
    # Filled in by the registry:
    plugin: str = ""
    distribution: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        if self.level not in ("torch", "aten"):
            raise ValueError(f"Backend {self.name!r}: level must be 'torch' or 'aten', got {self.level!r}")
        if not callable(self.compile):
            raise TypeError(f"Backend {self.name!r}: compile must be callable")

    def get_decompositions(self) -> Mapping[Any, Any]:
        d = self.decompositions
        if d is None:
            return {}
        return d() if callable(d) else d


@dataclasses.dataclass
class _PluginRecord:
    name: str  # entry-point name
    value: str  # "module" or "module:attr"
    distribution: str
    version: str
    entry_point: Any = None
    loaded: bool = False
    error: BaseException | None = None
    error_text: str = ""
    backends: list[Backend] = dataclasses.field(default_factory=list)


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pm = pluggy.PluginManager("ember")
        self.pm.add_hookspecs(hookspecs)
        self.records: dict[str, _PluginRecord] | None = None
        self.local: dict[str, Backend] = {}

    # -- discovery (metadata only) ---------------------------------------------------------
    def discover(self) -> dict[str, _PluginRecord]:
        with self.lock:
            if self.records is None:
                self.records = {}
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    dist = getattr(ep, "dist", None)
                    rec = _PluginRecord(
                        name=ep.name,
                        value=ep.value,
                        distribution=dist.metadata["Name"] if dist is not None else "?",
                        version=dist.version if dist is not None else "?",
                        entry_point=ep,
                    )
                    if ep.name in self.records:
                        other = self.records[ep.name]
                        log.warning("entry point %r declared by both %s and %s; using the first",
                                    ep.name, other.distribution, rec.distribution)
                        continue
                    self.records[ep.name] = rec
            return self.records

    # -- loading (imports the plugin module) ------------------------------------------------
    def load(self, rec: _PluginRecord) -> None:
        with self.lock:
            if rec.loaded:
                return
            rec.loaded = True
            try:
                plugin = rec.entry_point.load()
                self.pm.register(plugin, name=rec.name)
                impls = [i for i in self.pm.hook.ember_backends.get_hookimpls()
                         if i.plugin_name == rec.name]
                backends: list[Backend] = []
                for impl in impls:
                    for b in impl.function() or ():
                        if not isinstance(b, Backend):
                            raise TypeError(f"ember_backends() returned {type(b).__name__}, "
                                            "expected ember.Backend")
                        backends.append(dataclasses.replace(
                            b, plugin=rec.name, distribution=rec.distribution, version=rec.version))
                rec.backends = backends
            except Exception as e:  # isolation: one broken plugin never breaks the others
                rec.error = e
                rec.error_text = f"{type(e).__name__}: {e}"
                rec.backends = []
                log.warning("ember plugin %r (distribution %s %s) failed to load: %s",
                            rec.name, rec.distribution, rec.version, rec.error_text)

    def load_all(self) -> None:
        for rec in self.discover().values():
            self.load(rec)

    def all_backends(self) -> dict[str, Backend]:
        """name -> Backend over every loadable plugin plus in-process registrations."""
        self.load_all()
        out: dict[str, Backend] = {}
        for rec in self.discover().values():
            for b in rec.backends:
                if b.name in out:
                    first = out[b.name]
                    raise BackendConflict(
                        f"backend {b.name!r} is declared by two plugins: distribution "
                        f"{first.distribution} (plugin {first.plugin!r}) and distribution "
                        f"{b.distribution} (plugin {b.plugin!r}). Uninstall one of them "
                        f"(pip uninstall {b.distribution})."
                    )
                out[b.name] = b
        out.update(self.local)
        return out

    def find(self, name: str) -> Backend:
        if name in self.local:
            return self.local[name]
        recs = self.discover()
        # Fast path: the plugin whose entry-point name is the backend name.
        rec = recs.get(name)
        if rec is not None:
            self.load(rec)
            if rec.error is not None:
                raise BackendLoadError(
                    f"backend {name!r} comes from plugin {rec.name!r} (distribution "
                    f"{rec.distribution} {rec.version}), which failed to import: {rec.error_text}. "
                    f"Fix or reinstall that package (pip install --force-reinstall "
                    f"{rec.distribution}), or choose another backend: {self.names()}"
                ) from rec.error
        backends = self.all_backends()
        if name in backends:
            return backends[name]
        hint = KNOWN_PROVIDERS.get(name)
        where = (f" It is provided by {hint}: pip install ./{hint.split()[0]}" if hint else
                 " Install the plugin package that provides it, or pass a callable "
                 "(gm, example_inputs) -> callable as backend=.")
        raise BackendNotFound(
            f"unknown ember backend {name!r}. Installed backends: {sorted(backends) or 'none'}.{where}"
        )

    def names(self, exclude_tags: Iterable[str] = ()) -> list[str]:
        try:
            backends = self.all_backends()
        except BackendConflict:
            raise
        ex = set(exclude_tags or ())
        return sorted(n for n, b in backends.items() if not (ex & set(b.tags)))


_registry = _Registry()


def plugin_manager() -> pluggy.PluginManager:
    """The pluggy PluginManager; register an in-process plugin object with ``.register(obj)``."""
    return _registry.pm


def register_backend(name: str | Callable[..., Any] | None = None,
                     compiler_fn: Callable[..., Any] | None = None, *, level: str = "torch",
                     decompositions: Any = None, training: bool = True,
                     devices: tuple[str, ...] = ("cpu", "cuda"),
                     tags: tuple[str, ...] = ()) -> Any:
    """Register an in-process backend: ``register_backend("mine", fn)`` or as a decorator
    (``@register_backend`` / ``@register_backend(name="mine")``). Returns ``compiler_fn``."""

    def do(fn: Callable[..., Any], nm: str | None) -> Callable[..., Any]:
        nm = nm or fn.__name__
        _registry.local[nm] = Backend(name=nm, compile=fn, level=level, decompositions=decompositions,
                                      training=training, devices=tuple(devices), tags=tuple(tags),
                                      plugin="<in-process>", distribution="<in-process>")
        return fn

    if callable(name) and compiler_fn is None:  # bare decorator
        return do(name, None)
    if compiler_fn is not None:
        return do(compiler_fn, name)  # type: ignore[arg-type]
    return lambda fn: do(fn, name)  # type: ignore[arg-type]


def get_backend(backend: str | Callable[..., Any] | Backend) -> Backend:
    """Resolve ``backend=`` (a name, a Backend, or a plain callable) to a :class:`Backend`."""
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, str):
        return _registry.find(backend)
    if callable(backend):
        nm = getattr(backend, "__name__", type(backend).__name__)
        return Backend(name=nm, compile=backend, plugin="<callable>", distribution="<callable>")
    raise TypeError(f"backend= must be a backend name, an ember.Backend or a callable, "
                    f"got {type(backend).__name__}")


def list_backends(exclude_tags: Iterable[str] | None = ("debug", "experimental")) -> list[str]:
    """Names of the backends installed plugins provide, sorted; tags in ``exclude_tags`` hidden."""
    return _registry.names(exclude_tags or ())


def backend_table() -> list[dict[str, Any]]:
    """One row per backend and per plugin that failed to load (for ``python -m ember backends``)."""
    rows: list[dict[str, Any]] = []
    _registry.load_all()
    for rec in _registry.discover().values():
        if rec.error is not None:
            rows.append(dict(name=rec.name, distribution=rec.distribution, version=rec.version,
                             level="?", training="?", devices="?", tags="",
                             status=f"FAILED: {rec.error_text}"))
        for b in rec.backends:
            rows.append(dict(name=b.name, distribution=b.distribution, version=b.version,
                             level=b.level, training="yes" if b.training else "inference-only",
                             devices=",".join(b.devices), tags=",".join(b.tags), status="ok"))
    for b in _registry.local.values():
        rows.append(dict(name=b.name, distribution="<in-process>", version="", level=b.level,
                         training="yes" if b.training else "inference-only",
                         devices=",".join(b.devices), tags=",".join(b.tags), status="ok"))
    return sorted(rows, key=lambda r: r["name"])


def graph_passes(stage: str) -> list[Callable[..., Any]]:
    _registry.load_all()
    out: list[Callable[..., Any]] = []
    for res in _registry.pm.hook.ember_graph_passes(stage=stage):
        out.extend(res or ())
    return out
