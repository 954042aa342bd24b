"""Shared fixtures and helpers of the Tensor-API tests (test_ops.py, test_errors.py)."""
from __future__ import annotations

import atexit
import gc
import os
from pathlib import Path
import shutil
import tempfile
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import pytest

import eqgrad
import eqgrad.devices
from eqgrad import Tensor


# No plan comes from disk in the suite (tests/test_diskcache.py turns the cache on in its own
# directory): tests count saturations and compiled plans and clear the plan cache to compile again,
# and a plan stored by an earlier test, run or worker would make those counts depend on what ran
# before. Set in the environment, not in a Context, so threads and child processes see it too.
os.environ["EQGRAD_DISK_CACHE"] = "0"

# The suite never reads or writes the user's cache directory (~/.cache/eqgrad): the calibration,
# GEMM, kernel-search and measured-plan choices stored there by `python -m eqgrad tune calibrate` or
# a benchmark would steer extraction and lowering here, and which kernels the fusion tests count
# would depend on what ran on the machine before. One empty directory per run, made by the first
# process (xdist's workers inherit it through the environment) and removed when that process ends;
# tests that need a timed choice fixed set it themselves.
if "PYTEST_EQGRAD_CACHE_DIR" not in os.environ:
    os.environ["PYTEST_EQGRAD_CACHE_DIR"] = tempfile.mkdtemp(prefix="eqgrad-tests-")
    atexit.register(shutil.rmtree, os.environ["PYTEST_EQGRAD_CACHE_DIR"], True)
os.environ["EQGRAD_CACHE_DIR"] = os.environ["PYTEST_EQGRAD_CACHE_DIR"]

# CPython's young collection every 10,000 net allocations in the suite's processes, not its default
# 700. A worker compiles thousands of plans; at 700 their temporaries (loop IR, index expressions,
# e-graph nodes) are promoted before they die and call for full collections of a heap that grows
# past a million objects, 0.3-0.4 s each: test_ops.py, test_nn.py and test_resize.py in one process
# spent 3.5 s of 41.3 in 22 full collections, and 1.0 s in 3 at 10,000 (38.9 s); the whole suite on two
# workers 440 -> 433 s wall, 782 -> 758 s of CPU (one run each; 2-vCPU Intel Xeon).
# No test depends on when the collector runs: one that needs a collection calls gc.collect().
gc.set_threshold(10_000, 10, 10)


def _available(name: str) -> bool:
    try:
        eqgrad.devices.get_device(name)
        return True
    except eqgrad.DeviceError:
        return False


# the disk-cache trust tests (test_cache.py, test_diskcache.py): a file or directory made unsafe
OTHER_UID = 12345
needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="giving a file to another user takes root")


def open_up(path: "Path", how: str) -> None:
    """Make ``path`` another user's (``how == "another user's"``, root only) or give it ``mode NNNN``."""
    if how == "another user's":
        os.chown(path, OTHER_UID, OTHER_UID)
    else:
        path.chmod(int(how.split()[-1], 8))


