"""EQGRAD_CPU: the LLVM device compiles for a named target, refuses one this CPU cannot execute, and
keys every cache that depends on the target by it (docs/env.md, devices/cpu.py).

Nothing here assumes the host's vector width: the checks read the widths off the target
(x86-64-v2 is SSE4.2, 128-bit vectors; x86-64-v3 is AVX2, 256-bit) and pick a feature to refuse
from the ones this CPU lacks. `make test` also runs the LLVM op tests with EQGRAD_CPU=x86-64-v2.
"""
from __future__ import annotations

import json
import platform
import re

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, config, engine
from eqgrad.cache import machine_id, machine_key
from eqgrad.devices import get_device
from eqgrad.devices.cpu import missing_features, resolve_target, runnable_target
from eqgrad.devices.llvm import NT_MIN, compiler
from eqgrad.errors import DeviceError
from eqgrad.extract import settings_key
from eqgrad.extract.cost import params_for, save_calibration, DeviceParams

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the named targets are x86-64 CPUs")

V2 = ("x86-64-v2", "")
V3 = ("x86-64-v3", "")


def _host_features() -> dict[str, bool]:
    import llvmlite.binding as llvm
    return dict(llvm.get_host_cpu_features())


def _assembly(src: str, target: tuple[str, str]) -> str:
    """The assembly of a kernel's source for ``target``, by the device's pipeline (compiling only:
    nothing is run, so any target will do)."""
    import llvmlite.binding as llvm
    c = compiler(target)
    return c.tm.emit_assembly(c.optimize(llvm.parse_assembly(src)))


def _fresh_programs(monkeypatch):
    """The LLVM device with an empty program cache for this test (and no cached plans), so what
    the test compiles is exactly what it finds there."""
    dev = get_device("LLVM")
    monkeypatch.setattr(dev, "programs", {})
    engine.clear_cache()
    return dev


# ------------------------------------------------------------------ the flag

def test_the_documented_example_names_are_cpus_llvm_knows():
    cpus, feats = config.llvm_cpu_table()
    for name in re.findall(r"x86-64-v\d|skylake-avx512|znver4", config.CPU.accepts):
        assert name in cpus, name
    assert {"avx2", "avx512f", "fma", "sse4.2"} <= feats


@pytest.mark.parametrize("value,hint", [("x86-64-v5", "close: x86-64-v"), ("znver", "close: znver"),
                                        ("x86-64-v3,+avx3", "close: avx, avx2"),
                                        ("x86-64-v3,fma", "+fma adds it, -fma removes it")])
def test_a_bad_target_names_what_is_close(value, hint):
    with pytest.raises(ValueError, match=f"EQGRAD_CPU: expected host, or an LLVM CPU name.*{re.escape(hint)}"):
        with eqgrad.Context(CPU=value):
            pass


def test_x86_64_v2_runs_on_any_x86_64_cpu():
    """The Makefile's second op-test run relies on it."""
    assert missing_features(V2) == ()
    assert runnable_target("x86-64-v2") == V2
    assert resolve_target("host") is None                   # compiled exactly as before the flag


def test_host_with_items_is_the_host_with_them_applied():
    import llvmlite.binding as llvm
    cpu, features = resolve_target("host,-avx2")
    assert cpu == llvm.get_host_cpu_name()
    feats = {f[1:]: f[0] == "+" for f in features.split(",")}
    assert feats["avx2"] is False
    assert all(feats[f] == on for f, on in _host_features().items() if f != "avx2")
    assert runnable_target("host,-avx2") == (cpu, features)


def test_a_target_this_cpu_cannot_execute_is_refused_by_name(monkeypatch):
    host = _host_features()
    # no x86 CPU has both (XOP: AMD before Zen; AVX512-FP16: Intel from Sapphire Rapids)
    lacking = next(f for f in ("xop", "avx512fp16", "fma4") if not host.get(f, False))
    value = f"x86-64-v2,+{lacking}"
    missing = missing_features(resolve_target(value))
    assert lacking in missing and set(missing) <= {f for f, on in host.items() if not on}
    dev = _fresh_programs(monkeypatch)
    with eqgrad.Context(CPU=value):
        with pytest.raises(DeviceError, match=rf"EQGRAD_CPU={re.escape(value)} needs {', '.join(missing)}; this CPU .* lacks"):
            (Tensor(np.ones(5, np.float32)) + 1).realize()
    assert not dev.programs, "nothing may be compiled for a target that cannot run"
    # x86-64-v4 is AVX-512: refused exactly where this CPU lacks AVX-512F
    assert ("avx512f" in missing_features(("x86-64-v4", ""))) == (not host.get("avx512f", False))


