"""Small on-disk caches (calibrations, measured-plan choices, kernel search results), and
``computed_once``, an attribute computed on its first read (for every floor: this one is the ground).

One JSON file per cache under ``~/.cache/eqgrad`` (or ``$EQGRAD_CACHE_DIR``), with a version:
entries of another version are ignored. Nothing is unpickled from the cache (JSON only), nothing is
executed but the LLVM device's object code in ``kernels/`` (a file of this user's that no one else
may write, with its sha256 checked first: devices/kernelcache.py), and nothing read is trusted:

- the directory, the directories eqgrad makes in it (``plans/``, ``kernels/``, ``lowered/``,
  ``failed/``) and every file read from them must belong to this user (the effective uid) and be
  writable by no one else (``mode & 0o022 == 0``), as ssh refuses a key file: another user who can
  write them could make this process run their plan or object code. Files are opened without
  following a symlink (``O_NOFOLLOW``) and checked on the open descriptor (``read_private``). A
  refused directory turns its caching off, a refused file is a miss, each with one
  ``CacheWarning`` naming it and why (``why_untrusted``: one check for plans, kernels and these
  JSON files);
- a file that does not parse, or an entry its cache's ``check`` rejects (a calibration with
  ``bandwidth: 0``, a measured choice that is not a dict, a kernel-search pick that is not a
  setting), is ignored with one ``CacheWarning`` naming the file; the next store rewrites the file
  without it;
- a directory that cannot be used (not a directory, a dangling symlink, under a regular file, not
  writable, on a read-only file system) turns on-disk caching off with one ``CacheWarning``:
  "writable" is decided by creating a file there, not by mode bits, which do not bind root.

Writes are safe against other threads, other processes and planted files: under a lock (a
threading lock, and ``flock`` on ``.<name>.json.lock`` for other processes) the file is read
again, the new entry merged in, and the result written to a unique temporary file in the same
directory (``tempfile.mkstemp``: ``O_EXCL``, no symlink followed, mode 0600), fsynced and renamed
over the old file with ``os.replace`` (which replaces a symlink, never writes through it).
The directory is created 0700.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import math
import os
import platform
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from eqgrad import config

try:
    import fcntl
except ImportError:                  # not POSIX: threads are still serialized, processes are not
    fcntl = None                     # type: ignore[assignment]


class computed_once:
    """``functools.cached_property`` without its lock: the value is computed on the first read and
    kept in the instance's ``__dict__``, which later reads find first (a non-data descriptor), and
    which a caller may also fill itself. Python 3.11's cached_property takes one lock per
    attribute, shared by every instance, on each first read: a microsecond of each new output
    buffer, and a forked child waited forever on it when a parent thread held it at the fork.
    Two threads' first reads may both compute the value; for a pure function of
    immutable state that is harmless."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        v = obj.__dict__[self.name] = self.fn(obj)
        return v


class CacheWarning(UserWarning):
    """An on-disk cache file, entry or directory could not be used and was ignored (the message names it)."""


@functools.lru_cache(maxsize=None)
def _default_dir() -> str:
    return str(Path.home() / ".cache" / "eqgrad")


_lock = threading.RLock()            # serializes cache writes (and the bookkeeping below) between threads
# EQGRAD_CACHE_DIR's value -> the directory, or None when it cannot be used (checked once per process:
# realize() asks on every call)
_dirs: dict[Any, Path | None] = {}
# how stale a stamp ``JsonCache.recent_stamp`` may return: another process's rewrite of the
# calibration is seen by a running process's next realize after at most this long
RECENT_STAMP_S = 1.0
_warned: set[Any] = set()


def _after_fork_in_child() -> None:
    # made anew, not held across the fork: a JSON write holds it for an fsync, and what it guards
    # (the dicts above, a cache's memo) a thread leaves consistent at every bytecode. The parent
    # thread's half-written temporary file is its own; its flock is released by LOCK_UN (``put``).
    global _lock, _ESTIMATES_LOCK
    _lock = threading.RLock()
    _ESTIMATES_LOCK = threading.Lock()     # (an estimate is only an estimate)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _warn_once(key: Any, msg: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(msg, CacheWarning, stacklevel=4)


