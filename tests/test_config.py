"""Flags (eqgrad/config.py, docs/env.md): every flag checks its range from the environment and in
Context alike, and every flag that changes a plan is part of the plan cache key."""
from __future__ import annotations

import re

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, config, engine
from eqgrad.counters import GlobalCounters
from eqgrad.extract import DeviceParams, settings_key, using

# flag -> (bad values, (good value, parsed) pairs); the bad ones are given both as text (the
# environment) and as values (Context)
CASES: dict[str, tuple[list, list]] = {
    "DEBUG": (["-1", "7", "2.7", 2.7, "loud", True, None], [("0", 0), ("6", 6), (3, 3)]),
    "EQGRAD_DEVICE": (["TPU", "", 1], [("numpy", "NUMPY"), ("CPU", "LLVM"), ("cl", "OPENCL")]),
    "EQGRAD_OPT": (["7", "-1", "2", "0.5", "yes", 1.0], [("0", 0), ("1", 1), (0, 0)]),
    "EQGRAD_SATURATION_TIMEOUT": (["nan", "inf", "-inf", "1e400", "0", "-1", "1e7", "soon", float("nan"), float("inf"), 0],
                                  [("20", 20.0), ("0.5", 0.5), (1e-4, 1e-4), ("1e6", 1e6)]),
    "EQGRAD_EGRAPH_NODES": (["0", "-5", "1.5", "many", 1e5], [("1", 1), ("200000", 200000), (30_000, 30_000)]),
    "EQGRAD_EGRAPH_MEMORY": (["0", "-1G", "-1", "0G", "nanG", "infG", "1.5", "4X", "", 0, -1, 2.5],
                             [("4G", 4 << 30), ("512M", 512 << 20), ("1.5G", 3 << 29), ("1048576", 1 << 20), (64 << 20, 64 << 20)]),
    "EQGRAD_EXTRACTOR": (["fastest", "", 3], [("ILP", "ilp"), ("greedy", "greedy"), (" measured ", "measured")]),
    "EQGRAD_ILP_TIME": (["nan", "inf", "0", "-2", "1e400"], [("10", 10.0), (0.25, 0.25)]),
    "EQGRAD_EXTRACT_TIME": (["nan", "inf", "0", "-2", "1e400", "soon"], [("60", 60.0), (0.5, 0.5)]),
    "EQGRAD_ILP_MAX_CLASSES": (["-1", "3.5", "lots"], [("0", 0), ("300", 300)]),
    "EQGRAD_THREADS": (["0", "-2", "2.5", "1025", "all"], [("1", 1), ("16", 16), (1024, 1024)]),
    "EQGRAD_SPIN_US": (["-1", "100001", "2.5", "long"], [("0", 0), ("200", 200), (100_000, 100_000)]),
    "EQGRAD_BEAM": (["-1", "2.5", "yes"], [("0", 0), ("4", 4)]),
    "EQGRAD_BEAM_TIME": (["nan", "inf", "0", "-1"], [("10", 10.0), (5.0, 5.0)]),
    "EQGRAD_CPU": (["pentium9", "x86-64-v3,avx2", "x86-64-v3,+avx3", "x86-64-v3,", ",+avx2", "", 3],
                   [("host", "host"), (" X86-64-v2 ", "x86-64-v2"), ("x86-64-v3, -fma", "x86-64-v3,-fma")]),
    "EQGRAD_PLAN_CACHE": (["0", "-1", "1.5"], [("1", 1), ("512", 512)]),
    "EQGRAD_RESIZE": (["2", "-1", "yes", 0.5], [("0", 0), ("1", 1)]),
    "EQGRAD_PRESTART": (["2", "-1", "on", 0.5], [("0", 0), ("1", 1)]),
    "EQGRAD_SIZE_ARGS": (["2", "-1", "on", 0.5], [("0", 0), ("1", 1)]),
    "EQGRAD_MERGE": (["2", "-1", "on", 0.5], [("0", 0), ("1", 1)]),
    "EQGRAD_BLAS": (["2", "-1", "yes", 0.5], [("0", 0), ("1", 1)]),
    "EQGRAD_REGIONS": (["2", "-1", "yes", 0.5], [("0", 0), ("1", 1)]),
    "EQGRAD_PROGRESS": (["-1", "nan", "inf", "soon", True], [("0", 0.0), ("2", 2.0), ("0.5", 0.5)]),
    "EQGRAD_POOL_BYTES": (["-1", "-1M", "nanM", "1.5", "big"], [("0", 0), ("1M", 1 << 20), ("1G", 1 << 30)]),
    "EQGRAD_PEAK_MEMORY": (["-1", "-1M", "nanM", "1.5", "lots", -2], [("0", 0), ("512M", 512 << 20), (4096, 4096)]),
    "EQGRAD_VALIDATE": (["2", "-1", "on", 0.5], [("0", 0), ("1", 1)]),
    "EQGRAD_VERIFY": (["2", "-1", "yes", 1.0], [("0", 0), ("1", 1), (0, 0)]),
    "EQGRAD_CACHE_DIR": (["   ", 5], [("/tmp/eqgrad-test-cache", "/tmp/eqgrad-test-cache")]),
    "EQGRAD_DISK_CACHE": (["2", "-1", "on", 1.0], [("0", 0), ("1", 1), (0, 0)]),
    "EQGRAD_DISK_CACHE_BYTES": (["-1", "-1M", "nanM", "1.5", "lots"], [("0", 0), ("256M", 256 << 20), ("1G", 1 << 30)]),
    "EQGRAD_KERNEL_CACHE_BYTES": (["-1", "-1M", "nanM", "1.5", "lots"], [("0", 0), ("256M", 256 << 20), ("64K", 64 << 10)]),
}


