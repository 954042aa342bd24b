"""Every environment flag of eqgrad, in one place (documented in docs/env.md).

Read a flag with ``config.DEBUG.value``; override flags for a block with
``with eqgrad.Context(DEBUG=2, EQGRAD_DEVICE="NUMPY"): ...``.
A malformed value raises ``ValueError`` naming the flag, what it expects and what it got.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator


def _bytes(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


DEVICE_NAMES = ("LLVM", "NUMPY", "OPENCL", "CUDA")       # eqgrad/devices/__init__.py: DEVICES
DEVICE_ALIASES = {"CPU": "LLVM", "CL": "OPENCL"}


def _device(s: str) -> str:
    s = s.strip().upper()
    s = DEVICE_ALIASES.get(s, s)
    if s not in DEVICE_NAMES:
        raise ValueError(f"expected LLVM, NUMPY, OPENCL or CUDA, got {s!r}")
    return s


@dataclass
class Flag:
    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str

    def __post_init__(self) -> None:
        FLAGS[self.name] = self

    @property
    def value(self) -> Any:
        if self.name in _overrides:
            return _overrides[self.name]
        raw = os.environ.get(self.name)
        if raw is None or raw == "":
            return self.default
        try:
            return self.parse(raw)
        except (ValueError, TypeError) as e:
            raise ValueError(f"environment flag {self.name}: expected {self.doc.split(':')[0]}, "
                             f"got {raw!r} ({e})") from None


    def checked(self, v: Any) -> Any:
        """Parse and validate a value given in code (Context) like one from the environment."""
        try:
            return self.parse(str(v)) if isinstance(v, str) or self.parse is _device else \
                self.parse(v) if self.parse in (int, float) else self.parse(str(v))
        except (ValueError, TypeError) as e:
            raise ValueError(f"flag {self.name}: expected {self.doc.split(':')[0]}, got {v!r} ({e})") from None


FLAGS: dict[str, Flag] = {}
_overrides: dict[str, Any] = {}

DEBUG = Flag("DEBUG", 0, int, "an integer 0-6: 1 kernel count and time per realize, 2 per-kernel time, "
             "3 saturation report and chosen plan, 4 generated kernel source (LLVM IR, OpenCL C, CUDA C), 5 loop IR, "
             "6 the egglog program")
DEVICE = Flag("EQGRAD_DEVICE", "LLVM", _device, "LLVM, NUMPY, OPENCL or CUDA: the default device for new "
              "tensors (aliases: CPU for LLVM, CL for OPENCL)")
OPT = Flag("EQGRAD_OPT", 1, int, "0 or 1: 0 skips equality saturation and runs the unoptimized plan "
           "(one kernel per op; for debugging)")
SATURATION_TIMEOUT = Flag("EQGRAD_SATURATION_TIMEOUT", 20.0, float,
                          "seconds (float): wall-clock limit of one saturation; past it the worker is "
                          "killed and the unoptimized plan runs, with a warning")
EGRAPH_NODES = Flag("EQGRAD_EGRAPH_NODES", 200_000, int,
                    "an integer: e-node limit checked after each phase; past it saturation stops and the "
                    "last phase's e-graph is extracted")
EGRAPH_MEMORY = Flag("EQGRAD_EGRAPH_MEMORY", 4 << 30, _bytes,
                     "bytes (e.g. 4G, 512M): address-space limit of the egglog worker process")
def _extractor(s: str) -> str:
    s = s.strip().lower()
    if s not in ("greedy", "improve", "ilp", "measured"):
        raise ValueError(f"expected greedy, improve, ilp or measured, got {s!r}")
    return s


EXTRACTOR = Flag("EQGRAD_EXTRACTOR", "greedy", _extractor,
                 "greedy, improve, ilp or measured: how plans are chosen (docs/extraction.md)")
ILP_TIME = Flag("EQGRAD_ILP_TIME", 10.0, float, "seconds (float): time limit of the ILP extractor")
ILP_MAX_CLASSES = Flag("EQGRAD_ILP_MAX_CLASSES", 300, int,
                       "an integer: above this many e-classes the ILP extractor falls back to greedy")
THREADS = Flag("EQGRAD_THREADS", os.cpu_count() or 1, int,
               "an integer: CPU threads a large LLVM kernel is split across (1 disables threading)")
BEAM = Flag("EQGRAD_BEAM", 0, int, "an integer k: try up to k register-lane settings per kernel on the "
            "device and keep the fastest (cached on disk per kernel and machine; 0 = heuristics only)")
BEAM_TIME = Flag("EQGRAD_BEAM_TIME", 10.0, float, "seconds (float): time limit of the kernel search per kernel")
PLAN_CACHE = Flag("EQGRAD_PLAN_CACHE", 512, int, "an integer: compiled plans kept in memory (least recently "
                  "used are dropped; eqgrad.engine.clear_cache() empties it)")
POOL_BYTES = Flag("EQGRAD_POOL_BYTES", 1 << 30, _bytes, "bytes (e.g. 1G, 256M; 0 disables): freed host "
                  "buffers kept for reuse by later realizes (eqgrad.devices.clear_pool() empties the pool)")
VALIDATE = Flag("EQGRAD_VALIDATE", 0, int, "0 or 1: re-run every realize on the NumPy reference "
                "device and raise if the numbers differ")


@contextlib.contextmanager
def Context(**flags: Any) -> Iterator[None]:
    """Temporarily override flags: ``with Context(DEBUG=3): ...`` (names with or without EQGRAD_)."""
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
