"""The LLVM device's compiled kernels: object code cached on disk across processes
(devices/kernelcache.py), and machine code freed when no prepared plan uses it (devices/llvm.py
``CodeEngine``, devices/cpu.py ``prepare``).

Every test here caches in a directory of its own (the suite runs with EQGRAD_DISK_CACHE=0:
tests/conftest.py) and gives the device an empty program lookup, so each kernel it prepares is
compiled or read from disk, never found alive from an earlier test.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.cache import CacheWarning
from eqgrad.devices import Buffer, get_device, kernelcache
from eqgrad.devices.llvm import live_code
from eqgrad.dtype import float32
from eqgrad.graph.plan import Kernel, KernelPlan, KNode

ROOT = Path(__file__).resolve().parents[1]


def elementwise_plan(c: float, n: int = 64, extra: float | None = None) -> KernelPlan:
    """``b1 = b0 * c + 1`` (and, with ``extra``, a second kernel ``b2 = b1 * extra + 1``): a
    plan built by hand, so a test prepares exactly the kernels it names (no saturation)."""
    def body(src: KNode, k: float) -> KNode:
        mul = KNode("MUL", (src, KNode("CONST", (), k, (n,), float32)), None, (n,), float32)
        return KNode("ADD", (mul, KNode("CONST", (), 1.0, (n,), float32)), None, (n,), float32)
    kernels = [Kernel("k0", 1, body(KNode("BUF", (), 0, (n,), float32), c), (0,))]
    if extra is not None:
        kernels.append(Kernel("k1", 2, body(KNode("BUF", (), 1, (n,), float32), extra), (1,)))
    return KernelPlan([((n,), float32)] * (1 + len(kernels)), 1, kernels, [len(kernels)])


X = np.linspace(-3, 3, 64, dtype=np.float32)


def run_plan(run, plan: KernelPlan) -> np.ndarray:
    bufs = [Buffer.from_numpy(X, "LLVM")] + [Buffer.empty(s, d, "LLVM") for s, d in plan.buffers[1:]]
    run(bufs)
    return bufs[plan.outputs[0]].data.copy()


def expected(c: float) -> np.ndarray:
    return (X.astype(np.float64) * np.float32(c) + 1).astype(np.float32)     # LLVM contracts it into an FMA


def check(out: np.ndarray, c: float) -> None:
    np.testing.assert_allclose(out, expected(c), rtol=1e-6, atol=1e-6)


@pytest.fixture
def kernels_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "1")
    monkeypatch.setattr(get_device("LLVM"), "programs", weakref.WeakValueDictionary())
    return tmp_path / "cache" / "kernels"


def prepare_fresh(plan: KernelPlan) -> tuple[np.ndarray, int, int]:
    """Prepare ``plan`` with nothing alive (the previous preparation dropped), run it; (output,
    kernels compiled, kernels read from disk)."""
    gc.collect()
    c0, h0 = GlobalCounters.kernels_compiled, GlobalCounters.kernel_disk_hits
    run = get_device("LLVM").prepare(plan)
    out = run_plan(run, plan)
    return out, GlobalCounters.kernels_compiled - c0, GlobalCounters.kernel_disk_hits - h0


# ------------------------------------------------------------------ the disk cache, in one process

def test_a_kernel_read_back_from_disk_is_not_compiled_again(kernels_dir):
    plan = elementwise_plan(1.5)
    out, compiled, hits = prepare_fresh(plan)
    assert (compiled, hits) == (1, 0)
    files = list(kernels_dir.glob("*.o"))
    assert len(files) == 1 and files[0].stat().st_mode & 0o777 == 0o600
    again, compiled, hits = prepare_fresh(plan)
    assert (compiled, hits) == (0, 1)
    check(out, 1.5)
    np.testing.assert_array_equal(again, out)


def test_another_target_is_another_key(kernels_dir):
    plan = elementwise_plan(2.5)
    prepare_fresh(plan)
    with eqgrad.Context(CPU="x86-64-v2"):
        v2, compiled, hits = prepare_fresh(plan)
    assert (compiled, hits) == (1, 0), "code for one CPU must not be loaded for another"
    assert len(list(kernels_dir.glob("*.o"))) == 2
    check(v2, 2.5)           # (not host's bits where the host has FMA, which x86-64-v2 lacks)
    with eqgrad.Context(CPU="x86-64-v2"):
        assert prepare_fresh(plan)[1:] == (0, 1)


def _flip_object_byte(data: bytes) -> bytes:
    i = len(data) - 40                       # inside the object code, after the header
    return data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:]


CORRUPTIONS = {
    "a flipped byte": (_flip_object_byte, "sha256"),
    "truncated": (lambda d: d[:len(d) // 2], "truncated"),
    "empty": (lambda d: b"", "starting with"),
    "not a kernel file": (lambda d: b"\x7fELF" + d[4:], "starting with"),
    "a header that is not JSON": (lambda d: kernelcache.MAGIC + b"{nope\n" + d, "not JSON"),
}


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=list(CORRUPTIONS))
def test_a_corrupt_file_warns_once_is_compiled_again_and_rewritten(kernels_dir, corrupt):
    change, why = CORRUPTIONS[corrupt]
    plan = elementwise_plan(3.25)
    prepare_fresh(plan)
    path, = kernels_dir.glob("*.o")
    path.write_bytes(change(path.read_bytes()))
    with pytest.warns(CacheWarning, match=rf"ignored the cached kernel {path}: .*{why}"):
        out, compiled, hits = prepare_fresh(plan)
    assert (compiled, hits) == (1, 0)
    check(out, 3.25)
    assert prepare_fresh(plan)[1:] == (0, 1), "the recompiled kernel replaces the bad file"


def test_a_file_written_for_another_key_is_not_loaded(kernels_dir):
    a, b = elementwise_plan(4.0), elementwise_plan(5.0)
    prepare_fresh(a)
    pa, = kernels_dir.glob("*.o")
    prepare_fresh(b)
    pb, = set(kernels_dir.glob("*.o")) - {pa}
    pb.write_bytes(pa.read_bytes())                      # b's name, a's code
    with pytest.warns(CacheWarning, match="written for another key"):
        out, compiled, _ = prepare_fresh(b)
    assert compiled == 1
    check(out, 5.0)


def test_a_file_others_may_write_is_never_executed(kernels_dir):
    plan = elementwise_plan(6.0)
    prepare_fresh(plan)
    path, = kernels_dir.glob("*.o")
    path.chmod(0o622)
    with pytest.warns(CacheWarning, match="writable only by it"):
        out, compiled, hits = prepare_fresh(plan)
    assert (compiled, hits) == (1, 0)
    check(out, 6.0)
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_planted_symlink_is_not_followed(kernels_dir, tmp_path):
    plan = elementwise_plan(6.5)
    prepare_fresh(plan)
    path, = kernels_dir.glob("*.o")
    elsewhere = tmp_path / "elsewhere.o"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)                       # a valid file, but behind a link
    with pytest.warns(CacheWarning, match="cannot be opened"):
        out, compiled, _ = prepare_fresh(plan)
    assert compiled == 1 and not path.is_symlink()
    check(out, 6.5)


def test_off_means_nothing_is_read_or_written(kernels_dir, monkeypatch):
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
    plan = elementwise_plan(7.0)
    assert prepare_fresh(plan)[1:] == (1, 0)
    assert prepare_fresh(plan)[1:] == (1, 0)
    assert not kernels_dir.exists()


def test_the_directory_stays_within_its_bound_least_recently_used_first(kernels_dir, monkeypatch):
    def store(c: float) -> Path:
        before = set(kernels_dir.glob("*.o")) if kernels_dir.exists() else set()
        prepare_fresh(elementwise_plan(c))
        new, = set(kernels_dir.glob("*.o")) - before
        return new
    f8 = store(8.0)
    size = f8.stat().st_size
    monkeypatch.setenv("EQGRAD_KERNEL_CACHE_BYTES", str(int(size * 3.5)))      # room for three
    f85, f9 = store(8.5), store(9.0)
    for i, f in enumerate((f8, f85, f9)):                 # used in this order, long ago
        os.utime(f, ns=(10**18 + i, 10**18 + i))
    assert prepare_fresh(elementwise_plan(8.0))[1:] == (0, 1)       # a hit: 8.0 is now the newest
    f95 = store(9.5)                                      # a fourth kernel: the least recently used goes
    assert set(kernels_dir.glob("*.o")) == {f8, f9, f95}
    monkeypatch.setenv("EQGRAD_KERNEL_CACHE_BYTES", "0")
    prepare_fresh(elementwise_plan(10.0))
    assert not list(kernels_dir.glob("*.o"))


# ------------------------------------------------------------------ a second process

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from eqgrad import GlobalCounters, Tensor
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 24)).astype(np.float32), rng.standard_normal((24, 8)).astype(np.float32)
    h = (Tensor(x) @ Tensor(w)).relu()
    outs = [h.numpy(), h.softmax(1).numpy(), (Tensor(x) * 3 + 1).exp().sum(0).numpy()]
    print(json.dumps({"out": [o.tobytes().hex() for o in outs], "compiled": GlobalCounters.kernels_compiled,
                      "hits": GlobalCounters.kernel_disk_hits}))
""")


