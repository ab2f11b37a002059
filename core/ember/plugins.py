"""The backend registry: pluggy plugins found through ``ember.plugins`` entry points.

Discovery is eager and cheap (entry-point metadata only); importing a plugin's module happens the
first time backends are looked up or listed. A plugin's top-level module must stay light (no
triton, no CUDA initialisation, no codegen): heavy imports belong inside its ``compile`` function,
so that ``list_backends()`` and ``python -m ember backends`` stay cheap.

Isolation: a plugin that fails to import (or whose ``ember_backends()`` raises or returns
something that is not a list of :class:`Backend`) is remembered with its error, logged once, shown
in :func:`backend_table`, and named in the error raised when its backend is asked for; the other
plugins keep working. Two plugins declaring the same backend name make *that name* unusable, with
an error naming both distributions; the other names keep working.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import threading
import types
from typing import Any, Callable, Iterable, Mapping

import pluggy

from . import hookspecs
from .exc import BackendConflict, BackendLoadError, BackendNotFound, UnknownOption

try:  # the backport is a declared dependency; the stdlib module is a fallback with the same API
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
    "graph_passes",
    "rescan",
]

log = logging.getLogger("ember.plugins")

ENTRY_POINT_GROUP = "ember.plugins"

#: Where each first-party backend comes from, for "pip install ..." hints: name -> (dir, dist).
KNOWN_PROVIDERS: dict[str, tuple[str, str]] = {
    "eager": ("plugins/eager", "ember-eager"),
    "aot_eager": ("plugins/aot_eager", "ember-aot-eager"),
    "inductor": ("plugins/inductor", "ember-inductor"),
    "cudagraphs": ("plugins/cudagraphs", "ember-cudagraphs"),
}

IN_PROCESS = "<in-process>"


@dataclasses.dataclass(frozen=True)
class Backend:
    """A backend declaration.

    ``compile(gm, example_inputs, **options) -> callable`` receives a torch-level
    ``fx.GraphModule`` (``level="torch"``) or, for ``level="aten"``, the forward and backward
    ATen graphs produced by Ember's AOT autograd, one call each. The callable it returns takes the
    graph's inputs positionally and returns the graph's outputs. A compile function that declares
    a parameter named ``context`` (``def compile(gm, example_inputs, *, context=None,
    **options)``) also receives an :class:`ember.CompileContext` (graph id, graph kind, which
    inputs are parameters/buffers and have stable addresses, device, mode, options); one that
    does not is called exactly as before (``accepts_context``, decided once per Backend).

    ``decompositions`` (aten level only) is a dict ``{OpOverload: fn}`` or a zero-argument callable
    returning one (called lazily, so building the table costs nothing at listing time).
    ``training=False`` marks an inference-only backend: Ember refuses graphs that need grad.
    ``recompute`` (aten level, training): AOT autograd may recompute cheap forward values
    (pointwise ops, copies, fills) in the backward instead of saving them, which saves memory and
    costs nothing for a backend that fuses those ops into its kernels (inductor). A backend that
    runs each ATen op as a kernel of its own sets ``recompute=False``: only views are then
    recomputed, and the backward gets the values it reads, as eager saves them.
    ``tags`` such as ``"debug"`` or ``"experimental"`` hide a backend from ``list_backends()``'s
    default listing. ``plugin``, ``distribution`` and ``version`` are filled in by the registry.
    """

    name: str
    compile: Callable[..., Any]
    level: str = "torch"
    decompositions: Mapping[Any, Callable[..., Any]] | Callable[[], Mapping[Any, Any]] | None = \
        dataclasses.field(default=None, compare=False)
    training: bool = True
    devices: tuple[str, ...] = ("cpu", "cuda")
    tags: tuple[str, ...] = ()
    description: str = ""
    # Filled in by the registry:
    plugin: str = ""
    distribution: str = ""
    version: str = ""
    #: Every option ``compile`` reads: name -> one-line description. ``ember.compile(options=)``
    #: refuses any other key (``mode`` is always allowed). ``None``: not declared; then the
    #: keyword parameters of ``compile`` are the options, or anything goes if it takes
    #: ``**options`` (backends written before this field existed keep working).
    options: Mapping[str, str] | None = dataclasses.field(default=None, compare=False)
    #: Backends on an external runtime: a zero-argument callable returning one line about it
    #: (``"onnxruntime 1.32.0, providers: CPUExecutionProvider"``), called only when backends
    #: are listed (``python -m ember backends``), so it may import the runtime.
    runtime: Callable[[], str] | None = dataclasses.field(default=None, compare=False)
    #: May AOT autograd recompute cheap forward values in the backward (see above)?
    recompute: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Backend name must be a non-empty string, got {self.name!r}")
        if self.level not in ("torch", "aten"):
            raise ValueError(f"Backend {self.name!r}: level must be 'torch' or 'aten', "
                             f"got {self.level!r}")
        if not callable(self.compile):
            raise TypeError(f"Backend {self.name!r}: compile must be callable")
        # Accept lists and plain strings for the tuple fields; store tuples (hashable, immutable).
        for f in ("devices", "tags"):
            v = getattr(self, f)
            object.__setattr__(self, f, (v,) if isinstance(v, str) else tuple(v))
        if self.options is not None:
            object.__setattr__(self, "options", types.MappingProxyType(dict(self.options)))
        from .context import accepts_context
        object.__setattr__(self, "_accepts_context", accepts_context(self.compile))

    @property
    def accepts_context(self) -> bool:
        """Does ``compile`` declare a ``context`` parameter (so Ember passes ``context=``)?"""
        return self.__dict__["_accepts_context"]

    def accepted_options(self) -> Mapping[str, str] | None:
        """The options this backend takes (name -> description), or None when it cannot be
        known (an undeclared ``compile`` that takes ``**options``)."""
        if self.options is not None:
            return self.options
        fn = getattr(self.compile, "__wrapped__", self.compile)
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            return None
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        named = [p for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        named = [p for p in named if p.kind is p.KEYWORD_ONLY] + \
            [p for p in named if p.kind is p.POSITIONAL_OR_KEYWORD][2:]  # after gm, inputs
        return {p.name: "" for p in named if p.name != "context"}

    def check_options(self, options: Mapping[str, Any], caller: str = "ember.compile") -> None:
        """Raise :class:`ember.UnknownOption` for a key this backend does not take."""
        accepted = self.accepted_options()
        if accepted is None:
            return
        for key in options:
            if key == "mode" or key in accepted:
                continue
            valid = sorted(accepted)
            close = difflib.get_close_matches(str(key), valid, n=3, cutoff=0.6)
            hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
            listing = (f"Its options: {', '.join(valid)}." if valid else
                       "It takes no options.")
            raise UnknownOption(
                f"{caller}: backend {self.name!r} ({self.provider}) has no option "
                f"{key!r}.{hint} {listing} `python -m ember backends --options` describes "
                "each backend's options.")

    def get_decompositions(self) -> Mapping[Any, Any]:
        d = self.decompositions
        if d is None:
            return {}
        return d() if callable(d) else d

    @property
    def provider(self) -> str:
        """``"distribution version"`` (or ``<in-process>``), for messages."""
        if self.distribution in ("", IN_PROCESS, "<callable>"):
            return self.distribution or IN_PROCESS
        return f"{self.distribution} {self.version}".strip()


@dataclasses.dataclass
class _PluginRecord:
    name: str  # entry-point name
    value: str  # "module" or "module:attr"
    distribution: str
    version: str
    entry_point: Any = None
    pm_name: str = ""  # the name it is registered under in the PluginManager
    loaded: bool = False
    error: BaseException | None = None
    error_text: str = ""
    backends: list[Backend] = dataclasses.field(default_factory=list)


def _collect(impls: Iterable[Any], plugin: str, distribution: str, version: str) -> list[Backend]:
    out: list[Backend] = []
    for impl in impls:
        result = impl.function()
        if result is None:
            continue
        if isinstance(result, Backend):  # be forgiving: one Backend instead of a list
            result = [result]
        for b in result:
            if not isinstance(b, Backend):
                raise TypeError(f"ember_backends() returned a {type(b).__name__}, expected a "
                                "list of ember.Backend")
            out.append(dataclasses.replace(b, plugin=plugin, distribution=distribution,
                                           version=version))
    return out


class _Registry:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.pm = pluggy.PluginManager("ember")
        self.pm.add_hookspecs(hookspecs)
        self.records: list[_PluginRecord] | None = None
        self.local: dict[str, Backend] = {}
        self.all_loaded = False

    # -- discovery (metadata only, nothing imported) ---------------------------------------
    def discover(self) -> list[_PluginRecord]:
        with self.lock:
            if self.records is None:
                records: list[_PluginRecord] = []
                seen: dict[str, _PluginRecord] = {}
                for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
                    dist = getattr(ep, "dist", None)
                    rec = _PluginRecord(
                        name=ep.name,
                        value=ep.value,
                        distribution=dist.metadata["Name"] if dist is not None else "?",
                        version=dist.version if dist is not None else "?",
                        entry_point=ep,
                    )
                    key = (rec.name, rec.value, rec.distribution)
                    if any((r.name, r.value, r.distribution) == key for r in records):
                        continue  # the same distribution found twice on sys.path
                    # Two distributions may use the same entry-point name; keep both so that a
                    # backend-name clash is reported naming both distributions.
                    rec.pm_name = rec.name if rec.name not in seen else \
                        f"{rec.name}@{rec.distribution}"
                    seen.setdefault(rec.name, rec)
                    records.append(rec)
                self.records = records
            return self.records

    # -- loading (imports the plugin module) ------------------------------------------------
    def load(self, rec: _PluginRecord) -> None:
        with self.lock:
            if rec.loaded:
                return
            rec.loaded = True
            registered = False
            try:
                plugin = rec.entry_point.load()
                self.pm.register(plugin, name=rec.pm_name)
                registered = True
                impls = [i for i in self.pm.hook.ember_backends.get_hookimpls()
                         if i.plugin_name == rec.pm_name]
                rec.backends = _collect(impls, rec.name, rec.distribution, rec.version)
                log.debug("loaded ember plugin %r from %s %s: backends %s", rec.name,
                          rec.distribution, rec.version, [b.name for b in rec.backends])
            except Exception as e:  # isolation: one broken plugin never breaks the others
                if registered:
                    self.pm.unregister(name=rec.pm_name)
                rec.error = e
                rec.error_text = f"{type(e).__name__}: {e}"
                rec.backends = []
                log.warning("ember plugin %r (distribution %s %s) failed to load and is skipped: "
                            "%s", rec.name, rec.distribution, rec.version, rec.error_text)

    def load_all(self) -> None:
        if self.all_loaded:
            return
        with self.lock:
            for rec in self.discover():
                self.load(rec)
            self.all_loaded = True

    def failed(self) -> list[_PluginRecord]:
        return [r for r in self.discover() if r.error is not None]

    def _in_process_plugin_backends(self) -> list[Backend]:
        """Backends of plugin objects registered directly with ``plugin_manager().register``."""
        ep_names = {r.pm_name for r in self.discover()}
        out: list[Backend] = []
        for impl in self.pm.hook.ember_backends.get_hookimpls():
            if impl.plugin_name in ep_names:
                continue
            try:
                out.extend(_collect([impl], impl.plugin_name, IN_PROCESS, ""))
            except Exception as e:
                log.warning("in-process ember plugin %r: ember_backends() failed: %s: %s",
                            impl.plugin_name, type(e).__name__, e)
        return out

    def index(self) -> tuple[dict[str, Backend], dict[str, list[Backend]]]:
        """``(name -> Backend, name -> [Backend, ...] for names declared more than once)``."""
        self.load_all()
        declared: dict[str, list[Backend]] = {}
        for rec in self.discover():
            for b in rec.backends:
                declared.setdefault(b.name, []).append(b)
        for b in self._in_process_plugin_backends():
            declared.setdefault(b.name, []).append(b)
        backends = {n: bs[0] for n, bs in declared.items() if len(bs) == 1}
        conflicts = {n: bs for n, bs in declared.items() if len(bs) > 1}
        for n, b in self.local.items():  # register_backend() already refused plugin names
            backends[n] = b
            conflicts.pop(n, None)
        return backends, conflicts

    def find(self, name: str) -> Backend:
        if name in self.local:
            return self.local[name]
        backends, conflicts = self.index()
        if name in conflicts:
            raise BackendConflict(_conflict_message(name, conflicts[name]))
        if name in backends:
            return backends[name]
        for rec in self.failed():
            if rec.name == name:
                raise BackendLoadError(
                    f"backend {name!r} comes from plugin {rec.name!r} (distribution "
                    f"{rec.distribution} {rec.version}), which failed to load: {rec.error_text}. "
                    f"Fix or reinstall that package (pip install --force-reinstall "
                    f"{rec.distribution}), or choose another backend: {sorted(backends)}"
                ) from rec.error
        raise BackendNotFound(_not_found_message(name, sorted(backends), self.failed()))

    def names(self, exclude_tags: Iterable[str] = ()) -> list[str]:
        backends, conflicts = self.index()
        ex = set(exclude_tags or ())
        names = {n for n, b in backends.items() if not (ex & set(b.tags))}
        for n, bs in conflicts.items():
            log.warning("%s", _conflict_message(n, bs))
            if not any(ex & set(b.tags) for b in bs):
                names.add(n)
        return sorted(names)

    def reset_discovery(self) -> None:
        with self.lock:
            for rec in self.records or ():
                if rec.loaded and rec.error is None and self.pm.has_plugin(rec.pm_name):
                    self.pm.unregister(name=rec.pm_name)
            self.records = None
            self.all_loaded = False


def _conflict_message(name: str, declared: list[Backend]) -> str:
    who = " and ".join(f"distribution {b.provider} (plugin {b.plugin!r})" for b in declared)
    return (f"ember backend {name!r} is declared by more than one plugin: {who}. Uninstall all but "
            f"one of them (e.g. pip uninstall {declared[-1].distribution}); the other backends "
            "keep working.")


def _not_found_message(name: str, installed: list[str], failed: list[_PluginRecord]) -> str:
    msg = (f"unknown ember backend {name!r}. Installed backends: "
           f"{', '.join(installed) if installed else 'none'}.")
    close = difflib.get_close_matches(name, installed, n=1)
    if close:
        msg += f" Did you mean {close[0]!r}?"
    known = KNOWN_PROVIDERS.get(name)
    if known:
        msg += (f" It is provided by the {known[1]} distribution: pip install ./{known[0]} "
                "(from the Ember source tree).")
    else:
        msg += (" Install the plugin package that provides it, register one with "
                "ember.register_backend(name, fn), or pass a callable (gm, example_inputs) -> "
                "callable as backend=.")
    if failed:
        msg += " Note: these plugins failed to load and may provide it: " + "; ".join(
            f"{r.name!r} ({r.distribution} {r.version}): {r.error_text}" for r in failed)
    return msg


_registry = _Registry()


def plugin_manager() -> pluggy.PluginManager:
    """The pluggy PluginManager; register an in-process plugin object with ``.register(obj)``."""
    return _registry.pm


def rescan() -> None:
    """Forget discovered plugins so the next lookup reads entry points again (after a
    ``pip install`` in a running process). In-process registrations are kept."""
    _registry.reset_discovery()


def register_backend(name: str | Callable[..., Any] | None = None,
                     compiler_fn: Callable[..., Any] | None = None, *, level: str = "torch",
                     decompositions: Any = None, training: bool = True,
                     devices: tuple[str, ...] = ("cpu", "cuda"), tags: tuple[str, ...] = (),
                     description: str = "", override: bool = False) -> Any:
    """Register an in-process backend.

    ``register_backend("mine", fn)``, or as a decorator: ``@register_backend`` (the function's
    name) or ``@register_backend(name="mine", training=False)``. ``fn(gm, example_inputs,
    **options)`` returns a callable. Registering again under the same name replaces the earlier
    in-process registration; a name an installed plugin provides raises :class:`BackendConflict`
    unless ``override=True``. Returns ``compiler_fn`` unchanged.
    """

    def do(fn: Callable[..., Any], nm: str | None) -> Callable[..., Any]:
        nm = nm or getattr(fn, "__name__", None)
        if not nm:
            raise ValueError("register_backend: give a name for this backend")
        if not override:
            backends, conflicts = _registry.index()
            taken = conflicts.get(nm) or ([backends[nm]] if nm in backends else [])
            taken = [b for b in taken if b.distribution != IN_PROCESS or b.plugin != "<local>"]
            if taken:
                raise BackendConflict(
                    f"register_backend: the name {nm!r} is already provided by "
                    f"{' and '.join(b.provider for b in taken)}. Choose another name, or pass "
                    "override=True to shadow it in this process.")
        _registry.local[nm] = Backend(name=nm, compile=fn, level=level,
                                      decompositions=decompositions, training=training,
                                      devices=tuple(devices), tags=tuple(tags),
                                      description=description, plugin="<local>",
                                      distribution=IN_PROCESS)
        return fn

    if callable(name) and compiler_fn is None:  # bare decorator
        return do(name, None)
    if compiler_fn is not None:
        return do(compiler_fn, name)  # type: ignore[arg-type]
    return lambda fn: do(fn, name)  # type: ignore[arg-type]


def _accepts_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a plain ``(gm, example_inputs)`` callable so that ``**options`` it does not declare
    (``mode=...``) are not forced on it; callables taking ``**kwargs`` get everything."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn
    accepted = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    def call(gm: Any, example_inputs: Any, **options: Any) -> Any:
        dropped = [k for k in options if k not in accepted]
        if dropped:
            log.debug("backend %r does not take options %s; not passed", fn, dropped)
        return fn(gm, example_inputs, **{k: v for k, v in options.items() if k in accepted})

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def get_backend(backend: str | Callable[..., Any] | Backend) -> Backend:
    """Resolve ``backend=`` (a name, a Backend, or a plain callable) to a :class:`Backend`.

    Raises :class:`BackendNotFound` (listing the installed backends), :class:`BackendLoadError`
    (the providing plugin failed to import) or :class:`BackendConflict` (two plugins declare it).
    """
    if isinstance(backend, Backend):
        return backend
    if isinstance(backend, str):
        return _registry.find(backend)
    if callable(backend):
        nm = getattr(backend, "__name__", type(backend).__name__)
        return Backend(name=nm, compile=_accepts_options(backend), plugin="<callable>",
                       distribution="<callable>")
    raise TypeError(f"backend= must be a backend name, an ember.Backend or a callable, "
                    f"got {type(backend).__name__}")


def list_backends(exclude_tags: Iterable[str] | None = ("debug", "experimental")) -> list[str]:
    """Names of the installed backends, sorted; backends tagged with one of ``exclude_tags`` are
    hidden (pass ``exclude_tags=()`` to see all). Plugins that fail to load are skipped (and
    logged); :func:`backend_table` shows them with their error."""
    return _registry.names(exclude_tags or ())


def _runtime_line(b: Backend) -> str:
    if b.runtime is None:
        return ""
    try:
        return str(b.runtime())
    except Exception as e:  # a listing never fails because of one backend
        return f"runtime unknown ({type(e).__name__}: {e})"


def backend_table() -> list[dict[str, Any]]:
    """One row per backend, and one per plugin that failed to load, sorted by name.

    Keys: name, plugin, distribution, version, level, training ("yes"/"inference-only"),
    devices, tags, description, status ("ok", "FAILED: <error>" or "CONFLICT: ..."), runtime
    (``Backend.runtime()``'s line, "" when it has none).
    """
    _registry.load_all()
    _, conflicts = _registry.index()
    rows: list[dict[str, Any]] = []

    def row(b: Backend) -> dict[str, Any]:
        status = "ok"
        if b.name in conflicts:
            others = [o.provider for o in conflicts[b.name] if o is not b]
            status = f"CONFLICT: also declared by {', '.join(others)}"
        return dict(name=b.name, plugin=b.plugin, distribution=b.distribution, version=b.version,
                    level=b.level, training="yes" if b.training else "inference-only",
                    devices=",".join(b.devices), tags=",".join(b.tags),
                    description=b.description, status=status, runtime=_runtime_line(b))

    for rec in _registry.discover():
        if rec.error is not None:
            rows.append(dict(name=rec.name, plugin=rec.name, distribution=rec.distribution,
                             version=rec.version, level="?", training="?", devices="?", tags="",
                             description="", status=f"FAILED: {rec.error_text}"))
        rows.extend(row(b) for b in rec.backends)
    rows.extend(row(b) for b in _registry._in_process_plugin_backends())
    rows.extend(row(b) for b in _registry.local.values())
    return sorted(rows, key=lambda r: (r["name"], r["distribution"]))


def graph_passes(stage: str) -> list[Callable[..., Any]]:
    """The passes every plugin returns from ``ember_graph_passes(stage)``, in plugin
    registration order (pluggy calls implementations last-registered first)."""
    _registry.load_all()
    out: list[Callable[..., Any]] = []
    for res in reversed(_registry.pm.hook.ember_graph_passes(stage=stage)):
        for p in res or ():
            if not callable(p):
                raise TypeError(f"ember_graph_passes({stage!r}) returned a non-callable {p!r}")
            out.append(p)
    return out


def ensure_loaded() -> None:
    """Import every discovered plugin once (cheap after the first call)."""
    _registry.load_all()