@pytest.fixture(autouse=True)
def _own_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))       # the kernel search (BEAM) writes there


def test_every_flag_has_test_cases():
    assert set(CASES) == set(config.FLAGS), "a flag without range tests (add it to CASES)"


def _bad():
    return [(name, v) for name, (bad, _) in CASES.items() for v in bad]


def _good():
    return [(name, v, want) for name, (_, good) in CASES.items() for v, want in good]


@pytest.fixture
def env_only(monkeypatch):
    """No Context overrides (the suite runs under Context(VALIDATE=1)): flags come from the environment."""
    monkeypatch.setattr(config, "_overrides", {})


def _message(name: str, v) -> str:
    """The error names the flag, what it accepts and the value given."""
    accepts = getattr(config.FLAGS[name], "accepts", "")
    return rf"{name}: expected {re.escape(accepts)}.*, got {re.escape(repr(v))}"


@pytest.mark.parametrize("name,v", _bad())
def test_bad_value_in_context_names_flag_range_and_value(name, v):
    with pytest.raises(ValueError, match=_message(name, v)):
        with eqgrad.Context(**{name: v}):
            pass


@pytest.mark.parametrize("name,v", [(n, v) for n, v in _bad() if isinstance(v, str) and v != ""])
def test_bad_value_in_environment_names_flag_range_and_value(name, v, monkeypatch, env_only):
    monkeypatch.setenv(name, v)
    with pytest.raises(ValueError, match="environment flag " + _message(name, v)):
        config.FLAGS[name].value


@pytest.mark.parametrize("name,v,want", _good())
def test_good_values(name, v, want, monkeypatch):
    with eqgrad.Context(**{name: v}):
        got = config.FLAGS[name].value
        assert got == want and type(got) is type(want)
    if isinstance(v, str):
        monkeypatch.setenv(name, v)
        monkeypatch.setattr(config, "_overrides", {})
        got = config.FLAGS[name].value
        assert got == want and type(got) is type(want)


def test_empty_environment_value_means_the_default(monkeypatch, env_only):
    for name, f in config.FLAGS.items():
        monkeypatch.setenv(name, "")
        assert f.value == f.default
        if f.default is not None:             # None: EQGRAD_CACHE_DIR's "~/.cache/eqgrad"
            f.checked(f.default)              # every default is in its own range


def test_bad_flag_fails_at_realize_not_deep_inside(monkeypatch):
    monkeypatch.setenv("EQGRAD_SATURATION_TIMEOUT", "nan")
    engine.clear_cache()
    with pytest.raises(ValueError, match="EQGRAD_SATURATION_TIMEOUT: expected a finite number"):
        (Tensor(np.ones(3, np.float32)) * 3 + 1).realize()