# ------------------------------------------------------------------ kernels for x86-64-v2

def test_kernels_compiled_for_x86_64_v2_give_numpy_results_with_128_bit_vectors(monkeypatch):
    """An elementwise chain, reductions, a matmul (register lanes) and a streaming store, compiled
    for x86-64-v2 and run: NumPy's numbers (and the reference device's: VALIDATE is on), and
    the machine code has packed SSE and no 256- or 512-bit registers. The same sources compiled for x86-64-v3 use 256-bit
    registers, so the check can tell the targets apart on any host."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((37, 301)).astype(np.float32)
    a = rng.standard_normal((64, 96)).astype(np.float32)
    b = rng.standard_normal((96, 128)).astype(np.float32)
    n = NT_MIN // 4 + 4096                                  # a multiple of 16: streaming stores
    u, v = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    dev = _fresh_programs(monkeypatch)
    with eqgrad.Context(CPU="x86-64-v2"):
        tx = Tensor(x)
        np.testing.assert_allclose(((tx * 2 + 1).exp2() - tx.abs()).numpy(),
                                   np.exp2(x * 2 + 1) - np.abs(x), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tx.sum(1).numpy(), x.astype(np.float64).sum(1), rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(tx.amax(0).numpy(), x.max(0))
        np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
        tu, tv = Tensor(u), Tensor(v)
        for threads in (1, 2):
            with eqgrad.Context(THREADS=threads):
                np.testing.assert_allclose((tu * tv + 1).numpy(), u * v + 1, rtol=1e-6, atol=1e-6)
    new = dev.programs
    assert new and all(key[2] == V2 and p.compiler.target == V2 for key, p in new.items())
    streaming = [p for p in new.values() if p.nontemporal]
    assert streaming and all(p.nontemporal_stores >= 1 for p in streaming)
    wide = 0
    for p in new.values():
        # the machine code, not the IR: LLVM IR may hold <32 x float> values that instruction
        # selection splits into the target's registers
        asm = _assembly(p.src, V2)
        assert "%ymm" not in asm and "%zmm" not in asm, f"{p.name}: a vector wider than SSE for x86-64-v2"
        wide += "%ymm" in _assembly(p.src, V3)
    assert any(re.search(r"\b(?:mulps|addps)\b.*%xmm", _assembly(p.src, V2)) for p in new.values())
    assert wide, "no kernel used 256-bit registers for x86-64-v3: the width check proves nothing"


def test_the_device_compiles_for_the_flag_in_effect(monkeypatch):
    """Under `make test`'s second run (EQGRAD_CPU=x86-64-v2) this checks that the environment's
    target is the one compiled for; in the main run, the host (no target: as before the flag)."""
    dev = _fresh_programs(monkeypatch)
    x = np.arange(97, dtype=np.float32)
    np.testing.assert_allclose((Tensor(x) * 3 - 1).numpy(), x * 3 - 1)
    want = resolve_target(config.CPU.value)
    assert dev.programs and all(key[2] == p.compiler.target == want for key, p in dev.programs.items())


# ------------------------------------------------------------------ cache keys

def test_the_target_is_in_every_key_that_depends_on_it(tmp_path, monkeypatch):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    with eqgrad.Context(CPU="host"):
        host_plan, host_machine, numpy_plan = settings_key("LLVM"), machine_key("LLVM"), settings_key("NUMPY")
        assert host_machine == machine_id()                 # the host's keys are those of before the flag
        save_calibration("LLVM", DeviceParams(bandwidth=3e9, peak=7e9, source="calibrated test"))
        assert params_for("LLVM").source == "calibrated test"
    with eqgrad.Context(CPU="x86-64-v2"):
        assert settings_key("LLVM") != host_plan
        assert machine_key("LLVM") != host_machine and machine_key("OPENCL") == machine_id()
        assert params_for("LLVM").source == "default", "a calibration of host code used for x86-64-v2"
        assert settings_key("NUMPY") == numpy_plan           # other devices do not compile for it


def test_kernel_search_picks_are_kept_per_target(tmp_path, monkeypatch):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((32, 64)).astype(np.float32), rng.standard_normal((64, 64)).astype(np.float32)
    counts = []
    for cpu in ("host", "x86-64-v2"):
        engine.clear_cache()
        with eqgrad.Context(BEAM=1, BEAM_TIME=5.0, CPU=cpu, BLAS=0):     # (generated kernels searched)
            np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
        counts.append(len(json.loads((tmp_path / "beam.json").read_text())["entries"]))
    assert counts[0] >= 1 and counts[1] == 2 * counts[0], counts
