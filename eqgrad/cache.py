"""Small on-disk caches (calibrations, measured-plan choices, kernel search results).

One JSON file per cache under ``~/.cache/eqgrad`` (or ``$EQGRAD_CACHE_DIR``), with a version:
entries of another version are ignored. Files are written atomically (a temporary file, then
rename) and a file that does not parse is treated as empty and rebuilt -- a bad entry is never
trusted, and nothing is ever executed or unpickled from the cache (JSON only).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    d = Path(os.environ.get("EQGRAD_CACHE_DIR") or Path.home() / ".cache" / "eqgrad")
    d.mkdir(parents=True, exist_ok=True)
    return d


class JsonCache:
    def __init__(self, name: str, version: int):
        self.name, self.version = name, version

    @property
    def path(self) -> Path:
        return cache_dir() / f"{self.name}.json"

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
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
