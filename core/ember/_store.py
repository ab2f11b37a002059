"""Ember's on-disk store: where the caches live, atomic writes, and the text store.

One implementation for every cache: the AOT cache (``ember.aot.cache``), persisted captures
(``ember.capture.persist``) and the inductor plugin's kernel cache and text entries
(``ember_inductor.runtime.cache``) all use it, so they agree on the folder and on the format.

* :func:`cache_dir`: ``EMBER_CACHE_DIR`` if set (read at each call), else
  ``ember.config.cache_dir`` if it was changed from its default, else ``$XDG_CACHE_HOME/ember``
  or ``~/.cache/ember``; always absolute.
* :func:`atomic_write`: a unique temporary file in the target's folder, then ``os.replace``:
  readers see the old entry or the new one, never a partial one, and processes writing the same
  entry at once are safe (the last writer wins, with identical content for a content-addressed
  key).
* The text store, ``<cache dir>/text/<namespace>/<sha256(key)>.json``: a JSON record
  ``{"format", "key", "sha256", "text"}``. Content-addressed by the key; on read the format, the
  full key and the text's hash are checked, so a truncated, corrupt or colliding entry is a miss
  (and is rewritten by the next :func:`put_text`). Never unpickled: the text is JSON or source
  that the caller parses and checks itself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import re
import tempfile
from typing import Callable

__all__ = ["TEXT_FORMAT", "cache_dir", "atomic_write", "unlink", "text_path", "put_text",
           "get_text"]

log = logging.getLogger("ember.cache")

#: The text store's record format: bump when a record's meaning changes (old ones then miss).
TEXT_FORMAT = 1
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def cache_dir() -> pathlib.Path:
    """The root of Ember's on-disk caches (see the module docstring)."""
    from . import config

    env = os.environ.get("EMBER_CACHE_DIR")
    configured = getattr(config, "cache_dir", None)
    default = os.path.join(os.path.expanduser("~"), ".cache", "ember")
    if env:
        path = env
    elif configured and configured != default:
        path = configured
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = os.path.join(xdg, "ember") if xdg else default
    # Absolute: paths handed out must not change meaning when the process changes its working
    # directory.
    return pathlib.Path(os.path.abspath(os.path.expanduser(path)))


def unlink(path: str | pathlib.Path) -> None:
    """Remove ``path`` if it exists (errors ignored)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (see the module docstring); raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        unlink(tmp)
        raise


def text_path(namespace: str, key: str) -> pathlib.Path:
    """Where the text stored under ``(namespace, key)`` lives."""
    if not _NAMESPACE_RE.match(namespace):
        raise ValueError(f"cache namespace {namespace!r} must match {_NAMESPACE_RE.pattern}")
    return cache_dir() / "text" / namespace / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def put_text(namespace: str, key: str, text: str) -> None:
    """Store ``text`` under ``(namespace, key)``, atomically (last writer wins). The store is an
    optimization: a failed write (unwritable folder, full disk) is logged, not raised."""
    record = {"format": TEXT_FORMAT, "key": key,
              "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text}
    path = text_path(namespace, key)
    try:
        atomic_write(path, json.dumps(record).encode())
    except OSError as e:
        log.warning("could not write cache entry %s: %s", path, e)


def get_text(namespace: str, key: str,
             on_corrupt: Callable[[pathlib.Path], None] | None = None) -> str | None:
    """The text stored under ``(namespace, key)``; None when absent, or when the entry is
    truncated, corrupt or another key's (logged, and ``on_corrupt(path)`` is called)."""
    path = text_path(namespace, key)
    try:
        record = json.loads(path.read_bytes())
        text = record["text"]
        if (record.get("format") == TEXT_FORMAT and record.get("key") == key
                and isinstance(text, str)
                and hashlib.sha256(text.encode()).hexdigest() == record.get("sha256")):
            return text
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    log.warning("cache entry %s is corrupt; treated as a miss", path)
    if on_corrupt is not None:
        on_corrupt(path)
    return None
