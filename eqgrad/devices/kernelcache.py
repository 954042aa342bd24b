"""The disk cache of compiled LLVM kernels: object code, so a later process skips O3 and codegen.

One file per kernel, ``<cache_dir>/kernels/<key>.o`` (eqgrad/cache.py: the directory, its checks and
its writes, safe against other threads, processes and planted files). The key (``kernel_key``) is a
sha256 of everything the machine code depends on: the kernel's LLVM IR, the target CPU's name and
features, whether stores were made non-temporal, llvmlite's and LLVM's versions, eqgrad's version
and a digest of devices/llvm.py and devices/llvm_worker.py (the renderer, the O3 pipeline and the
post-optimization rewrite live there, so an edited checkout misses rather than loads code of the
compiler before the edit). The function's symbol is named by the key, so an object file defines
exactly the symbol its key names.

A file is ``MAGIC``, one JSON header line ``{"key", "sha256", "size", "nontemporal_stores"}``,
then the object's bytes. Object code is executed, so what is read is checked before LLVM sees
it: the file must be a regular file owned by this user and writable by no one else (the
directory is created 0700, files 0600), and its header must name this key, the object's size and
the sha256 of its bytes -- a truncated or altered file is a miss with one ``CacheWarning``
naming it, and the recompiled kernel replaces it (LLVM's object reader aborts the process on
some malformed objects, so a corrupt file must never reach it). The checksum guards against
corruption, not against this user's own account: anyone who can write the user's cache
directory can already run code as the user.

A hit touches its file (least recently used is evicted first). The directory is kept within
``EQGRAD_KERNEL_CACHE_BYTES``: each process counts the bytes it writes on top of its last scan
and scans (deleting the oldest files by mtime) only when that estimate passes the bound, so a
plan of hundreds of kernels costs one scan, not one per kernel. ``EQGRAD_DISK_CACHE=0`` turns
the cache off, as it does the plan cache (engine/diskcache.py). Lowered kernels' sources
(``store_lowered``, below) are ``<cache_dir>/lowered/<key>.ll`` files of the same format, kept
within the same bound on their own.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from eqgrad import config
from eqgrad.cache import (Refused, _warn_once, _why, _write_atomic, cache_subdir, evict_lru, keep_within, read_private,
                          source_digest)
from eqgrad.counters import GlobalCounters

FORMAT = 1
SUBDIR = "kernels"
SUBDIRS = {".o": SUBDIR, ".ll": "lowered"}     # object code; lowered kernels' sources (below)
MAGIC = b"EQGRAD-KERNEL-OBJECT 1\n"
_LLVM_PY = (Path(__file__).with_name("llvm.py"), Path(__file__).with_name("llvm_worker.py"))



@functools.lru_cache(maxsize=1)
def _versions() -> str:
    """llvmlite's and LLVM's versions, eqgrad's, and a digest of devices/llvm*.py (read once)."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in _LLVM_PY)).hexdigest()
    return f"llvmlite {llvmlite.__version__} LLVM {'.'.join(map(str, llvm.llvm_version_info))} eqgrad {config.VERSION} llvm.py {digest}"


def kernel_key(src: str, cpu: str, features: str, nontemporal: bool) -> str:
    """The cache key of ``src`` compiled for (``cpu``, ``features``): a sha256 in hex."""
    text = repr((FORMAT, _versions(), cpu, features, bool(nontemporal), src))
    return hashlib.sha256(text.encode()).hexdigest()


def _dir(sub: str = SUBDIR) -> Path | None:
    return cache_subdir(sub) if config.DISK_CACHE.value else None


def _bad(path: Path, stamp: object, why: str) -> None:
    _warn_once(("kernel file", stamp), f"eqgrad: ignored the cached kernel {path}: {why} (the kernel is "
                                       f"compiled again and the file rewritten)")


def load(key: str) -> tuple[bytes, int] | None:
    """(object code, non-temporal stores made) stored under ``key``, or None: a miss (a bad file
    warns once, see the module)."""
    hit = _load(key)
    if hit is not None:
        GlobalCounters.kernel_disk_hits += 1
    return hit


def _load(key: str, suffix: str = ".o") -> tuple[bytes, int] | None:
    d = _dir(SUBDIRS[suffix])
    if d is None:
        return None
    path = d / f"{key}{suffix}"
    try:
        data, st = read_private(path)      # a regular file of this user's that no one else can write
    except (FileNotFoundError, NotADirectoryError):
        return None
    except Refused as e:
        _bad(path, (str(path), e.st.st_mtime_ns, e.st.st_size),
             f"expected a regular file of this user's, writable only by it ({e}): object code is executed")
        return None
    except OSError as e:
        _bad(path, str(path), f"cannot be opened or read ({_why(e)})")
        return None
    stamp = (str(path), st.st_mtime_ns, st.st_size)
    why, obj, nt = _parse(data, key)
    if why is not None:
        _bad(path, stamp, why)
        return None
    with contextlib.suppress(OSError):
        os.utime(path)                     # recently used: evicted last
    return obj, nt


def unusable(key: str, why: str) -> None:
    """A file that passed the checks did not load into an engine (``why``): warn once; the
    recompiled kernel replaces it."""
    d = _dir()
    if d is not None:
        path = d / f"{key}.o"
        _bad(path, (str(path), "load", why), f"its object code does not load ({why})")


