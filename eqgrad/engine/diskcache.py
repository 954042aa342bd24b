"""The disk cache of plans: a later process that compiles the same program skips saturation and
extraction (without it the same program in a second process paid the whole cold cost again).

One JSON file per plan, ``<cache_dir>/plans/<sha256 of the key>.json`` (eqgrad/cache.py: the
directory, its checks and its writes, safe against other threads, processes and planted files),
holding ``{"format", "key", "value"}``:
``key`` is the whole key, not its hash, and must equal the key of the program that reads it (a
file copied over another's name, or a hash collision, is a miss); the value is the
plan (graph/plan.py ``plan_to_data``: exact floats, shared nodes kept), the saturation report
(validation's rule blame and ``explain`` read its fired rules and stop reason) and what the
extractor was. On a hit the device still compiles the plan (``prepare``: the LLVM device has its
own object-code cache for that).

The key (``plan_key``) is the text (a ``repr``: deterministic) of everything a plan depends on: a
digest of eqgrad's own source files and rulebooks (which holds its version, and makes an edited
checkout miss rather than run plans of the code before the edit) and of egglog's version, the
program's structure key (``Program.key``), the rules (``RuleConfig.key``: a hash of every
rulebook's text), ``settings_key(device, extraction)`` (every flag and setting that changes the
plan: eqgrad/extract/__init__.py says which), and ``machine_key(device)`` (the machine, and the
LLVM target). Not cached on disk, so compiled in every process as before:

- a user cost function (``using(cost_fn=...)``, ``Session(cost_fn=...)``): an object has no
  identity that another process can recognize, and a function of the same name may compute
  something else there;
- the ``measured`` extractor: its choice is a timing on this machine's current load, and it keeps
  its own cache of those timings (``measured.json``), which a plan cache would hide;
- a session with its own saturator (``Session(saturator=...)``): the saturator is an object too;
- a key whose text holds an object address (``<... at 0x...>``): a setting without a stable
  ``repr`` (a new one in ``settings_key``); it is not keyed by an address that another process
  may reuse for something else.

Plans that depend on timing are not stored (``why_not_stored``): saturation stopped by its
timeout, a dead worker or an error (the fallback plan of a busy moment), an extraction stopped
by ``EQGRAD_EXTRACT_TIME``, an ILP stopped by its time limit. A saturation stopped by the node
limit is deterministic and is stored (and warns again on every hit, as a compile would).

Nothing read is trusted (docs/engine.md, "The disk cache"): a file that is not this user's or that
others may write (cache.read_private: opened without following a symlink; the ``plans``
directory is refused likewise, cache.cache_subdir), that cannot be read, does not parse, is of
another format, was written for another key, holds a plan that fails ``plan_from_data``'s checks
(ops, dtypes, each node's shape by its op's rules, buffer ids in range, no read before a write),
or a plan that does not fit the program that asked for it (``plan_mismatch``: its inputs' number,
shapes and dtypes, its outputs') is a miss with one ``CacheWarning`` naming the file, never an
exception or a crash; the recompiled plan then replaces it. What the checks cannot see is a plan
of another program with the same inputs and outputs written under this program's key by this
user's own account -- which can run any code as the user anyway. A hit touches its file,
and after each store the least recently used files (by mtime) are deleted until the directory holds
at most ``EQGRAD_DISK_CACHE_BYTES``. Writers need no lock: each file is written whole to a unique
temporary file and renamed over the old one, so a reader sees the old file or the new one, never
a mix, and two processes storing the same key leave one of their (equal) files.
``EQGRAD_DISK_CACHE=0`` turns the cache off (and the test suite runs with it off: tests/conftest.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from eqgrad import config
from eqgrad.cache import (Refused, _warn_once, _why, _write_atomic, cache_subdir, dist_version, evict_lru, keep_within,
                          machine_key, read_private, source_digest)
from eqgrad.extract import ExtractSettings, effective, extractor_name, settings_key
from eqgrad.extract.cost import default_cost
from eqgrad.graph.plan import KernelPlan, plan_difference, plan_from_data, plan_to_data
from eqgrad.graph.program import Program
from eqgrad.rules.rulebook import RuleConfig
from eqgrad.rules.saturate import PhaseReport, SaturationReport

FORMAT = 2                       # of the files; a file of another format is not read (1 held the key's hash)
SUBDIR = "plans"


def enabled() -> bool:
    return bool(config.DISK_CACHE.value)


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of eqgrad's sources and rulebooks (cache.source_digest) and egglog's version."""
    h = hashlib.sha256(source_digest().encode())
    h.update(dist_version("egglog").encode())
    return h.hexdigest()


