"""Small on-disk caches (calibrations, measured-plan choices, kernel search results).

One JSON file per cache under ``~/.cache/eqgrad`` (or ``$EQGRAD_CACHE_DIR``), with a version:
entries of another version are ignored. Files are written atomically (a temporary file, then
rename) and a file that does not parse is treated as empty and rebuilt -- a bad entry is never
trusted, and nothing is ever executed or unpickled from the cache (JSON only).
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=None)
def _default_dir() -> str:
    return str(Path.home() / ".cache" / "eqgrad")


def cache_dir() -> Path:
    d = Path(os.environ.get("EQGRAD_CACHE_DIR") or _default_dir())
    d.mkdir(parents=True, exist_ok=True)
    return d


class JsonCache:
    def __init__(self, name: str, version: int):
        self.name, self.version = name, version
        # the last parse, keyed by (file, mtime, size, inode): realize() consults the calibrations on every
        # call, so an unchanged file is not read again (a rewrite, by any process, is seen)
        self._memo: tuple[Any, dict[str, Any]] = (None, {})

    @property
    def path(self) -> Path:
        return cache_dir() / f"{self.name}.json"

    def load(self) -> dict[str, Any]:
        """The entries (a fresh dict the caller may change)."""
        f = os.path.join(os.environ.get("EQGRAD_CACHE_DIR") or _default_dir(), f"{self.name}.json")
        try:
            st = os.stat(f)
        except OSError:
            return {}
        stamp = (f, st.st_mtime_ns, st.st_size, st.st_ino)
        if self._memo[0] != stamp:
            self._memo = (stamp, self._parse(f))
        return dict(self._memo[1])

    def _parse(self, f: str) -> dict[str, Any]:
        try:
            with open(f) as fh:
                data = json.loads(fh.read())
            if not isinstance(data, dict) or data.get("version") != self.version:
                return {}
            entries = data.get("entries", {})
            return entries if isinstance(entries, dict) else {}
        except (OSError, ValueError):
            return {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.load().get(key, default)

    def put(self, key: str, value: Any) -> Path:
        entries = self.load()
        entries[key] = value
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": self.version, "entries": entries}, indent=1))
        os.replace(tmp, self.path)
        return self.path