# ------------------------------------------------------------------ settings in the plan cache key

def _kernels(make) -> tuple[int, int, np.ndarray]:
    """(kernels run, plans compiled, result) of one realize."""
    GlobalCounters.reset()
    out = make().numpy()
    return GlobalCounters.kernel_count, GlobalCounters.plans_compiled, out


def test_opt0_for_a_cached_structure_plans_again_and_back():
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    make = lambda: ((x * 2 + 1) * 3).exp2()                        # four ops, one fused kernel
    ref = np.exp2(((np.arange(12, dtype=np.float32).reshape(3, 4) * 2 + 1) * 3))
    engine.clear_cache()
    k1, c1, o1 = _kernels(make)
    assert (k1, c1) == (1, 1)
    with eqgrad.Context(OPT=0):
        k0, c0, o0 = _kernels(make)
    assert (k0, c0) == (4, 1), "OPT=0 must give one kernel per op (a new plan), not the cached fused one"
    k2, c2, o2 = _kernels(make)
    assert (k2, c2) == (1, 0), "back to OPT=1: the fused plan, from the cache"
    with eqgrad.Context(OPT=0):
        assert _kernels(make)[:2] == (4, 0)
    for o in (o1, o0, o2):
        np.testing.assert_allclose(o, ref, rtol=1e-6)


def _recompiles(**flags) -> int:
    x = Tensor(np.ones((5, 7), np.float32))
    make = lambda: (x * 3 + 2).sum(1)
    make().realize()
    GlobalCounters.reset()
    with eqgrad.Context(**flags):
        make().realize()
    return GlobalCounters.plans_compiled


@pytest.mark.parametrize("flags", [dict(OPT=0), dict(EXTRACTOR="improve"), dict(SATURATION_TIMEOUT=33.0),
                                   dict(EGRAPH_NODES=150_000), dict(EGRAPH_MEMORY="3G"),
                                   dict(THREADS=config.THREADS.default % 8 + 1), dict(BEAM=1), dict(BEAM_TIME=3.0),
                                   dict(EXTRACTOR="ilp", ILP_TIME=7.0), dict(CPU="x86-64-v2"), dict(EXTRACT_TIME=30.0),
                                   dict(PEAK_MEMORY="1G")])
def test_settings_that_change_the_plan_are_in_the_key(flags):
    before = settings_key("LLVM")
    with eqgrad.Context(**flags):
        assert settings_key("LLVM") != before
    assert _recompiles(**flags) == 1


@pytest.mark.parametrize("flags", [dict(DEBUG=0), dict(VALIDATE=1), dict(VERIFY=0), dict(PLAN_CACHE=400), dict(POOL_BYTES="2M"),
                                   dict(DEVICE="NUMPY"), dict(ILP_TIME=7.0), dict(ILP_MAX_CLASSES=9)])
def test_settings_that_do_not_change_the_plan_are_not(flags):
    before = settings_key("LLVM")
    with eqgrad.Context(**flags):
        assert settings_key("LLVM") == before
    assert _recompiles(**flags) == 0


def test_llvm_only_settings_do_not_replan_other_devices():
    before = settings_key("NUMPY")
    with eqgrad.Context(THREADS=1, BEAM=2, BEAM_TIME=1.0, CPU="x86-64-v2"):
        assert settings_key("NUMPY") == before


def test_cost_function_and_parameters_are_in_the_key():
    base = settings_key("LLVM")
    with using(params=DeviceParams(bandwidth=1e9)):
        assert settings_key("LLVM") != base
    fns = [lambda s, p: s.nbytes, lambda s, p: s.flops]
    keys = []
    for fn in fns:
        with using(cost_fn=fn):
            keys.append(settings_key("LLVM"))
    assert keys[0] != keys[1] != base
    with using(cost_fn=fns[0]):
        assert settings_key("LLVM") == keys[0]