def plan_key(prog: Program, rules: RuleConfig, extraction: ExtractSettings | None,
             saturator: Any = None) -> str | None:
    """The disk-cache key of ``prog`` compiled under ``rules`` and ``extraction`` -- the whole
    text, stored in the file and compared on load; its sha256 names the file -- or None when such
    a plan is not cached on disk (the module docstring says when and why)."""
    s = effective(extraction)
    if saturator is not None or s.cost_fn not in (None, default_cost) or extractor_name(extraction) == "measured":
        return None
    device = prog.device
    settings = tuple("default_cost" if x is default_cost else x for x in settings_key(device, extraction))
    text = repr((FORMAT, code_digest(), prog.key, rules.key, settings, machine_key(device)))
    if " at 0x" in text:
        return None
    return text


def why_not_stored(report: SaturationReport, info: dict) -> str | None:
    """Why a plan depends on timing and is not stored (None: it does not, store it)."""
    if report.stop_reason not in ("completed", "node limit", "skipped"):
        return f"saturation {report.stop_reason}"
    if info.get("stopped"):
        return f"extraction stopped ({info['stopped']})"
    if str(info.get("ilp", "")).startswith("time limit"):
        return "the ILP stopped at its time limit"
    return None


# ------------------------------------------------------------------ files

def _plans_dir() -> Path | None:
    return cache_subdir(SUBDIR) if enabled() else None


def file_name(key: str) -> str:
    """The name of the file holding ``key``'s plan: its sha256 (a key may be long)."""
    return hashlib.sha256(key.encode()).hexdigest() + ".json"


def _first_difference(got: str, want: str) -> str:
    """Where the key in a file differs from the program's, for the warning (a key may be long)."""
    i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return f"at character {i}: {got[max(0, i - 20):i + 40]!r}, this program's {want[max(0, i - 20):i + 40]!r}"


def _bad(path: Path, stamp: Any, why: str) -> None:
    _warn_once(("plan file", stamp), f"eqgrad: ignored the cached plan {path}: {why} (the plan is compiled "
                                     f"again and the file rewritten)")


def load(key: str) -> dict | None:
    """The value stored under ``key``, or None (a miss; a bad file warns once, see the module)."""
    d = _plans_dir()
    if d is None:
        return None
    path = d / file_name(key)
    try:
        text, st = read_private(path)                    # this user's, writable by no one else
    except (FileNotFoundError, NotADirectoryError):      # a plans "directory" that is not one: store() says so
        return None
    except Refused as e:
        _bad(path, (str(path), e.st.st_mtime_ns, e.st.st_size), f"refused: {e}")
        return None
    except OSError as e:
        _bad(path, str(path), f"cannot be read ({_why(e)})")
        return None
    stamp = (str(path), st.st_mtime_ns, st.st_size)
    try:
        data = json.loads(text)
    except ValueError as e:
        _bad(path, stamp, f"not valid JSON ({e})")
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("value"), dict):
        _bad(path, stamp, f"expected an object with format {FORMAT} and a value, got "
                          f"{type(data).__name__ if not isinstance(data, dict) else 'format ' + repr(data.get('format'))}")
        return None
    if data.get("key") != key:
        _bad(path, stamp, f"written for another key ({_first_difference(str(data.get('key')), key)})")
        return None
    with contextlib.suppress(OSError):
        os.utime(path)                     # recently used: evicted last
    return data["value"]


def store(key: str, value: dict) -> Path | None:
    """Write ``value`` under ``key`` (atomically), then keep the directory within
    ``EQGRAD_DISK_CACHE_BYTES``; the file, or None when it was not kept (caching off, the bound,
    or an OSError, which warns once)."""
    d = _plans_dir()
    if d is None:
        return None
    path = d / file_name(key)
    try:
        d.mkdir(mode=0o700, exist_ok=True)
        text = json.dumps({"format": FORMAT, "key": key, "value": value}, separators=(",", ":"))
        _write_atomic(path, text)
        keep_within(d, len(text.encode()), config.DISK_CACHE_BYTES.value, ".json")
    except OSError as e:
        _warn_once(("plan store", str(d)), f"eqgrad: could not store a plan in {d} ({_why(e)}); plans are "
                                           f"compiled again in the next process")
        return None
    return path if path.exists() else None


def evict(d: Path, bound: int) -> int:
    """Delete the least recently used plan files of ``d`` until they hold at most ``bound`` bytes,
    and temporary files that a killed writer left (cache.evict_lru); the bytes that remain."""
    return evict_lru(d, bound, ".json")


# ------------------------------------------------------------------ plans

def _report_data(report: SaturationReport) -> dict:
    return dataclasses.asdict(report)


