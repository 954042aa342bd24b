"""Every environment flag of eqgrad, in one place (documented in docs/env.md).

Read a flag with ``config.DEBUG.value``; override flags for a block with
``with eqgrad.Context(DEBUG=2, EQGRAD_DEVICE="NUMPY"): ...``.
Every flag checks its range, from the environment and in ``Context`` alike: a bad value raises
``ValueError`` naming the flag, what it accepts and what it got. Nothing is converted silently
(``DEBUG=2.7`` is an error, not 2; ``EQGRAD_EGRAPH_MEMORY=-1G`` is an error, not "unlimited").
"""
from __future__ import annotations

import contextlib
import contextvars
import difflib
import functools
import math
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from collections.abc import MutableMapping
from typing import Any, Callable, Iterator

from eqgrad.counters import EqgradWarning

VERSION = "0.1.0"      # eqgrad's version (eqgrad.__version__; pyproject.toml's, tests/test_docs.py)

# the longest wait eqgrad hands to the OS: Connection.poll() raises OverflowError past 2**31 ms
# (~24.8 days), so time limits stop well below that
MAX_SECONDS = 1e6
MAX_THREADS = 1024


def _integer(v: Any) -> int:
    """An integer given as an int or as its decimal text; 2.0, 2.7, "2.5" and True are not integers."""
    if isinstance(v, bool):
        raise ValueError("not an integer")
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        return int(v.strip(), 10)
    raise ValueError("not an integer")