def _why(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


def _directory() -> Path:
    return Path(config.CACHE_DIR.value or _default_dir())


def _disable(d: Path, why: str) -> None:
    with _lock:
        for k, v in list(_dirs.items()):
            if v == d:
                _dirs[k] = None
    _warn_once(("dir", str(d)), f"eqgrad: the cache directory {d} cannot be used ({why}); on-disk caching "
                                f"is off (set EQGRAD_CACHE_DIR to a writable directory of this user's that "
                                f"no one else can write)")


def why_untrusted(st: os.stat_result) -> str | None:
    """Why a cache file or directory with this ``stat`` is refused, or None when it is not: it must
    belong to this user (the effective uid) and be writable by no one else, as ssh refuses a key
    file -- whoever else can write it can make this process run their plan or object code. (Root
    is not exempt: root's cache is root's alone too.)"""
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o022:
        who = {0o022: "group and others", 0o020: "group", 0o002: "others"}[st.st_mode & 0o022]
        return f"writable by {who} (mode {stat.filemode(st.st_mode)})"
    return None


class Refused(OSError):
    """A cache file that ``read_private`` refuses: not a regular file, or ``why_untrusted``.
    ``st`` is its ``fstat`` (for a warning's once-key)."""

    def __init__(self, why: str, st: os.stat_result):
        super().__init__(why)
        self.why, self.st = why, st

    def __str__(self) -> str:
        return self.why


def read_private(path: Path | str) -> tuple[bytes, os.stat_result]:
    """The bytes of the cache file ``path`` and its ``fstat``. Opened without following a symlink,
    and checked on the open descriptor (no one can swap the file between the check and the read):
    Refused when it is not a regular file or ``why_untrusted``; FileNotFoundError and any other
    OSError as ``open`` raises them."""
    # O_NONBLOCK: a FIFO planted under the name does not hang the open (it is then refused)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"not a regular file (mode {stat.filemode(st.st_mode)})", st)
        if (why := why_untrusted(st)) is not None:
            raise Refused(why, st)
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(), st
    finally:
        os.close(fd)


def cache_dir() -> Path | None:
    """The cache directory (created 0700 if missing), or None when it cannot be used (it cannot be
    created, no file can be made there, or ``why_untrusted``): then caching is off, with one
    CacheWarning naming the directory and why."""
    raw = config.CACHE_DIR.value
    try:
        return _dirs[raw]
    except KeyError:
        pass
    d = Path(raw or _default_dir())
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        why = why_untrusted(os.stat(d))
        if why is None:
            fd, probe = tempfile.mkstemp(dir=d, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
    except OSError as e:
        why = _why(e)
    if why is not None:
        with _lock:
            _dirs[raw] = None
        _disable(d, why)
        return None
    with _lock:
        if len(_dirs) > 64:
            _dirs.clear()
        _dirs[raw] = d
    return d


def cache_subdir(name: str) -> Path | None:
    """``cache_dir() / name`` (``plans``, ``kernels``, ``lowered``, ``failed``), or None when caching
    is off or that directory exists and is refused (``why_untrusted``: one CacheWarning naming it;
    its entries are then neither read nor written). Not created here: its writer creates it 0700.
    Checked on every call (one ``stat``), so a directory opened up meanwhile is refused too."""
    d = cache_dir()
    if d is None:
        return None
    sub = d / name
    try:
        st = os.stat(sub)
    except OSError:
        return sub          # missing (its writer creates it) or unusable: its reader and writer say so
    why = why_untrusted(st) if stat.S_ISDIR(st.st_mode) else None
    if why is not None:
        _warn_once(("dir", str(sub)), f"eqgrad: the cache directory {sub} cannot be used ({why}); what it "
                                      f"holds is neither read nor written (make it this user's, mode 0700, "
                                      f"or delete it)")
        return None
    return sub


def _write_atomic(path: Path, text: str | bytes, durable: bool = True) -> None:
    """``text`` (or bytes) into ``path``: a unique temporary file next to it (O_EXCL, mode 0600),
    fsynced, then renamed over ``path``. ``durable=False`` skips both fsyncs, for files whose
    reader checks their content (the compiled kernels' sha256: devices/kernelcache.py), where a
    file torn by a crash is only a miss: an fsync took 8 ms here (ext4), more than a small
    kernel's compile, and a plan writes hundreds of kernels."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if not durable:
        return
    with contextlib.suppress(OSError):                 # the rename itself survives a crash once the directory is synced
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def save_failed_source(stem: str, suffix: str, src: str) -> str:
    """Keep the source of a kernel that failed to compile, for the CompileError's message: returns
    ``"was written to PATH"`` (``<cache>/failed/``, or the system temp directory when caching is
    off) or ``"could not be written (why)"``. Writing it never raises: it must not hide the
    compile error."""
    name = f"{stem}-{hashlib.sha256(src.encode()).hexdigest()[:12]}{suffix}"
    try:
        failed = cache_subdir("failed")
    except Exception:                 # e.g. its CacheWarning turned into an error by a warnings filter
        failed = None
    err = "caching is off, or its failed/ directory is refused"
    if failed is not None:
        try:
            failed.mkdir(mode=0o700, exist_ok=True)
            path = failed / name
            _write_atomic(path, src)
            return f"was written to {path}"
        except OSError as e:
            err = _why(e)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f"eqgrad-failed-{stem}-", suffix=suffix)
        with os.fdopen(fd, "w") as fh:
            fh.write(src)
        return f"was written to {tmp}"
    except OSError as e:
        return f"could not be written ({err}; {_why(e)})"


Check = Callable[[Any], "str | None"]


class JsonCache:
    """One versioned JSON file of entries. ``check(value)`` says why an entry read from disk is bad
    (None when it is good): bad entries are dropped with one CacheWarning naming the file."""

    def __init__(self, name: str, version: int, check: Check | None = None):
        self.name, self.version, self.check = name, version, check
        # the last parse, keyed by (file, mtime, size, inode): realize() consults the calibrations on every
        # call, so an unchanged file is not read again (a rewrite, by any process, is seen)
        self._memo: tuple[Any, dict[str, Any]] = (None, {})
        self._file: tuple[Any, str] = (None, "")
        self._recent: tuple[Any, float, tuple | None] = (None, -math.inf, None)   # (directory, when, stamp)

    @property
    def path(self) -> Path:
        return _directory() / f"{self.name}.json"

    def stamp(self) -> tuple | None:
        """What identifies the file's current contents: (path, mtime, size, inode), or None when
        caching is off or there is no file. One ``stat``: a memo of anything derived from the
        entries is keyed by it (a rewrite, by any process, changes it)."""
        d = cache_dir()
        if d is None:
            return None
        if self._file[0] is not d:
            self._file = (d, str(d / f"{self.name}.json"))
        f = self._file[1]
        try:
            st = os.stat(f)
        except OSError:
            return None
        return (f, st.st_mtime_ns, st.st_size, st.st_ino)

    def recent_stamp(self, max_age: float = RECENT_STAMP_S) -> tuple | None:
        """``stamp()``, taken again only when it is older than ``max_age`` seconds or the cache
        directory changed: for what a cached realize keys on every call (the calibration), where a
        ``stat`` was a tenth of the call. A ``put`` by this process is seen at once (it renews the
        stamp); a rewrite by another process within ``max_age``."""
        d = cache_dir()
        r = self._recent
        now = time.monotonic()
        if r[0] is d and now - r[1] < max_age:
            return r[2]
        st = self.stamp()
        self._recent = (d, now, st)
        return st

    def load(self) -> dict[str, Any]:
        """The good entries (a fresh dict the caller may change); none when caching is off."""
        stamp = self.stamp()
        if stamp is None:
            return {}
        f = stamp[0]
        if self._memo[0] != stamp:
            self._memo = (stamp, self._parse(f, stamp))
        return dict(self._memo[1])

    def _parse(self, f: str, stamp: Any) -> dict[str, Any]:
        def bad(why: str) -> dict[str, Any]:
            _warn_once(("file", stamp), f"eqgrad: ignored the cache file {f}: {why} (it is rewritten on the next store)")
            return {}
        try:
            data = json.loads(read_private(f)[0])
        except Refused as e:
            return bad(f"refused: {e}")
        except OSError as e:
            return bad(f"cannot be read ({_why(e)})")
        except ValueError as e:
            return bad(f"not valid JSON ({e})")
        if not isinstance(data, dict):
            return bad(f"expected a JSON object with 'version' and 'entries', got {type(data).__name__}")
        if data.get("version") != self.version:
            return {}                         # another eqgrad version's file: not an error
        entries = data.get("entries", {})
        if not isinstance(entries, dict):
            return bad(f"expected 'entries' to be an object, got {type(entries).__name__}")
        if self.check is None:
            return entries
        good, rejected = {}, []
        for k, v in entries.items():
            why = self.check(v)
            if why is None:
                good[k] = v
            else:
                rejected.append(f"{k!r}: {why}")
        if rejected:
            more = f" (and {len(rejected) - 3} more)" if len(rejected) > 3 else ""
            _warn_once(("entries", stamp), f"eqgrad: ignored {len(rejected)} bad entr{'y' if len(rejected) == 1 else 'ies'} "
                                           f"in the cache file {f}: {'; '.join(rejected[:3])}{more}")
        return good

    def get(self, key: str, default: Any = None) -> Any:
        return self.load().get(key, default)

    def put(self, key: str, value: Any) -> Path | None:
        """Store one entry, merged under the lock with what other threads and processes stored; the
        file's path, or None when caching is off (one CacheWarning says why)."""
        d = cache_dir()
        if d is None:
            return None
        path = d / f"{self.name}.json"
        with _lock:
            try:
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                lock_fd = os.open(d / f".{self.name}.json.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
                try:
                    if fcntl is not None:
                        fcntl.flock(lock_fd, fcntl.LOCK_EX)
                    try:
                        st = os.stat(path)
                        entries = self._parse(str(path), (str(path), st.st_mtime_ns, st.st_size, st.st_ino))
                    except FileNotFoundError:
                        entries = {}
                    entries[key] = value
                    _write_atomic(path, json.dumps({"version": self.version, "entries": entries}, indent=1))
                    st = os.stat(path)
                    self._memo = ((str(path), st.st_mtime_ns, st.st_size, st.st_ino), dict(entries))
                    self._recent = (None, -math.inf, None)
                finally:
                    # unlocked, not only closed: a child forked meanwhile holds a copy of lock_fd,
                    # and the flock (on the open file, not the descriptor) stayed until it exited:
                    # the child's own put, and the parent's next, waited for it
                    if fcntl is not None:
                        fcntl.flock(lock_fd, fcntl.LOCK_UN)
                    os.close(lock_fd)
            except OSError as e:
                _disable(d, _why(e))
                return None
        return path


# ------------------------------------------------------------------ checks of entries read from disk

def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_fields(v: Any, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = (),
                 strings: tuple[str, ...] = ()) -> str | None:
    """Why ``v`` is not a dict with these finite number fields (> 0, >= 0) and string fields, or None."""
    if not isinstance(v, dict):
        return f"expected an object, got {type(v).__name__}"
    for f in positive + non_negative:
        if f not in v:
            return f"missing {f!r}"
        x = v[f]
        if not is_number(x) or x < 0 or (f in positive and x == 0):
            return f"expected {f!r} to be a finite number {'> 0' if f in positive else '>= 0'}, got {x!r}"
    for f in strings:
        if f not in v or not isinstance(v[f], str):
            return f"expected {f!r} to be a string, got {v.get(f)!r}"
    return None


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """sha256 of eqgrad's source files and rulebooks (by path and content): read once per process
    (~80 files: 7 ms on an idle core; pathlib's rglob took 19). What is cached on disk from eqgrad's
    own work (plans, lowered kernels) is keyed by it, so an edited checkout misses."""
    root = os.path.dirname(os.path.realpath(__file__))
    files = []
    for d, dirs, names in os.walk(root):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        files += [os.path.join(d, n) for n in names if n.endswith((".py", ".egg"))]
    h = hashlib.sha256()
    for p in sorted(files, key=lambda p: os.path.relpath(p, root)):
        with open(p, "rb") as f:
            h.update(os.path.relpath(p, root).encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def dist_version(name: str) -> str:
    """The installed version of the distribution ``name`` (for cache keys), read from the name of
    its ``.dist-info`` directory next to the package, as importlib.metadata does, without importing
    that (~20 ms of a first realize: it loads the email package); importlib.metadata where the
    directory is elsewhere (an editable install). "?" when it is not installed."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        site = os.path.dirname(os.path.dirname(spec.origin))
        try:
            found = [e for e in os.listdir(site) if e.startswith(name + "-") and e.endswith(".dist-info")]
        except OSError:
            found = []
        if len(found) == 1:
            return found[0][len(name) + 1:-len(".dist-info")]
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


@functools.lru_cache(maxsize=None)
def machine_id() -> str:
    """This machine, for keys of on-disk caches (read once per process: it is asked on every realize)."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}|{platform.machine()}|{cpu}|{os.cpu_count()}"


def machine_key(device: str) -> str:
    """``machine_id()`` and what ``device`` compiles for there: on LLVM, a target other than the host
    (EQGRAD_CPU) is added, so what was measured for one target (a calibration, a kernel-search pick,
    a measured plan) is not used for another. The host's keys stay as they were before the flag."""
    cpu = config.CPU.value if device == "LLVM" else "host"
    return machine_id() if cpu == "host" else f"{machine_id()}|{cpu}"


STALE_TMP_SECONDS = 3600.0       # a writer's temporary file older than this was left by a killed process


def cache_files(d: Path, suffix: str | tuple[str, ...]) -> list[tuple[int, int, str]]:
    """(mtime in ns, size, path) of the regular files of ``d`` ending in ``suffix`` (the plan and
    kernel caches' entries); temporary files that a killed writer left (``_write_atomic``'s
    ``.NAME.*.tmp``, older than STALE_TMP_SECONDS) are deleted on the way. A file another process
    deletes meanwhile is skipped. (Paths as strings: a ``Path`` per file was 60 % of a scan of
    8,500 files, 74 of 125 ms.)"""
    out = []
    now = time.time()
    with os.scandir(d) as it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if e.name.startswith(".") and e.name.endswith(".tmp"):
                if now - st.st_mtime > STALE_TMP_SECONDS:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(e.path)
            elif e.name.endswith(suffix) and stat.S_ISREG(st.st_mode):
                out.append((st.st_mtime_ns, st.st_size, e.path))
    return out


# directory and suffix -> the bytes of its files at this process's last scan, plus the bytes this
# process has written there since (keep_within)
_ESTIMATES: dict[tuple[Path, Any], int] = {}
_ESTIMATES_LOCK = threading.Lock()


def keep_within(d: Path, written: int, bound: int, suffix: str | tuple[str, ...]) -> int:
    """After a write of ``written`` bytes into ``d``, keep its ``suffix`` files within ``bound``
    bytes; the bytes they hold, as far as this process knows. The directory is scanned once per
    process and then counted up by each write; only when that count passes the bound is it scanned
    again and its least recently used files deleted (``evict_lru``). A scan costs O(files): the plan
    cache scanned its directory at every plan it stored, 105-119 ms with 14,707 plans (150 MB, under
    the 256 MB bound, so a long-lived cache made every new compile slower). Files that other
    processes write are counted at the next scan; the bound holds within what they wrote since."""
    key = (d, suffix)
    with _ESTIMATES_LOCK:
        est = _ESTIMATES.get(key)
        if est is not None:
            est = _ESTIMATES[key] = est + written
    if est is None:
        est = sum(size for _, size, _ in cache_files(d, suffix))      # (with the file just written)
        with _ESTIMATES_LOCK:
            _ESTIMATES[key] = est
    if est > bound:
        est = evict_lru(d, bound, suffix, EVICT_TO)
        with _ESTIMATES_LOCK:
            _ESTIMATES[key] = est
    return est


# Share of the bound an eviction past it leaves (keep_within): evicted only down to the bound, a full
# cache was over it again at the next write, so every stored plan scanned the directory -- 126 ms a
# plan with 26,000 plans in a full 256 MB cache (a fuzz campaign on a long-used machine: 90 % of
# its time). With 10 % of the bound free, the next scan comes after that many bytes are written.
EVICT_TO = 0.9


def evict_lru(d: Path, bound: int, suffix: str | tuple[str, ...], to: float = 1.0) -> int:
    """Delete the least recently used ``suffix`` files of ``d`` (oldest mtime first) until they
    hold at most ``to * bound`` bytes (``to`` <= 1: ``keep_within`` leaves room for the writes to
    come); the bytes that remain. Other processes may evict at the same time: a file already gone
    is skipped."""
    files = cache_files(d, suffix)
    total = sum(size for _, size, _ in files)
    for _, size, p in sorted(files, key=lambda f: f[0]):
        if total <= bound * to:
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)
        total -= size
    return total
