"""The on-disk caches (eqgrad/cache.py): a bad file, entry or directory is ignored with one warning
and never breaks a realize; writes merge concurrent writers, follow no planted symlink, are
fsynced, and are private (directory 0700, files 0600)."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.cache import CacheWarning, JsonCache, cache_dir
from eqgrad.extract import using
from eqgrad.extract.cost import DEFAULT_PARAMS, params_for, save_calibration
from eqgrad.cache import machine_id
from conftest import needs_root, open_up


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(d))
    engine.clear_cache()
    yield d
    engine.clear_cache()


def _cache_warnings(fn) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        out = fn()
    return out, [str(w.message) for w in ws if issubclass(w.category, CacheWarning)]


def _write(path: Path, entries, version: int = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": version, "entries": entries}))


X = np.arange(24, dtype=np.float32).reshape(4, 6) / 7


def _program(scale: float = 3.0) -> np.ndarray:
    return ((Tensor(X) * scale + 1).exp2().sum(1)).numpy()


def _ref(scale: float = 3.0) -> np.ndarray:
    return np.exp2(X * scale + 1).sum(1)


# ------------------------------------------------------------------ bad entries

@pytest.mark.parametrize("entry", [dict(launch=5e-6, bandwidth=0, peak=5e10),
                                   dict(launch=5e-6, bandwidth=2e10, peak=0.0),
                                   dict(launch=-1, bandwidth=2e10, peak=5e10),
                                   dict(launch=5e-6, bandwidth="fast", peak=5e10),
                                   dict(launch=5e-6, peak=5e10), "calibrated", [1, 2, 3], None])
def test_bad_calibration_entry_is_ignored_with_one_warning(cache, entry):
    f = cache / "calibration.json"
    _write(f, {f"LLVM|{machine_id()}": entry})
    for i in range(3):                                       # one warning, not one per realize
        got, ws = _cache_warnings(lambda: (_program(), params_for("LLVM")))
        np.testing.assert_allclose(got[0], _ref(), rtol=1e-5)
        assert got[1] == DEFAULT_PARAMS["LLVM"]
        assert len(ws) == (1 if i == 0 else 0), ws
        if i == 0:
            assert str(f) in ws[0] and "bad entr" in ws[0]
        engine.clear_cache()


def test_good_calibration_next_to_a_bad_one_is_used(cache):
    good = dict(launch=1e-6, bandwidth=3e10, peak=9e10, source="calibrated today")
    _write(cache / "calibration.json", {f"LLVM|{machine_id()}": good, "OPENCL|x": dict(bandwidth=0)})
    p, ws = _cache_warnings(lambda: params_for("LLVM"))
    assert (p.bandwidth, p.peak, p.source) == (3e10, 9e10, "calibrated today") and len(ws) == 1


@pytest.mark.parametrize("text", ["{corrupt", "[1, 2]", '{"version": 1, "entries": [1]}', "\x00\xff"])
def test_unparsable_cache_file_is_ignored_with_one_warning(cache, text):
    f = cache / "calibration.json"
    f.parent.mkdir(parents=True)
    f.write_text(text)
    got, ws = _cache_warnings(lambda: [_program(s) for s in (1.0, 2.0)])
    np.testing.assert_allclose(got[1], _ref(2.0), rtol=1e-5)
    assert len(ws) == 1 and str(f) in ws[0]


def test_cache_file_that_is_a_directory_is_ignored(cache):
    (cache / "calibration.json").mkdir(parents=True)
    got, ws = _cache_warnings(_program)
    np.testing.assert_allclose(got, _ref(), rtol=1e-5)
    assert len(ws) == 1 and "calibration.json" in ws[0]


@pytest.mark.parametrize("bad", [[1, 2], "fast", 3, None, {"seconds": 1.0}, {"signature": 5, "seconds": 1.0}])
def test_bad_measured_entry_is_ignored_and_measured_again(cache, bad):
    x = Tensor(np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32))
    ref = x.numpy()
    ref = np.exp(ref - ref.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    with using(extractor="measured"):
        x.softmax(-1).realize()
        f = cache / "measured.json"
        data = json.loads(f.read_text())
        entries = data["entries"]
        assert entries
        _write(f, {k: bad for k in entries}, version=data["version"])      # the file's own (current) version
        engine.clear_cache()
        got, ws = _cache_warnings(lambda: x.softmax(-1).numpy())
        assert isinstance(engine.last_plan.result.info["measured"], list)     # measured again
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-7)
    assert len(ws) == 1 and str(f) in ws[0]
    healed = json.loads(f.read_text())["entries"]
    assert all(isinstance(v, dict) and isinstance(v.get("signature"), str) for v in healed.values())


@pytest.mark.parametrize("bad", [5, "x", [16], [3, 5], [16, "4"], {"up": [16, 4]}, [True, 4]])
def test_bad_kernel_search_entry_is_ignored_and_searched_again(cache, bad):
    a = np.random.default_rng(1).standard_normal((24, 32)).astype(np.float32)
    with eqgrad.Context(BEAM=2, BEAM_TIME=5.0, BLAS=0):      # (the search times generated kernels)
        (Tensor(a) @ Tensor(a.T)).realize()
        f = cache / "beam.json"
        entries = json.loads(f.read_text())["entries"]
        assert entries
        _write(f, {k: bad for k in entries})
        engine.clear_cache()
        got, ws = _cache_warnings(lambda: (Tensor(a) @ Tensor(a.T)).numpy())
    np.testing.assert_allclose(got, a @ a.T, rtol=1e-4, atol=1e-4)
    assert len(ws) == 1 and str(f) in ws[0]


# ------------------------------------------------------------------ unusable directories

def _unusable(kind: str, tmp_path: Path) -> Path:
    if kind == "under a regular file":
        (tmp_path / "file").write_text("x")
        return tmp_path / "file" / "eqgrad"
    if kind == "a regular file":
        (tmp_path / "file").write_text("x")
        return tmp_path / "file"
    if kind == "a dangling symlink":
        os.symlink(tmp_path / "nowhere", tmp_path / "link")
        return tmp_path / "link"
    if kind == "not writable, even by root":            # /proc/self: a directory no one can create files in
        if not os.path.isdir("/proc/self"):
            pytest.skip("no /proc")
        return Path("/proc/self")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["under a regular file", "a regular file", "a dangling symlink",
                                  "not writable, even by root"])
def test_unusable_cache_directory_turns_caching_off_with_one_warning(kind, tmp_path, monkeypatch):
    d = _unusable(kind, tmp_path)
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(d))
    engine.clear_cache()

    def work():
        outs = [_program(s) for s in (1.0, 2.0)]
        p = params_for("LLVM")
        saved = save_calibration("LLVM", DEFAULT_PARAMS["LLVM"])
        with using(extractor="measured"):
            outs.append(_program(4.0))
        with eqgrad.Context(BEAM=1, BEAM_TIME=2.0):
            outs.append(_program(5.0))
        return outs, p, saved
    (outs, p, saved), ws = _cache_warnings(work)
    for o, s in zip(outs, (1.0, 2.0, 4.0, 5.0)):
        np.testing.assert_allclose(o, _ref(s), rtol=1e-5)
    assert p == DEFAULT_PARAMS["LLVM"] and saved is None and cache_dir() is None
    assert len(ws) == 1 and str(d) in ws[0] and "caching is off" in ws[0], ws


def test_read_only_directory_is_unusable_unless_we_can_write(tmp_path, monkeypatch):
    """Mode bits do not bind root: usable means a file can be created there."""
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(d))
    try:
        writable = os.access(d, os.W_OK)            # root: True
        saved, ws = _cache_warnings(lambda: save_calibration("LLVM", DEFAULT_PARAMS["LLVM"]))
        if writable:
            assert saved == d / "calibration.json" and saved.exists() and not ws
        else:
            assert saved is None and len(ws) == 1 and str(d) in ws[0]
    finally:
        d.chmod(0o700)




@pytest.mark.parametrize("how", [pytest.param("another user's", marks=needs_root), "mode 0777", "mode 0770",
                                 "mode 0702", "mode 1777"])
def test_a_cache_directory_of_another_user_or_open_to_others_is_refused(how, tmp_path, monkeypatch):
    """As ssh refuses a key file: whoever else can write the directory could plant what this process
    runs. Caching is off, with one warning naming the directory and why; nothing is read or written."""
    d = tmp_path / "shared"
    d.mkdir()
    good = dict(launch=1e-6, bandwidth=3e10, peak=9e10, source="planted")
    _write(d / "calibration.json", {f"LLVM|{machine_id()}": good})          # must not be read
    open_up(d, how)
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(d))
    engine.clear_cache()
    (outs, p, saved), ws = _cache_warnings(lambda: ([_program(s) for s in (1.0, 2.0)], params_for("LLVM"),
                                                    save_calibration("LLVM", DEFAULT_PARAMS["LLVM"])))
    np.testing.assert_allclose(outs[1], _ref(2.0), rtol=1e-5)
    assert p == DEFAULT_PARAMS["LLVM"] and saved is None and cache_dir() is None
    assert len(ws) == 1 and str(d) in ws[0] and "caching is off" in ws[0], ws
    assert ("owned by uid" if how == "another user's" else "writable by") in ws[0]
    assert sorted(p.name for p in d.iterdir()) == ["calibration.json"]


@pytest.mark.parametrize("how", [pytest.param("another user's", marks=needs_root), "mode 0666", "mode 0620",
                                 "mode 0602"])
def test_a_cache_file_of_another_user_or_open_to_others_is_refused_and_rewritten(cache, how):
    good = dict(launch=1e-6, bandwidth=3e10, peak=9e10, source="planted")
    f = cache / "calibration.json"
    _write(f, {f"LLVM|{machine_id()}": good})
    open_up(f, how)
    p, ws = _cache_warnings(lambda: [params_for("LLVM") for _ in range(3)])
    assert p[0] == DEFAULT_PARAMS["LLVM"] and len(ws) == 1 and str(f) in ws[0] and "refused" in ws[0], ws
    # the next store rewrites it, this user's and private, without the refused entries
    JsonCache("calibration", 1).put("other", dict(good, source="mine"))
    st = os.stat(f)
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o600
    assert list(json.loads(f.read_text())["entries"]) == ["other"]


def test_failed_compile_with_an_unusable_cache_directory_still_names_the_compile_error(tmp_path, monkeypatch):
    d = _unusable("under a regular file", tmp_path)
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(d))
    import eqgrad.devices.cpu as cpu
    real = cpu.render_llvm
    monkeypatch.setattr(cpu, "render_llvm", lambda lk: real(lk).replace("ret void", "ret i32 0"))
    engine.clear_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        with pytest.raises(eqgrad.CompileError, match=r"LLVM device: kernel k0 .* failed to compile.*written to") as e:
            (Tensor(np.ones((3, 3), np.float32)) * 17 + 3).realize()
    path = str(e.value).rsplit("written to ", 1)[1]
    try:
        assert "ret i32 0" in open(path).read() and not path.startswith(str(d))
    finally:
        os.unlink(path)
    monkeypatch.setattr(cpu, "render_llvm", real)
    engine.clear_cache()


# ------------------------------------------------------------------ safe writes

def test_two_threads_keep_every_put(cache):
    c = JsonCache("threads", 1)
    errors = []

    def work(tag: str) -> None:
        try:
            for i in range(300):
                c.put(f"{tag}{i}", i)
        except Exception as e:                     # noqa: BLE001 -- reported below
            errors.append(e)
    ts = [threading.Thread(target=work, args=(t,)) for t in "ab"]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(c.load()) == 600
    assert not list(cache.glob("*.tmp")) and not list(cache.glob(".*.tmp"))


def test_two_processes_keep_every_put(cache):
    code = ("import sys; from eqgrad.cache import JsonCache; c = JsonCache('procs', 1)\n"
            "for i in range(100): c.put(f'{sys.argv[1]}{i}', i)\n")
    env = dict(os.environ, EQGRAD_CACHE_DIR=str(cache))
    ps = [subprocess.Popen([sys.executable, "-c", code, tag], env=env) for tag in "ab"]
    assert [p.wait(timeout=300) for p in ps] == [0, 0]
    assert len(JsonCache("procs", 1).load()) == 200


def test_planted_symlinks_are_never_followed(cache):
    cache.mkdir(parents=True)
    victim = cache.parent / "victim.txt"
    victim.write_text("precious")
    c = JsonCache("planted", 1)
    # every predictable name a writer might use next to planted.json: the old `<name>.<pid>.tmp`,
    # and the final file itself (replaced, not written through)
    for name in (f"planted.{os.getpid()}.tmp", "planted.tmp", "planted.json.tmp", ".planted.json.tmp", "planted.json"):
        os.symlink(victim, cache / name)
    _, ws = _cache_warnings(lambda: c.put("k", 1))           # planted.json -> victim: not JSON, one warning
    assert victim.read_text() == "precious"
    assert not (cache / "planted.json").is_symlink() and c.load() == {"k": 1}
    assert len(ws) == 1 and "planted.json" in ws[0]
    # a planted lock file is not followed either: caching is off, the victim untouched
    os.symlink(victim, cache / ".locked.json.lock")
    saved, ws = _cache_warnings(lambda: JsonCache("locked", 1).put("k", 1))
    assert saved is None and victim.read_text() == "precious" and len(ws) == 1


def test_new_directory_is_0700_and_files_are_0600(tmp_path, monkeypatch):
    d = tmp_path / "a" / "b" / "eqgrad"
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(d))
    path = save_calibration("LLVM", DEFAULT_PARAMS["LLVM"])
    mode = lambda p: stat.S_IMODE(os.stat(p).st_mode)
    assert mode(d) == 0o700
    assert mode(path) == 0o600 and mode(d / ".calibration.json.lock") == 0o600


def test_writes_are_fsynced(cache, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else fd)
        real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    JsonCache("synced", 1).put("k", 1)
    assert any(".synced.json." in str(s) for s in synced), synced      # the data, before the rename


def test_device_params_refuse_values_that_would_divide_by_zero():
    from eqgrad.extract import DeviceParams
    for bad in (dict(bandwidth=0), dict(peak=0.0), dict(launch=-1e-6), dict(bandwidth=float("nan")),
                dict(peak=float("inf")), dict(max_nodes=0), dict(cold=-1e-6), dict(cold=float("nan")),
                dict(stream_bytes=-1), dict(stream_bytes=1.5), dict(stream_bytes=True), dict(row_pass=-1e-9),
                dict(row_pass=float("inf"))):
        (field, v), = bad.items()
        with pytest.raises(ValueError, match=rf"DeviceParams.{field}: expected .*got {v!r}"):
            DeviceParams(**bad)


_OPENS: list | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENS is not None and event == "open":
        _OPENS.append(args[0])


def test_a_cached_realize_opens_no_file():
    """What keys the plan cache (the machine, the flags, the calibration's stamp) is read without
    opening a file on every realize (the machine id was read from /proc/cpuinfo each time once,
    half of a cached realize's cost)."""
    global _OPENS
    import sys
    x = eqgrad.Tensor(np.ones(8, np.float32)).realize()
    (x * 3).realize()                      # compiled and cached
    sys.addaudithook(_audit)               # (hooks stay for the process: it records only while _OPENS is a list)
    _OPENS = []
    try:
        for _ in range(20):
            (x * 3).realize()
        opened = list(_OPENS)
    finally:
        _OPENS = None
    assert opened == [], opened
