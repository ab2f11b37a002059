"""The cache container of a precompiled artifact: named binary entries, never pickled.

Layout (all integers little-endian)::

    offset 0   8 bytes   magic b"EMBERPC\\x00"
    offset 8   u32       container version (CONTAINER_VERSION)
    offset 12  u32       length M of the manifest
    offset 16  M bytes   manifest, UTF-8 JSON:
                           {"version": 1,
                            "source_sha256": "<hex sha256 of the artifact source it belongs to>",
                            "platform": {...what the binaries need: backend, torch, machine...},
                            "entries": [{"name": str, "offset": int, "size": int,
                                         "sha256": hex}, ...]}
    offset 16+M          the entries' raw bytes, concatenated; ``offset`` is relative to here

Reading checks the magic, the version, the manifest, that every entry lies inside the file and
that its bytes hash to the manifest's sha256, that nothing trails the last entry, and that
``source_sha256`` is the hash of the source being loaded. Any failure raises
:class:`CacheError`. The hashes detect corruption, truncation and a cache paired with the wrong
source; they are not a signature (the source is code: trust it as you would trust an import).
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Mapping

from ..exc import EmberError

__all__ = ["MAGIC", "CONTAINER_VERSION", "CacheError", "pack", "unpack", "sha256"]

MAGIC = b"EMBERPC\x00"
CONTAINER_VERSION = 1
_HEADER = struct.Struct("<8sII")
_MAX_MANIFEST = 64 << 20


class CacheError(EmberError):
    """A precompiled artifact's cache is corrupt, truncated, of another version, or belongs to
    another source. It is refused, never partly used."""


def sha256(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def pack(entries: Mapping[str, bytes], *, source_sha256: str,
         platform: Mapping[str, Any] | None = None) -> bytes:
    """Build a container holding ``entries`` (name -> bytes) for the source with that hash."""
    manifest_entries = []
    blobs = []
    offset = 0
    for name in sorted(entries):
        data = bytes(entries[name])
        if not isinstance(name, str) or not name:
            raise ValueError(f"cache entry names must be non-empty strings, got {name!r}")
        manifest_entries.append({"name": name, "offset": offset, "size": len(data),
                                 "sha256": sha256(data)})
        blobs.append(data)
        offset += len(data)
    manifest = {"version": CONTAINER_VERSION, "source_sha256": source_sha256,
                "platform": dict(platform or {}), "entries": manifest_entries}
    mbytes = json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8")
    return _HEADER.pack(MAGIC, CONTAINER_VERSION, len(mbytes)) + mbytes + b"".join(blobs)


def read_manifest(data: bytes) -> tuple[dict[str, Any], int]:
    """The manifest of a container and where its payload starts (checks header and JSON)."""
    if len(data) < _HEADER.size:
        raise CacheError(f"cache refused: {len(data)} bytes is shorter than the container "
                         "header (truncated file?)")
    magic, version, mlen = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CacheError(f"cache refused: not an Ember precompile cache (magic {magic!r}, "
                         f"expected {MAGIC!r})")
    if version != CONTAINER_VERSION:
        raise CacheError(f"cache refused: container version {version}, this Ember reads "
                         f"version {CONTAINER_VERSION}; precompile the artifact again")
    if mlen > _MAX_MANIFEST or _HEADER.size + mlen > len(data):
        raise CacheError(f"cache refused: manifest length {mlen} runs past the end of the "
                         f"{len(data)}-byte file (truncated?)")
    try:
        manifest = json.loads(data[_HEADER.size:_HEADER.size + mlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CacheError(f"cache refused: the manifest is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("entries"), list) or \
            manifest.get("version") != CONTAINER_VERSION:
        raise CacheError("cache refused: the manifest lacks 'entries' or its version differs "
                         "from the header's")
    return manifest, _HEADER.size + mlen


def unpack(data: bytes, *, source_sha256: str) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Check a container and return (entries, platform). Raises :class:`CacheError`."""
    manifest, start = read_manifest(data)
    got = manifest.get("source_sha256")
    if got != source_sha256:
        raise CacheError(f"cache refused: it belongs to the source with sha256 {got}, but the "
                         f"source being loaded has sha256 {source_sha256} (artifact files mixed "
                         "up, or the source was edited); precompile again, or load without "
                         "the cache to rebuild from the source")
    payload = memoryview(data)[start:]
    entries: dict[str, bytes] = {}
    end = 0
    for e in manifest["entries"]:
        try:
            name, off, size, digest = e["name"], int(e["offset"]), int(e["size"]), e["sha256"]
        except (KeyError, TypeError, ValueError):
            raise CacheError(f"cache refused: malformed manifest entry {e!r}") from None
        if off < 0 or size < 0 or off + size > len(payload):
            raise CacheError(f"cache refused: entry {name!r} ({size} bytes at {off}) runs past "
                             f"the end of the payload ({len(payload)} bytes; truncated?)")
        blob = bytes(payload[off:off + size])
        if sha256(blob) != digest:
            raise CacheError(f"cache refused: entry {name!r} does not match its sha256 "
                             "(corrupted or tampered)")
        if name in entries:
            raise CacheError(f"cache refused: entry {name!r} appears twice")
        entries[name] = blob
        end = max(end, off + size)
    if end != len(payload):
        raise CacheError(f"cache refused: {len(payload) - end} unexpected bytes after the last "
                         "entry (tampered?)")
    platform = manifest.get("platform") or {}
    return entries, platform