# the op tests run on every device that can run here: OPENCL where pyopencl and a platform exist
# (PoCL in CI, installed by `make test`), CUDA where pycuda and a GPU exist
def pytest_collection_modifyitems(items: list) -> None:
    """The tests marked ``slow`` (seconds each: the fuzz campaigns, the bench runs, a wheel) run
    first, in their order, the rest after, in theirs. The two test workers (make test: ``-n 2 --dist
    worksteal``) then take the long ones while both still have work; collected late, the 32 s
    OPENCL fuzz campaign could be the last test one worker ran while the other had nothing left."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


DEVICES = ["LLVM", "NUMPY"] + [d for d in ("OPENCL", "CUDA") if _available(d)]


@pytest.fixture(autouse=True, scope="session")
def validate_every_plan():
    """Plan validation is on in the whole suite: every realize is re-run with the NumPy references
    on its actual inputs, and an unsound rule that slipped through fails the test where it bites
    (with the names of the rules whose removal fixes it)."""
    with eqgrad.Context(VALIDATE=1):
        yield


def forget_what_a_new_process_lacks() -> None:
    """Drop the process-wide caches a new process starts without: every session's plans, the
    saturations remembered, lowered loop IR, traces, size families, the interned index expressions
    and the size memos. What they held is freed by reference counting at once (plans, kernel bodies
    and loop IR are trees)."""
    from eqgrad.engine import session as _session
    from eqgrad.graph import sizes as _sizes
    from eqgrad.lower import symbolic as _symbolic, trace as _trace
    from eqgrad.rules import saturate as _saturate
    for s in list(_session._sessions):
        s.clear_cache()
    for sat in list(_saturate._instances):
        with sat._memo_lock:
            sat._saturated.clear()
            sat._saturated_bytes = 0
    eqgrad.devices._lowered.clear()
    for dev in list(eqgrad.devices._devices.values()):
        families = getattr(dev, "families", None)
        if families is not None:
            families.clear()
    _trace.TRACES.clear()
    for memo in (_sizes._ABSTRACT, _sizes._NODES, _sizes._BUILDERS):
        memo.clear()
    if not _symbolic._active[0]:          # (only between lowerings, as the table empties itself)
        _symbolic.release()


@pytest.fixture(autouse=True, scope="module")
def each_module_starts_as_a_new_process():
    """Each test file starts with the caches a new process has (``forget_what_a_new_process_lacks``),
    so its tests do not lean on what another file compiled; then what is alive (the modules
    imported, pytest's records) is collected once and frozen (``gc.freeze``: left out of every later
    collection, as it is never garbage), so a collection sees only what this file made. Kept across
    files and never frozen, a worker's heap reached 1.75 million objects (533,000 of them imports and
    pytest's), and the tests that must collect garbage (a kernel freed with its last plan, a memo
    entry with its node) paid 0.3-1 s for each ``gc.collect()``: the kernel-cache tests 44 s of the suite."""
    forget_what_a_new_process_lacks()
    gc.collect()
    gc.freeze()
    yield


@pytest.fixture(autouse=True, scope="session")
def verify_every_lowering():
    """The loop IR of every kernel lowered in the suite is checked after every lowering pass
    (EQGRAD_VERIFY: lower/lowering.py, loopir.verify): a pass that leaves invalid IR fails the test
    that lowered it, naming the pass."""
    with eqgrad.Context(VERIFY=1):
        yield

# the eqgrad dtype a NumPy result of each kind corresponds to (NumPy may widen to float64/int64)
KIND_TO_DTYPE = {"f": eqgrad.float32, "i": eqgrad.int32, "u": eqgrad.int32, "b": eqgrad.bool_}


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def data(shape: Sequence[int], dtype: Any = np.float32, seed: int = 0, low: float = -3.0,
         high: float = 3.0) -> np.ndarray:
    """A reproducible NumPy test array: uniform floats in [low, high), ints in [low, high], or bools."""
    rng = np.random.default_rng(seed)
    shape = tuple(shape)
    if dtype is bool or dtype is np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(int(low), int(high), size=shape, endpoint=True).astype(dtype)
    return rng.uniform(low, high, size=shape).astype(dtype)


def compare(out: Tensor, expected: Any, device: str | None = None, dtype: eqgrad.DType | None = None,
            rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Compare a realized eqgrad result with a NumPy result: shape, dtype, device and values.

    ``dtype`` is the eqgrad dtype the API promises; by default it is the one matching the kind of
    the NumPy result (float -> float32, int -> int32, bool -> bool)."""
    expected = np.asarray(expected)
    assert isinstance(out, Tensor), f"expected a Tensor, got {type(out).__name__}"
    want_dtype = dtype if dtype is not None else KIND_TO_DTYPE[expected.dtype.kind]
    assert out.shape == expected.shape, f"shape {out.shape}, expected {expected.shape}"
    assert out.dtype == want_dtype, f"dtype {out.dtype}, expected {want_dtype}"
    if device is not None:
        assert out.device == device, f"device {out.device}, expected {device}"
    got = out.numpy()
    assert got.shape == expected.shape, f"numpy() shape {got.shape}, expected {expected.shape}"
    assert got.dtype == want_dtype.np, f"numpy() dtype {got.dtype}, expected {np.dtype(want_dtype.np)}"
    if expected.dtype.kind == "b" or want_dtype is eqgrad.bool_:
        np.testing.assert_array_equal(got, expected.astype(np.bool_))
    elif expected.dtype.kind in "iu" and want_dtype is eqgrad.int32:
        np.testing.assert_array_equal(got, expected.astype(np.int64))
    else:
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True)