def _parse(data: bytes, key: str) -> tuple[str | None, bytes, int]:
    """(why the file is bad or None, the object's bytes, non-temporal stores)."""
    if not data.startswith(MAGIC):
        return f"expected a file starting with {MAGIC!r}, got {data[:len(MAGIC)]!r}", b"", 0
    end = data.find(b"\n", len(MAGIC))
    if end < 0:
        return "no header line", b"", 0
    try:
        head = json.loads(data[len(MAGIC):end])
    except ValueError as e:
        return f"a header that is not JSON ({e})", b"", 0
    obj = data[end + 1:]
    if not isinstance(head, dict):
        return f"expected a header object, got {type(head).__name__}", b"", 0
    if head.get("key") != key:
        return f"written for another key ({str(head.get('key'))[:16]}...)", b"", 0
    if head.get("size") != len(obj):
        return f"expected {head.get('size')!r} bytes of object code, got {len(obj)} (truncated?)", b"", 0
    if head.get("sha256") != hashlib.sha256(obj).hexdigest():
        return "the object code's sha256 is not the header's (the file was altered)", b"", 0
    nt = head.get("nontemporal_stores")
    if type(nt) is not int or nt < 0:
        return f"expected nontemporal_stores to be an integer >= 0, got {nt!r}", b"", 0
    return None, obj, nt


def store(key: str, obj: bytes, nontemporal_stores: int, suffix: str = ".o") -> Path | None:
    """Write the object code under ``key`` (atomically), then keep the directory within
    EQGRAD_KERNEL_CACHE_BYTES; the file, or None when not kept (caching off, the bound, or an
    OSError, which warns once)."""
    d = _dir(SUBDIRS[suffix])
    if d is None:
        return None
    path = d / f"{key}{suffix}"
    head = json.dumps({"key": key, "sha256": hashlib.sha256(obj).hexdigest(), "size": len(obj),
                       "nontemporal_stores": nontemporal_stores}, separators=(",", ":")).encode()
    data = MAGIC + head + b"\n" + obj
    bound = config.KERNEL_CACHE_BYTES.value
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        _write_atomic(path, data, durable=False)       # read back only through its sha256
        keep_within(d, len(data), bound, suffix)
    except OSError as e:
        _warn_once(("kernel store", str(d)), f"eqgrad: could not store a compiled kernel in {d} ({_why(e)}); "
                                             f"kernels are compiled again in the next process")
        return None
    return path if path.exists() else None


# ------------------------------------------------------------------ lowered kernels
# A later process that reads a plan from disk would still lower and render each kernel only to
# find its source's object code here. So the source is kept too, by the kernel's structure
# (devices.kernel_structure: its body with buffers numbered by parameter, their shapes and dtypes,
# the lanes) and eqgrad's own sources (cache.source_digest: the lowering, the renderer): a file
# like an object file (the same checks), whose payload is JSON {"src", "n", "nontemporal",
# "n_params"}. A miss of any kind only means the kernel is lowered.

def lowered_key(structure: object, cpu: str, features: str) -> str:
    text = repr(("lowered", FORMAT, source_digest(), _versions(), cpu, features, structure))
    return hashlib.sha256(text.encode()).hexdigest()


def load_lowered(key: str) -> dict | None:
    """What ``store_lowered`` kept under ``key`` (checked), or None."""
    hit = _load(key, ".ll")
    if hit is None:
        return None
    try:
        v = json.loads(hit[0])
    except ValueError:
        return None
    ok = (isinstance(v, dict) and isinstance(v.get("src"), str) and type(v.get("n")) is int and v["n"] >= 1
          and type(v.get("nontemporal")) is bool and type(v.get("n_params")) is int and v["n_params"] >= 1
          and (v.get("sizes") is None or (isinstance(v["sizes"], list) and all(type(x) is int for x in v["sizes"]))))
    if not ok:
        _bad(_dir(SUBDIRS[".ll"]) / f"{key}.ll", (key, "lowered"),
             "a lowered kernel's entry without src, n, nontemporal, n_params (or with sizes that are not integers)")
        return None
    GlobalCounters.lowered_disk_hits += 1
    return v


_stored: set[str] = set()       # lowered keys this process stored (each is written once)


def store_lowered(key: str, src: str, n: int, nontemporal: bool, n_params: int, sizes: list[int] | None = None) -> None:
    """Keep a lowered kernel's LLVM IR under its structure's key; ``sizes``: the values it passes to
    a sized program (devices/sizeargs.py), whose source this is."""
    if key in _stored or len(_stored) > 100_000:
        return
    _stored.add(key)
    entry = {"src": src, "n": n, "nontemporal": nontemporal, "n_params": n_params}
    if sizes is not None:
        entry["sizes"] = sizes
    store(key, json.dumps(entry).encode(), 0, ".ll")


def evict(d: Path, bound: int, suffix: str = ".o") -> int:
    """Delete the least recently used kernel files of ``d`` until they hold at most ``bound``
    bytes (cache.evict_lru); the bytes that remain."""
    return evict_lru(d, bound, suffix)