def _report_of(data: Any) -> SaturationReport:
    if not isinstance(data, dict) or not isinstance(data.get("phases"), list):
        raise ValueError("the saturation report: expected an object with phases")
    rep = SaturationReport(**{**data, "phases": [PhaseReport(**p) for p in data["phases"]]})
    if not isinstance(rep.stop_reason, str) or not isinstance(rep.detail, str) or not all(
            isinstance(p.name, str) and isinstance(p.matches, dict)
            and all(isinstance(k, str) and isinstance(v, int) for k, v in p.matches.items()) for p in rep.phases):
        raise ValueError("the saturation report: a field of the wrong type")
    return rep


def store_plan(key: str, plan: KernelPlan, report: SaturationReport, extractor: str) -> Path | None:
    """Store a compiled plan with its saturation report; a value the plan encoding cannot write
    (a new kind of op attribute: TypeError) is not stored, with one CacheWarning."""
    try:
        value = {"plan": plan_to_data(plan), "report": _report_data(report), "extractor": extractor}
    except TypeError as e:
        _warn_once(("plan encode", str(e)), f"eqgrad: a plan was not stored on disk: {e}")
        return None
    return store(key, value)


def plan_mismatch(plan: KernelPlan, prog: Program) -> str | None:
    """Where ``plan`` does not fit ``prog``, or None. The session hands a plan the program's input
    buffers (``Program.input_specs``: the realized inputs, then the parameters) and reads one
    output per root, so the plan's first ``n_inputs`` buffers must be those (number, shapes,
    dtypes) and its outputs one per root, of the root's shape and dtype, each an input or written
    by a kernel. (Buffer ids in range and no read before a write are ``plan_from_data``'s checks.)
    Run on a plan read from disk, whose kernels would otherwise index buffers that were never
    allocated; and on every compiled plan under EQGRAD_VERIFY."""
    specs = prog.input_specs
    if plan.n_inputs != len(specs):
        return f"expected {len(specs)} input buffers (the program's), the plan has {plan.n_inputs}"
    for i, ((shape, dtype), (pshape, pdtype)) in enumerate(zip(specs, plan.buffers)):
        if tuple(shape) != pshape or dtype != pdtype:
            return f"input b{i}: expected {tuple(shape)} {dtype.name}, the plan has {pshape} {pdtype.name}"
    if len(plan.outputs) != len(prog.roots):
        return f"expected {len(prog.roots)} outputs (the program's roots), the plan has {len(plan.outputs)}"
    written = set(range(plan.n_inputs)) | {k.out for k in plan.kernels}
    for i, (o, r) in enumerate(zip(plan.outputs, prog.roots)):
        leaf = prog.nodes[r] if isinstance(r, int) else r
        pshape, pdtype = plan.buffers[o]
        if tuple(leaf.shape) != pshape or leaf.dtype != pdtype:
            return (f"output {i} (b{o}): expected {tuple(leaf.shape)} {leaf.dtype.name}, the plan has "
                    f"{pshape} {pdtype.name}")
        if o not in written:
            return f"output {i} (b{o}) is neither an input nor written by a kernel"
    return None


def load_plan(key: str, prog: Program) -> tuple[KernelPlan, SaturationReport, str] | None:
    """(plan, saturation report, extractor name) stored under ``key`` for ``prog``, or None. The
    plan is checked (``plan_from_data``) and checked against ``prog`` (``plan_mismatch``): a bad
    one is a miss with one CacheWarning. The report's ``detail`` says that the plan came from the
    disk cache."""
    value = load(key)
    if value is None:
        return None
    try:
        plan = plan_from_data(value.get("plan"))
        rep = _report_of(value.get("report"))
        extractor = value.get("extractor")
        if not isinstance(extractor, str):
            raise ValueError(f"extractor: expected a name, got {extractor!r}")
        if (why := plan_mismatch(plan, prog)) is not None:
            raise ValueError(f"it does not fit this program: {why}")
    except (ValueError, TypeError) as e:
        path = (_plans_dir() or Path(SUBDIR)) / file_name(key)
        _bad(path, (str(path), "plan", str(e)), f"not a valid plan ({e})")
        return None
    rep.detail = "; ".join(filter(None, [rep.detail, "from the disk cache: saturated and extracted by an "
                                                      "earlier process"]))
    return plan, rep, extractor


def round_trip_error(plan: KernelPlan) -> str | None:
    """Where ``plan`` read back from its JSON differs from ``plan`` (None: nowhere). compile_plan
    checks every plan so under EQGRAD_VERIFY, which the test suite turns on."""
    try:
        back = plan_from_data(json.loads(json.dumps(plan_to_data(plan))))
    except (TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    return plan_difference(plan, back)