def check(fn_eqgrad: Callable[..., Tensor], fn_numpy: Callable[..., Any], inputs: Sequence[np.ndarray],
          device: str, rtol: float = 1e-5, atol: float = 1e-6, dtype: eqgrad.DType | None = None) -> None:
    """Build Tensors from the NumPy ``inputs`` on ``device``, run both functions and compare.

    ``fn_numpy`` gets the original arrays, so non-contiguous inputs stay non-contiguous there."""
    tensors = [Tensor(x, device=device) for x in inputs]
    for t, x in zip(tensors, inputs):
        assert t.shape == x.shape and t.dtype == KIND_TO_DTYPE[x.dtype.kind]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)        # e.g. NumPy's "Degrees of freedom <= 0"
        expected = fn_numpy(*inputs)
    compare(fn_eqgrad(*tensors), expected, device, dtype, rtol, atol)


def lowered_only_kernel(t: Tensor):
    """Realize ``t`` (a one-kernel program) and return that kernel's loop IR, named ``eqk`` as the
    devices name it (for tests that render or inspect loop IR)."""
    from eqgrad import engine
    from eqgrad.lower.lowering import lower_kernel
    t.realize()
    plan = engine.last_plan.plan
    (k,) = plan.kernels
    lk = lower_kernel(k, plan)
    lk.name = "eqk"
    return lk


@pytest.fixture
def clean_rules():
    """The built-in rules only, before and after the test (a test file that uses rulebooks marks
    itself with it: ``pytestmark = pytest.mark.usefixtures("clean_rules")``)."""
    from eqgrad.rules import rulebook
    rulebook.reset()
    yield
    rulebook.reset()


def write(tmp_path: Path, name: str, text: str) -> Path:
    """``text`` written to ``tmp_path / name``; the path."""
    p = tmp_path / name
    p.write_text(text)
    return p


def blas_always_pays(monkeypatch) -> None:
    """The LLVM device hands every contraction the BLAS can run to it: whether it pays is measured on
    the machine, and a test must not depend on the host's speed."""
    from eqgrad.devices import blas, get_device
    from eqgrad.devices.cpustage import CPUStage
    monkeypatch.setattr(blas, "pays", lambda g, predicted, threads: max(g.m, g.n) >= blas.GEMM_MIN)
    monkeypatch.setattr(CPUStage, "_measured", lambda self, k, found, plan, threads: True)
    # (what earlier tests left: bodies whose sizes kept changing and had no GEMM that paid)
    monkeypatch.setattr(get_device("LLVM").stage, "_no_gemm", {})


def count_gemm_calls(monkeypatch) -> list[int]:
    """``blas_always_pays``, and the number of BLAS program calls made from now on (a list of one
    count, updated in place)."""
    from eqgrad.devices import blas
    blas_always_pays(monkeypatch)
    calls = [0]
    orig = blas.GemmProgram.__call__

    def counted(self, *ptrs, lo, hi):
        calls[0] += 1
        return orig(self, *ptrs, lo=lo, hi=hi)
    monkeypatch.setattr(blas.GemmProgram, "__call__", counted)
    return calls