def test_the_settings_key_memo_follows_the_environment_the_session_and_the_calibration(monkeypatch, tmp_path):
    """settings_key is memoized on the raw state of the flags it reads, the session's extraction
    settings (which a user may change in place) and the calibration file's stamp: each change is
    seen at the next call."""
    from eqgrad.engine.session import Session
    from eqgrad.extract import ExtractSettings
    from eqgrad.extract.cost import save_calibration
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    base = settings_key("LLVM")
    monkeypatch.setenv("EQGRAD_EXTRACT_TIME", "31")
    assert settings_key("LLVM") != base
    monkeypatch.delenv("EQGRAD_EXTRACT_TIME")
    assert settings_key("LLVM") == base
    s = ExtractSettings()
    assert settings_key("LLVM", s) == base
    s.extractor = "improve"
    assert settings_key("LLVM", s) != base
    s.extractor = None
    s.params["LLVM"] = DeviceParams(peak=1e9)
    assert settings_key("LLVM", s) != base
    assert Session(extraction=ExtractSettings()) is not None
    save_calibration("LLVM", DeviceParams(launch=7e-6, bandwidth=9e9, peak=8e9, source="calibrated test"))
    calibrated = settings_key("LLVM")
    assert calibrated != base and calibrated[6].bandwidth == 9e9


def test_the_settings_key_memo_covers_every_flag_it_reads(monkeypatch):
    """Every flag ``_settings_key`` reads is in the memo's key (``_KEY_FLAGS``): a flag read but not
    keyed would leave a stale key after it changed."""
    from eqgrad import extract
    read = set()
    value = config.Flag.value
    monkeypatch.setattr(config.Flag, "value", property(lambda f: (read.add(f.name), value.fget(f))[1]))
    with eqgrad.Context(EXTRACTOR="ilp"):          # the ilp flags are read for ilp only
        extract._settings_key("LLVM", extract.effective())
    # the cache directory decides only which calibration file is read: keyed by its stamp (its path)
    keyed = {f.name for f in extract._KEY_FLAGS} | {"EQGRAD_CACHE_DIR"}
    assert read and read <= keyed, read - keyed


# ---------------------------------------------------------------------------- unknown variables

def test_unknown_eqgrad_variables_are_named_with_the_closest_flag():
    """A mistyped flag (EQGRAD_OPTT=0) used to be silently ignored; now it warns."""
    env = {"EQGRAD_OPTT": "0", "EQGRAD_OPT": "1", "EQGRAD_RULEBOOKS": "", "EQGRAD_SATURATON_TIMEOUT": "3",
           "EQGRAD_ZZZ": "1", "DEBUG": "1", "PATH": "/bin"}
    assert config.unknown_variables(env) == [("EQGRAD_OPTT", "EQGRAD_OPT"),
                                             ("EQGRAD_SATURATON_TIMEOUT", "EQGRAD_SATURATION_TIMEOUT"),
                                             ("EQGRAD_ZZZ", None)]
    with pytest.warns(eqgrad.EqgradWarning, match=r"EQGRAD_OPTT \(did you mean EQGRAD_OPT\?\).*EQGRAD_ZZZ\. .*docs/env.md"):
        config.warn_unknown_variables(env)
    config.warn_unknown_variables({"EQGRAD_OPT": "1", "PATH": "/bin"})       # all known: no warning


def test_every_eqgrad_variable_the_code_and_docs_name_is_known():
    """A variable read outside config.FLAGS is listed in config.OTHER_VARIABLES, or setting it would warn."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    files = [*(root / "eqgrad").rglob("*.py"), *(root / "docs").glob("*.md"), root / "Makefile"]
    named = {n for f in files for n in re.findall(r"EQGRAD_[A-Z][A-Z0-9_]*", f.read_text())}
    assert "EQGRAD_RULEBOOKS" in named and not config.unknown_variables({n: "" for n in named})


def test_a_mistyped_flag_warns_once_per_process():
    import subprocess
    import sys
    code = ("import eqgrad\nfrom eqgrad import Tensor\n"
            "for i in range(3):\n    (Tensor([1.0, 2.0], device='NUMPY') + i).numpy()\n")
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("EQGRAD_")}
    out = subprocess.run([sys.executable, "-c", code], env={**env, "EQGRAD_OPTT": "0", "EQGRAD_DISK_CACHE": "0"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("EqgradWarning") == 1 and "EQGRAD_OPTT (did you mean EQGRAD_OPT?)" in out.stderr