def _integer_in(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        n = _integer(v)
        if n < lo or (hi is not None and n > hi):
            raise ValueError("out of range")
        return n
    return parse


def _seconds(v: Any) -> float:
    """A finite number of seconds in (0, MAX_SECONDS]: nan, inf and 1e400 are refused."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError("not a number")
    x = float(v)
    if not math.isfinite(x) or not 0 < x <= MAX_SECONDS:
        raise ValueError("out of range")
    return x


def _seconds_or_off(v: Any) -> float:
    """0 (off) or a finite number of seconds in (0, MAX_SECONDS]."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError("not a number")
    return 0.0 if float(v) == 0 else _seconds(v)


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _bytes_at_least(lo: int) -> Callable[[Any], int]:
    def parse(v: Any) -> int:
        if isinstance(v, bool):
            raise ValueError("not a size")
        if isinstance(v, int):
            n = v
        elif isinstance(v, str):
            s = v.strip().upper()
            unit = s[-1] if s and s[-1] in _UNITS else ""
            num = s[:-1] if unit else s
            x = float(num) if unit else int(num, 10)    # "1.5G" is fine, "1.5" bytes is not
            if not math.isfinite(x):
                raise ValueError("not a finite size")
            n = int(x * _UNITS[unit])
        else:
            raise ValueError("not a size")
        if n < lo or n >= 1 << 63:
            raise ValueError("out of range")
        return n
    return parse


DEVICE_NAMES = ("LLVM", "NUMPY", "OPENCL", "CUDA")       # eqgrad/devices/__init__.py: DEVICES
DEVICE_ALIASES = {"CPU": "LLVM", "CL": "OPENCL"}


def _device(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("not a device name")
    s = v.strip().upper()
    s = DEVICE_ALIASES.get(s, s)
    if s not in DEVICE_NAMES:
        raise ValueError("unknown device")
    return s


def _extractor(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("not an extractor name")
    s = v.strip().lower()
    if s not in ("greedy", "improve", "ilp", "measured"):
        raise ValueError("unknown extractor")
    return s


def _path(v: Any) -> str:
    if not isinstance(v, (str, os.PathLike)) or not str(os.fspath(v)).strip():
        raise ValueError("not a path")
    return os.path.expanduser(os.fspath(v))


class _Why(ValueError):
    """A malformed value with a reason worth showing (e.g. the valid names near a misspelt one):
    ``Flag.checked`` puts it into its message; other parse errors only say what the flag accepts."""


@functools.lru_cache(maxsize=1)
def llvm_cpu_table() -> tuple[frozenset[str], frozenset[str]]:
    """(CPU names, feature names) that llvmlite's LLVM knows for this machine's target triple.

    LLVM has no API for the lists (llvmlite exposes none) and prints them, for the CPU name
    ``help``, only to stderr, so a child Python prints them (~0.1 s, once per process, and only
    when EQGRAD_CPU names a CPU)."""
    code = ("import llvmlite.binding as llvm; llvm.initialize_native_target(); "
            "llvm.Target.from_default_triple().create_target_machine(cpu='help')")
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        text = r.stdout + r.stderr
    except (OSError, subprocess.SubprocessError) as e:
        text = f"{type(e).__name__}: {e}"
    cpus: set[str] = set()
    feats: set[str] = set()
    into: set[str] | None = None
    for line in text.splitlines():
        if line.startswith("Available CPUs"):
            into = cpus
        elif line.startswith("Available features"):
            into = feats
        elif into is not None and line.startswith("  ") and " - " in line:
            into.add(line.split()[0])
    if not cpus:
        raise _Why(f"could not list the CPUs LLVM knows: {text.strip()[-200:] or 'no output'}")
    return frozenset(cpus), frozenset(feats)


def _close(word: str, known: frozenset[str]) -> str:
    near = difflib.get_close_matches(word, sorted(known), n=6, cutoff=0.6)
    return ", ".join(near) if near else ", ".join(sorted(known)[:6]) + ", ..."


def _llvm_cpu(v: Any) -> str:
    """``host`` or an LLVM CPU name, then optionally ``,+feature`` / ``,-feature`` items; lower case,
    without spaces: ``" X86-64-v3, -fma"`` is ``"x86-64-v3,-fma"``."""
    if not isinstance(v, str) or not v.strip():
        raise ValueError("not a CPU name")
    name, *mods = [t.strip() for t in v.strip().lower().split(",")]
    if not name or any(not m for m in mods):
        raise _Why("an empty item")
    cpus, feats = llvm_cpu_table() if name != "host" or mods else (frozenset(), frozenset())
    if name != "host" and name not in cpus:
        raise _Why(f"{name!r} is not a CPU LLVM knows; close: {_close(name, cpus)}")
    for m in mods:
        if m[0] not in "+-" or len(m) < 2:
            raise _Why(f"feature {m!r} needs a sign: +{m.lstrip('+-')} adds it, -{m.lstrip('+-')} removes it")
        if m[1:] not in feats:
            raise _Why(f"{m[1:]!r} is not a feature LLVM knows; close: {_close(m[1:], feats)}")
    return ",".join([name, *mods])


@dataclass
class Flag:
    name: str
    default: Any
    parse: Callable[[Any], Any]      # text from the environment or a value from Context -> the value, or ValueError
    accepts: str                     # what parse accepts, for error messages and docs/env.md
    doc: str

    def __post_init__(self) -> None:
        FLAGS[self.name] = self
        self._last: tuple[Any, Any] = (None, self.default)      # (raw environment value, parsed)
        self._key = os.fsencode(self.name) if _ENVIRON is not None else self.name

    @property
    def value(self) -> Any:
        v = _overrides.get(self.name, _UNSET)
        if v is not _UNSET:
            return v
        raw = (_ENVIRON or os.environ).get(self._key)
        if not raw:
            return self.default
        last = self._last                      # one read: another thread may replace it
        if raw is not last[0] and raw != last[0]:    # parse a changed value once
            text = os.fsdecode(raw) if _ENVIRON is not None else raw
            last = self._last = (raw, self.checked(text, "environment flag"))
        return last[1]

    def checked(self, v: Any, where: str = "flag") -> Any:
        """The value of ``v`` (text from the environment or a value given in code); ValueError naming
        the flag, what it accepts and what it got if it is out of range or malformed."""
        try:
            return self.parse(v)
        except _Why as e:
            raise ValueError(f"{where} {self.name}: expected {self.accepts} ({e}), got {v!r}") from None
        except (ValueError, TypeError, OverflowError):
            raise ValueError(f"{where} {self.name}: expected {self.accepts}, got {v!r}") from None


FLAGS: dict[str, Flag] = {}
_UNSET = object()


def raw_state(flags: tuple[Flag, ...]) -> tuple:
    """What decides the values of ``flags`` in this thread, without parsing any: per flag its
    ``Context`` override (or a marker) and its raw environment value. Equal states give equal
    values, so a memo of anything computed from the flags may be keyed by it (two dict reads a flag;
    a ``value`` read costs several times that). TypeError if an override is not hashable."""
    ov = _overrides._var.get()
    env = _ENVIRON if _ENVIRON is not None else os.environ
    if not ov:                                   # no Context block: the environment alone
        return tuple([env.get(f._key) for f in flags])
    return tuple((ov.get(f.name, _UNSET), env.get(f._key)) for f in flags)


def raw_env_reader(*names: str) -> Callable[[], tuple]:
    """A function giving the environment variables ``names`` as stored (``raw_env`` of each, the
    names encoded once): for memo keys read on every realize."""
    if _ENVIRON is not None:
        keys, env = tuple(os.fsencode(n) for n in names), _ENVIRON
        return lambda: tuple([env.get(k) for k in keys])
    return lambda: tuple([os.environ.get(n) for n in names])


def raw_env(name: str) -> Any:
    """The environment variable ``name`` as stored (bytes on POSIX), or None: for memo keys, where
    ``os.environ.get`` would encode the name and decode the value on every call."""
    if _ENVIRON is not None:
        return _ENVIRON.get(os.fsencode(name))
    return os.environ.get(name)
# The environment as bytes -> bytes, the dict ``os.environ`` keeps on POSIX and updates with every
# change made through it (``os.environ[...] =``, ``del``, ``monkeypatch.setenv``): a flag is read on
# every realize (~16 of them), and ``os.environ.get`` encodes the name and decodes the value each
# time (~2 us a flag, a fifth of a cached realize). None elsewhere: ``os.environ`` itself is read.
_ENVIRON: dict[bytes, bytes] | None = os.environ._data if os.name == "posix" and isinstance(    # noqa: SLF001
    getattr(os.environ, "_data", None), dict) else None


class _ThreadOverrides(MutableMapping):
    """The ``Context`` overrides of the running thread (and asyncio task): a ``ContextVar`` holding a
    dict that is replaced, never changed in place, so no thread or task ever sees another's.

    Why per thread: a ``with Context(...)`` block is lexical. When the overrides were one dict for
    the process, a block in one thread changed the flags of every other thread's realizes, and its
    exit restored a snapshot taken before another thread's block had begun, dropping that block's
    overrides in the middle of it. A new thread starts with no overrides (the environment's
    values): enter ``Context`` in the thread, or run it in ``contextvars.copy_context()``."""

    def __init__(self) -> None:
        self._var: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("eqgrad_overrides", default={})

    def get(self, key: str, default: Any = None) -> Any:
        return self._var.get().get(key, default)

    def __getitem__(self, key: str) -> Any:
        return self._var.get()[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._var.set({**self._var.get(), key: value})

    def __delitem__(self, key: str) -> None:
        d = dict(self._var.get())
        del d[key]
        self._var.set(d)

    def __iter__(self) -> Iterator[str]:
        return iter(self._var.get())

    def __len__(self) -> int:
        return len(self._var.get())

    def clear(self) -> None:
        self._var.set({})


_overrides: MutableMapping[str, Any] = _ThreadOverrides()

DEBUG = Flag("DEBUG", 0, _integer_in(0, 6), "an integer from 0 to 6",
             "1 kernel count and time per realize, 2 per-kernel time, 3 saturation report and chosen plan, "
             "4 generated kernel source (LLVM IR, OpenCL C, CUDA C), 5 loop IR, 6 the egglog program")
DEVICE = Flag("EQGRAD_DEVICE", "LLVM", _device, "LLVM, NUMPY, OPENCL or CUDA (aliases: CPU, CL)",
              "the default device for new tensors")
OPT = Flag("EQGRAD_OPT", 1, _integer_in(0, 1), "0 or 1",
           "0 skips equality saturation and runs the unoptimized plan (one kernel per op; for debugging)")
SATURATION_TIMEOUT = Flag("EQGRAD_SATURATION_TIMEOUT", 20.0, _seconds,
                          f"a finite number of seconds > 0 and <= {MAX_SECONDS:g}",
                          "wall-clock limit of one saturation, from when the worker is ready (its start "
                          "is bounded apart: rules/saturate.py STARTUP_LIMIT); past it the worker is "
                          "killed and the unoptimized plan runs, with a warning")
EGRAPH_NODES = Flag("EQGRAD_EGRAPH_NODES", 200_000, _integer_in(1, (1 << 63) - 1), "an integer >= 1",
                    "e-node limit checked after each phase; past it saturation stops and the last phase's "
                    "e-graph is extracted")
EGRAPH_MEMORY = Flag("EQGRAD_EGRAPH_MEMORY", 4 << 30, _bytes_at_least(1),
                     "a size in bytes > 0 (e.g. 4G, 512M, 1048576)",
                     "address-space limit of the egglog worker process")
EXTRACTOR = Flag("EQGRAD_EXTRACTOR", "greedy", _extractor, "greedy, improve, ilp or measured",
                 "how plans are chosen (docs/extraction.md)")
EXTRACT_TIME = Flag("EQGRAD_EXTRACT_TIME", 60.0, _seconds, f"a finite number of seconds > 0 and <= {MAX_SECONDS:g}",
                    "wall-clock limit of the greedy/improve local search of one plan; past it the best plan "
                    "found so far is used, with a warning")
PEAK_MEMORY = Flag("EQGRAD_PEAK_MEMORY", 0, _bytes_at_least(0), "a size in bytes >= 0 (e.g. 2G, 512M, 0)",
                   "bound on the bytes of a plan's buffers (its intermediates and outputs, all held while "
                   "it runs): extraction recomputes producers instead of storing them until the plan fits, "
                   "then minimizes time; a warning when no plan found fits (0: no bound)")
ILP_TIME = Flag("EQGRAD_ILP_TIME", 10.0, _seconds, f"a finite number of seconds > 0 and <= {MAX_SECONDS:g}",
                "time limit of the ILP extractor")
ILP_MAX_CLASSES = Flag("EQGRAD_ILP_MAX_CLASSES", 300, _integer_in(0), "an integer >= 0",
                       "above this many e-classes the ILP extractor falls back to greedy")
THREADS = Flag("EQGRAD_THREADS", max(1, min(os.cpu_count() or 1, MAX_THREADS)), _integer_in(1, MAX_THREADS),
               f"an integer from 1 to {MAX_THREADS}",
               "CPU threads a large LLVM kernel is split across; above 1, a plan's new kernels also "
               "compile two at a time, here and in a compile worker (1 disables both)")
SPIN_US = Flag("EQGRAD_SPIN_US", 200, _integer_in(0, 100_000), "an integer from 0 to 100000",
               "microseconds a worker thread of the LLVM device keeps polling for the next split "
               "kernel after its last one before it sleeps (0: it sleeps at once; waking a sleeping "
               "one costs a wake-up of another CPU)")
BLAS = Flag("EQGRAD_BLAS", 1, _integer_in(0, 1), "0 or 1",
            "1: on the LLVM device, a kernel whose body is a contraction with unit-stride operands "
            "(a matmul in any layout, batched or broadcast, with elementwise ops after it) runs its "
            "contraction through the BLAS SciPy ships (devices/blas.py); 0: every kernel is generated")
BEAM = Flag("EQGRAD_BEAM", 0, _integer_in(0), "an integer >= 0",
            "k: try up to k register-lane settings per kernel on the device and keep the fastest "
            "(cached on disk per kernel and machine; 0 = heuristics only)")
BEAM_TIME = Flag("EQGRAD_BEAM_TIME", 10.0, _seconds, f"a finite number of seconds > 0 and <= {MAX_SECONDS:g}",
                 "time limit of the kernel search per kernel")
CPU = Flag("EQGRAD_CPU", "host", _llvm_cpu,
           "host, or an LLVM CPU name (e.g. x86-64-v2, x86-64-v3, x86-64-v4, skylake-avx512, znver4), "
           "optionally followed by ,+feature / ,-feature items",
           "the CPU the LLVM device compiles for (host: this one, its name and features); the device "
           "runs what it compiles, so a target this CPU cannot execute is refused at the first compile")
PROGRESS = Flag("EQGRAD_PROGRESS", 2.0, _seconds_or_off, f"0 (off) or a number of seconds > 0 and <= {MAX_SECONDS:g}",
                "a compile that takes longer than this shows its phase, sizes and time on stderr "
                "(eqgrad/progress.py; tqdm's status line on a terminal)")
PLAN_CACHE = Flag("EQGRAD_PLAN_CACHE", 512, _integer_in(1), "an integer >= 1",
                  "compiled plans kept in memory (least recently used are dropped; "
                  "eqgrad.engine.clear_cache() empties it)")
RESIZE = Flag("EQGRAD_RESIZE", 1, _integer_in(0, 1), "0 or 1",
              "1: a program that differs from a cached one only in sizes (a new batch, a longer "
              "sequence) reuses its plan rewritten for the new sizes, with no saturation or "
              "extraction (graph/resize.py); 0: compile every new size")
REGIONS = Flag("EQGRAD_REGIONS", 1, _integer_in(0, 1), "0 or 1",
               "1: a program whose layers repeat (cut where one tensor flows on) is planned region by "
               "region, each distinct region saturated and extracted once (engine/regions.py); 0: "
               "plan every program whole")
PRESTART = Flag("EQGRAD_PRESTART", 1, _integer_in(0, 1), "0 or 1",
                "1: importing eqgrad starts the saturation worker in the background (not in a "
                "multiprocessing child, nor with EQGRAD_OPT=0); 0: it starts at the first tensor made "
                "from data")
SIZE_ARGS = Flag("EQGRAD_SIZE_ARGS", 1, _integer_in(0, 1), "0 or 1",
                 "1: on the LLVM device, a kernel seen at more than two sizes (a growing sequence) "
                 "compiles once more with its sizes as arguments and runs that code for every later "
                 "size, and a reduction loop of 16 or more iterations reads its extent at run time "
                 "from the first compile on (devices/sizeargs.py); 0: compile each size's own code")
MERGE = Flag("EQGRAD_MERGE", 1, _integer_in(0, 1), "0 or 1",
             "1: on the LLVM and OpenCL devices, sibling kernels (one output shape, a buffer read in "
             "common, or one reading another's output at its own element) run as one kernel with "
             "several outputs (lower/merge.py); 0: each as its own kernel")
POOL_BYTES = Flag("EQGRAD_POOL_BYTES", 1 << 30, _bytes_at_least(0), "a size in bytes >= 0 (e.g. 1G, 256M, 0)",
                  "freed host buffers kept for reuse by later realizes (0 disables; "
                  "eqgrad.devices.clear_pool() empties the pool)")
VALIDATE = Flag("EQGRAD_VALIDATE", 0, _integer_in(0, 1), "0 or 1",
                "1 re-runs every realize on the NumPy reference device and raises if the numbers differ")
VERIFY = Flag("EQGRAD_VERIFY", 0, _integer_in(0, 1), "0 or 1",
              "1 checks the loop IR of every lowered kernel after every lowering pass (loopir.verify), "
              "and that every compiled plan reads back from its JSON unchanged")
CACHE_DIR = Flag("EQGRAD_CACHE_DIR", None, _path, "a directory path",
                 "where the on-disk caches live (default ~/.cache/eqgrad; eqgrad/cache.py)")
DISK_CACHE = Flag("EQGRAD_DISK_CACHE", 1, _integer_in(0, 1), "0 or 1",
                  "1 keeps compiled plans (and compiled kernels) in the cache directory for later processes; "
                  "0 neither reads nor writes them")
DISK_CACHE_BYTES = Flag("EQGRAD_DISK_CACHE_BYTES", 256 << 20, _bytes_at_least(0),
                        "a size in bytes >= 0 (e.g. 256M, 1G, 0)",
                        "bound on the plans kept on disk (least recently used are deleted past it)")
KERNEL_CACHE_BYTES = Flag("EQGRAD_KERNEL_CACHE_BYTES", 256 << 20, _bytes_at_least(0),
                          "a size in bytes >= 0 (e.g. 256M, 1G, 0)",
                          "bound on the compiled LLVM kernels kept on disk (least recently used are deleted past it)")


# EQGRAD_ variables eqgrad reads that are not flags above: the user's rule files (rules/rulebook.py
# reads them as paths, docs/rulebooks.md) and the test suite's switch for its golden files
OTHER_VARIABLES = ("EQGRAD_RULEBOOKS", "EQGRAD_SCHEDULE", "EQGRAD_UPDATE_GOLDEN")


def unknown_variables(environ: Any = None) -> list[tuple[str, str | None]]:
    """The ``EQGRAD_*`` variables of ``environ`` (default: this process's environment) that eqgrad
    does not read, each with the closest name it does read (None if none is close)."""
    known = [n for n in FLAGS if n.startswith("EQGRAD_")] + list(OTHER_VARIABLES)
    out = []
    for name in sorted(os.environ if environ is None else environ):
        if name.startswith("EQGRAD_") and name not in known:
            # compared without the prefix they share, which would make every name "close"
            near = difflib.get_close_matches(name[7:], sorted(n[7:] for n in known), n=1, cutoff=0.6)
            out.append((name, "EQGRAD_" + near[0] if near else None))
    return out


def warn_unknown_variables(environ: Any = None) -> None:
    """One ``EqgradWarning`` naming every ``EQGRAD_*`` environment variable eqgrad does not read
    (a misspelt flag used to be silently ignored) and the flag each is closest to.
    Run once per process, when this module is imported (a few microseconds: one pass over the
    environment's names); not in a ``multiprocessing`` child, whose parent has warned already."""
    unknown = unknown_variables(environ)
    if not unknown:
        return
    items = "; ".join(f"{n} (did you mean {near}?)" if near else n for n, near in unknown)
    warnings.warn(f"eqgrad: unknown environment variable{'s' if len(unknown) > 1 else ''} ignored: {items}. "
                  "eqgrad's flags are listed in docs/env.md", EqgradWarning, stacklevel=2)


@contextlib.contextmanager
def Context(**flags: Any) -> Iterator[None]:
    """Temporarily override flags: ``with Context(DEBUG=3): ...`` (names with or without EQGRAD_).
    The overrides hold in the running thread only (``_ThreadOverrides`` says why)."""
    old = dict(_overrides)
    try:
        for k, v in flags.items():
            name = k if k in FLAGS else f"EQGRAD_{k}"
            if name not in FLAGS:
                raise ValueError(f"unknown flag {k!r}; known flags: {sorted(FLAGS)}")
            _overrides[name] = FLAGS[name].checked(v)
        yield
    finally:
        _overrides.clear()
        _overrides.update(old)


_mp = sys.modules.get("multiprocessing")
if _mp is None or _mp.parent_process() is None:
    warn_unknown_variables()
del _mp