def _child(cache: Path, **env: str) -> dict:
    e = dict(os.environ, EQGRAD_CACHE_DIR=str(cache), EQGRAD_DISK_CACHE="1", PYTHONPATH=str(ROOT), **env)
    r = subprocess.run([sys.executable, "-c", CHILD], env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_kernel_from_disk(tmp_path):
    first = _child(tmp_path)
    second = _child(tmp_path)
    assert first["compiled"] > 0 and first["hits"] == 0
    assert second["compiled"] == 0 and second["hits"] == first["compiled"], second
    assert second["out"] == first["out"], "the same bits from the cached kernels"


# ------------------------------------------------------------------ compiled code is freed

def test_a_kernel_lives_as_long_as_a_prepared_plan_uses_it(monkeypatch):
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
    dev = get_device("LLVM")
    monkeypatch.setattr(dev, "programs", weakref.WeakValueDictionary())
    gc.collect()
    engines0, _ = live_code()
    a = elementwise_plan(11.0)
    b = elementwise_plan(11.0, extra=12.0)             # a's kernel, then one of its own
    run_a = dev.prepare(a)
    prg_a = weakref.ref(next(iter(dev.programs.values())))
    run_b = dev.prepare(b)
    assert len(dev.programs) == 2 and live_code()[0] == engines0 + 2
    assert prg_a() is not None
    del run_a
    gc.collect()
    assert prg_a() is not None, "b still uses a's kernel"
    np.testing.assert_allclose(run_plan(run_b, b), expected(11.0) * 12 + 1, rtol=1e-6, atol=1e-6)
    del run_b
    gc.collect()
    assert prg_a() is None and not dev.programs
    assert live_code()[0] == engines0, "both engines' machine code is unmapped"


CHURN = textwrap.dedent("""
    import gc, json, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_kernel_cache import X, elementwise_plan, expected, run_plan
    from eqgrad.devices import get_device
    from eqgrad.devices.llvm import live_code

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    dev = get_device("LLVM")
    kept = [(c, p, dev.prepare(p)) for c, p in ((c, elementwise_plan(c)) for c in (0.5, 0.75, 1.25))]

    def churn(lo, hi):
        for i in range(lo, hi):
            c = 2.0 + i / 4096                     # a distinct source per plan: its constant
            plan = elementwise_plan(c)
            out = run_plan(dev.prepare(plan), plan)
            assert np.allclose(out, expected(c), rtol=1e-6, atol=1e-6), i
    churn(0, 100)
    gc.collect()
    r0 = rss()
    churn(100, int(sys.argv[2]))
    gc.collect()
    ok = all(np.allclose(run_plan(run, p), expected(c), rtol=1e-6, atol=1e-6) for c, p, run in kept)
    print(json.dumps({"growth": rss() - r0, "kept_ok": ok, "engines": live_code()[0]}))
""")


@pytest.mark.slow
def test_thousands_of_plans_keep_memory_flat_and_live_plans_running(tmp_path):
    """1,000 distinct one-kernel plans, each prepared, run and dropped, after 100 to warm up:
    the process grows by less than 30 MB (before CodeEngine and the pass-manager fix it grew
    ~113 KB per plan: ~110 MB here), and plans prepared before them still run right."""
    env = dict(os.environ, EQGRAD_DISK_CACHE="0", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", CHURN, str(ROOT / "tests"), "1100"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["kept_ok"]
    assert res["engines"] == 3, "only the kept plans' engines are alive"
    assert res["growth"] < 30 << 20, f"grew {res['growth'] / 2**20:.1f} MB over 1,000 plans"


def test_plans_the_cache_dropped_free_their_kernels_and_a_jit_keeps_its_own(monkeypatch):
    """Through the engine: with room for 3 plans, 10 distinct programs leave at most a few
    engines alive (the plan cache's, the thread's last plan, the JIT's); plans still cached run
    without compiling again, and a jitted function whose plan the cache dropped long ago still
    replays right (it holds its plan's run)."""
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "0")
    monkeypatch.setenv("EQGRAD_PLAN_CACHE", "3")
    monkeypatch.setenv("EQGRAD_RESIZE", "0")
    engine.clear_cache()
    gc.collect()
    engines0, _ = live_code()

    @eqgrad.jit
    def f(x: Tensor) -> Tensor:
        return (x * 2 + 1).relu().sum(0)
    xs = np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32)
    for _ in range(3):
        f(Tensor(xs)).numpy()

    def program(m: int) -> np.ndarray:
        x = np.arange(3 * m, dtype=np.float32).reshape(3, m)
        return (Tensor(x) - 4).abs().amax(1).numpy()
    for m in range(2, 12):
        np.testing.assert_array_equal(program(m), np.abs(np.arange(3 * m, dtype=np.float32).reshape(3, m) - 4).max(1))
    gc.collect()
    assert live_code()[0] - engines0 <= 3 + 1 + 2, live_code()
    compiled = GlobalCounters.plans_compiled
    for m in (9, 10, 11):
        np.testing.assert_array_equal(program(m), np.abs(np.arange(3 * m, dtype=np.float32).reshape(3, m) - 4).max(1))
    assert GlobalCounters.plans_compiled == compiled, "the last three plans are still cached"
    np.testing.assert_allclose(f(Tensor(xs)).numpy(), np.maximum(xs * 2 + 1, 0).sum(0), rtol=1e-5)
    engine.clear_cache()


def test_a_lowered_kernel_kept_on_disk_is_read_back_and_a_tampered_one_is_not(tmp_path, monkeypatch):
    """The sources kept for later processes (kernelcache.store_lowered) are checked like object code."""
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "1")
    key = kernelcache.lowered_key(("a kernel's structure",), "cpu", "+f")
    assert kernelcache.load_lowered(key) is None
    kernelcache.store_lowered(key, "define void @eqk() {\n  ret void\n}\n", 7, False, 2)
    assert kernelcache.load_lowered(key) == {"src": "define void @eqk() {\n  ret void\n}\n", "n": 7,
                                             "nontemporal": False, "n_params": 2}
    path = tmp_path / "lowered" / f"{key}.ll"
    path.write_bytes(path.read_bytes().replace(b"ret void", b"ret vOid"))        # same size, other bytes
    with pytest.warns(CacheWarning, match="sha256"):
        assert kernelcache.load_lowered(key) is None
