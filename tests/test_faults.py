"""Faults never give a wrong answer or a hang: each is forced here and must produce the right
numbers with a warning that names the limit, or a clear error."""
import os
import re
import signal

import numpy as np
import pytest

import eqgrad
import eqgrad.devices
from eqgrad import EqgradWarning, Tensor, engine
from eqgrad.rules import saturate
from conftest import DEVICES


def _prog(x: Tensor, depth: int) -> Tensor:
    y = x
    for i in range(depth):
        y = (y * 1.5 + i).permute(1, 0) if i % 2 else y.exp2() * 0.5
    return y


def _ref(x: np.ndarray, depth: int) -> np.ndarray:
    y = x
    for i in range(depth):
        y = (y * np.float32(1.5) + np.float32(i)).T if i % 2 else np.exp2(y) * np.float32(0.5)
    return y


def test_killed_worker_falls_back_with_a_warning(monkeypatch):
    """The egglog worker is killed (SIGKILL) while it holds the request: the realize still returns
    the right numbers (unoptimized plan) with a warning, and the next realize gets a new worker."""
    saturate.reset_saturator()
    sat = saturate.default_saturator()
    sat.run("(let $v0 (Const 1.0 \"float32\" (vec-empty)))\n", timeout=30)       # worker up
    real_send = saturate.Channel.send

    def send_then_die(conn, obj):
        real_send(conn, obj)
        if isinstance(obj, tuple) and obj and obj[0] == "run" and sat._proc is not None:
            os.kill(sat._proc.pid, signal.SIGKILL)
    monkeypatch.setattr(saturate.Channel, "send", send_then_die)
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32) * 0.1
    with pytest.warns(EqgradWarning, match="worker died"):
        got = _prog(Tensor(x), 41).numpy()
    np.testing.assert_allclose(got, _ref(x, 41), rtol=1e-4, atol=1e-4)
    assert engine.last_plan.report.stop_reason == "worker died"
    monkeypatch.setattr(saturate.Channel, "send", real_send)
    out = Tensor(x) * 2 + 1
    np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)
    assert engine.last_plan.report.stop_reason == "completed"


def test_a_worker_that_cannot_load_egglog_says_so(tmp_path):
    """A broken or missing egglog (seen on a machine whose Python lacked it): the realize still
    gives the right numbers, and the warning and the report name the import error instead of
    guessing at the memory limit."""
    import subprocess
    import sys
    (tmp_path / "egglog").mkdir()
    (tmp_path / "egglog" / "__init__.py").write_text('raise ImportError("no egglog on this path")\n')
    child = ("import json, warnings, eqgrad\nfrom eqgrad import Tensor\n"
             "with warnings.catch_warnings(record=True) as w:\n"
             "    warnings.simplefilter('always')\n"
             "    v = float(((Tensor([1.0, 2.0]) * 2 + 1).sum()).numpy())\n"
             "r = eqgrad.engine.last_plan.report\n"
             "print(json.dumps(dict(v=v, stop=r.stop_reason, detail=r.detail, warned=[str(x.message) for x in w])))\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), root]))
    r = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["v"] == 8.0 and got["stop"] == "worker died"
    assert "cannot load egglog (ImportError: no egglog on this path" in got["detail"]
    assert any("cannot load egglog" in m for m in got["warned"]), got["warned"]


def test_kernel_that_fails_to_compile_names_kernel_device_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    import eqgrad.devices.cpu as cpu
    real = cpu.render_llvm
    monkeypatch.setattr(cpu, "render_llvm", lambda lk: real(lk).replace("ret void", "ret i32 0"))
    engine.clear_cache()
    with pytest.raises(eqgrad.CompileError, match=r"LLVM device: kernel k0 .* failed to compile.*written to") as e:
        (Tensor(np.ones((3, 3), np.float32)) * 17 + 3).realize()
    path = str(e.value).rsplit("written to ", 1)[1]
    assert os.path.exists(path) and "ret i32 0" in open(path).read()
    monkeypatch.setattr(cpu, "render_llvm", real)
    engine.clear_cache()


def test_unknown_device_is_a_clear_error():
    with pytest.raises(eqgrad.DeviceError, match="unknown device 'TPU'"):
        Tensor([1.0], device="TPU")


def test_plan_cache_is_bounded_and_clearable():
    with eqgrad.Context(PLAN_CACHE=5):
        for n in range(1, 12):
            Tensor(np.ones((n, 2), np.float32)).sum(0).realize()
        assert len(engine._plan_cache) <= 5
    engine.clear_cache()
    assert len(engine._plan_cache) == 0


# ---------------------------------------------------------------------------- a device that fails or disappears
HAS_OPENCL = "OPENCL" in DEVICES
needs_opencl = pytest.mark.skipif(not HAS_OPENCL, reason="OPENCL device unavailable (no pyopencl or no OpenCL platform)")


@pytest.fixture
def no_hang():
    """Fails the test (instead of hanging the suite) if it runs longer than 60 s."""
    def alarm(signum, frame):
        raise TimeoutError("the faulted device hung instead of raising")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _lost(routine: str):
    """The error pyopencl raises when the device is gone (status CL_DEVICE_NOT_AVAILABLE)."""
    import pyopencl as cl
    return cl.RuntimeError(cl._cl._ErrorRecord(msg="device lost", code=cl.status_code.DEVICE_NOT_AVAILABLE,
                                               routine=routine))


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


X = np.random.default_rng(3).standard_normal((8, 300)).astype(np.float32)


def _outputs(x: Tensor) -> list[Tensor]:
    """Three outputs of different shapes: a plan of at least three kernels (one per output)."""
    return [x.softmax(-1), x.sum(0), x.amax(1)]


def _outputs_ref(x: np.ndarray) -> list[np.ndarray]:
    return [_softmax_ref(x), x.sum(0), x.max(1)]


def _check(outs: list[Tensor], x: np.ndarray) -> None:
    for got, ref in zip(outs, _outputs_ref(x)):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)


@needs_opencl
def test_device_lost_mid_plan_is_a_device_error_naming_the_kernel(monkeypatch, no_hang):
    """The runtime raises on the n-th launch of a plan, for every n: one DeviceError naming the
    device and that kernel, the tensors stay unrealized (no partial result is used), LLVM still
    works meanwhile, and once the device works again the same tensors realize to the right numbers."""
    dev = eqgrad.devices.get_device("OPENCL")
    x = Tensor(X, device="OPENCL")
    x.realize()
    cp, _ = engine.plan_for([t.lazydata for t in _outputs(x)])
    names = [k.name for k in dev.rewrite(cp.plan).plan.kernels]      # (the kernels the device runs)
    assert len(names) >= 3
    real_launch = dev.launch
    for fail_at in range(1, len(names) + 1):
        outs, launches = _outputs(x), []

        def launch(knl, gsize, lsize, raws):
            launches.append(knl)
            if len(launches) == fail_at:
                raise _lost("clEnqueueNDRangeKernel")
            real_launch(knl, gsize, lsize, raws)
        monkeypatch.setattr(dev, "launch", launch)
        with pytest.raises(eqgrad.DeviceError, match=rf"OPENCL device failed launching kernel {re.escape(names[fail_at - 1])} "
                                                     r".*DEVICE_NOT_AVAILABLE - device lost.*no result") as e:
            eqgrad.realize(*outs)
        assert engine.last_plan is cp and len(launches) == fail_at and isinstance(e.value.__cause__, dev.cl.Error)
        assert not any(t.lazydata.realized for t in outs)
        _check(_outputs(Tensor(X * 2)), X * 2)                   # LLVM is unaffected
        monkeypatch.setattr(dev, "launch", real_launch)          # the device is back
        _check(outs, X)


@needs_opencl
def test_kernel_failing_after_its_launch_is_a_device_error(monkeypatch, no_hang):
    """The launches succeed but a kernel fails while running (the error surfaces at the wait)."""
    dev = eqgrad.devices.get_device("OPENCL")
    outs = _outputs(Tensor(X, device="OPENCL"))
    cp, _ = engine.plan_for([t.lazydata for t in outs])

    def synchronize():
        raise _lost("clFinish")
    monkeypatch.setattr(dev, "synchronize", synchronize)
    names = ", ".join(re.escape(k.name) for k in dev.rewrite(cp.plan).plan.kernels)   # (the kernels the device runs)
    with pytest.raises(eqgrad.DeviceError, match=rf"OPENCL device failed running kernel\(s\) {names}: "
                                                 r"RuntimeError: clFinish failed: DEVICE_NOT_AVAILABLE"):
        eqgrad.realize(*outs)
    assert not any(t.lazydata.realized for t in outs)
    monkeypatch.undo()
    _check(outs, X)


@needs_opencl
def test_device_lost_during_a_jit_replay(monkeypatch, no_hang):
    """A replayed step (no realize involved) fails the same way, and replays again once it works."""
    dev = eqgrad.devices.get_device("OPENCL")

    @eqgrad.jit
    def step(x):
        return (x * 2).softmax(-1)
    x = Tensor(X, device="OPENCL")
    for _ in range(3):                                     # run, capture, replay
        out = step(x)
    assert step.replays == 1
    np.testing.assert_allclose(out.numpy(), _softmax_ref(X * 2), rtol=1e-5, atol=1e-7)

    def launch(*a):
        raise _lost("clEnqueueNDRangeKernel")
    monkeypatch.setattr(dev, "launch", launch)
    # (the first kernel the device runs: the softmax's max and sum, one kernel with two outputs)
    with pytest.raises(eqgrad.DeviceError, match=r"OPENCL device failed launching kernel k0\+k1 .*DEVICE_NOT_AVAILABLE"):
        step(x)
    monkeypatch.undo()
    np.testing.assert_allclose(step(x).numpy(), _softmax_ref(X * 2), rtol=1e-5, atol=1e-7)
    assert step.replays == 2


@needs_opencl
def test_device_disappearing_between_realizes(monkeypatch, no_hang):
    """After a realize that worked, every runtime call fails as on a lost device: reading a realized
    tensor, creating one and realizing a new program each raise one DeviceError naming the device
    and the operation; other devices keep working; when the device is back, nothing was lost."""
    import pyopencl as cl
    dev = eqgrad.devices.get_device("OPENCL")
    y = Tensor(X, device="OPENCL") * 2 + 1
    y.realize()
    z = y.softmax(-1)                                    # pending on the device

    def gone(routine):
        def fail(*a, **kw):
            raise _lost(routine)
        return fail
    monkeypatch.setattr(cl, "Buffer", gone("clCreateBuffer"))
    monkeypatch.setattr(cl, "enqueue_copy", gone("clEnqueueReadBuffer"))
    monkeypatch.setattr(dev, "launch", gone("clEnqueueNDRangeKernel"))
    monkeypatch.setattr(dev, "synchronize", gone("clFinish"))
    with pytest.raises(eqgrad.DeviceError, match=r"OPENCL device failed copying a float32 buffer of shape "
                                                 r"\(8, 300\) to the host: RuntimeError: .*DEVICE_NOT_AVAILABLE"):
        y.numpy()
    with pytest.raises(eqgrad.DeviceError, match=r"OPENCL device failed allocating a float32 buffer of shape "
                                                 r"\(3,\) \(12 bytes\): .*clCreateBuffer failed"):
        Tensor([1.0, 2.0, 3.0], device="OPENCL")
    with pytest.raises(eqgrad.DeviceError, match=r"OPENCL device failed (allocating|launching kernel k0)"):
        z.realize()
    assert not z.lazydata.realized
    with pytest.raises(eqgrad.DeviceError, match="OPENCL device failed copying"):
        y.to("LLVM")
    w = Tensor(X, device="LLVM")                         # another device is unaffected
    np.testing.assert_allclose(w.softmax(-1).numpy(), _softmax_ref(X), rtol=1e-5, atol=1e-7)
    monkeypatch.undo()                                   # the device is back
    np.testing.assert_allclose(y.numpy(), X * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(z.numpy(), _softmax_ref(X * 2 + 1), rtol=1e-5, atol=1e-7)


@needs_opencl
def test_opencl_kernel_that_fails_to_compile_names_kernel_device_and_source(monkeypatch, tmp_path):
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    from eqgrad.devices.opencl import OpenCLRenderer
    real = OpenCLRenderer.render
    # a statement the OpenCL C compiler rejects, before the kernel's closing brace
    monkeypatch.setattr(OpenCLRenderer, "render",
                        lambda self, lk, sized=None: real(self, lk, sized).rstrip()[:-1] + "  undeclared_x = 1;\n}\n")
    engine.clear_cache()
    eqgrad.devices.get_device("OPENCL").families.clear()     # (a family built before runs without rendering)
    with pytest.raises(eqgrad.CompileError, match=r"OPENCL device: kernel k0 .* failed to compile: .*error.*"
                                                   r"its OpenCL C was written to") as e:
        (Tensor(np.ones((3, 3), np.float32), device="OPENCL") * 17 + 3).realize()
    path = str(e.value).rsplit("written to ", 1)[1]
    assert os.path.exists(path) and "__kernel void eqk(" in open(path).read()
    monkeypatch.undo()
    engine.clear_cache()
    np.testing.assert_array_equal((Tensor(np.ones((3, 3), np.float32), device="OPENCL") * 17 + 3).numpy(), 20)


@needs_opencl
def test_opencl_kernel_that_fails_among_others_is_named(monkeypatch, tmp_path):
    """A plan's new kernels are built as one program; when that build fails, each is built alone
    and the error names the one that failed (the others run once it is fixed)."""
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path))
    from eqgrad.devices.opencl import OpenCLRenderer
    real = OpenCLRenderer.render

    def render(self, lk, sized=None):
        src = real(self, lk, sized)      # the reduction kernel only: one that loops
        return src.rstrip()[:-1] + "  undeclared_y = 1;\n}\n" if "for (" in src else src
    monkeypatch.setattr(OpenCLRenderer, "render", render)
    engine.clear_cache()
    eqgrad.devices.get_device("OPENCL").families.clear()
    x = Tensor(X, device="OPENCL")
    y = (x * 3.5 + 0.25).exp2()
    z = y.sum(1, keepdim=True) + y     # a row sum and an elementwise kernel
    with pytest.raises(eqgrad.CompileError, match=r"OPENCL device: kernel k\d \(.*failed to compile: .*error.*undeclared_y"):
        z.realize()
    monkeypatch.undo()
    engine.clear_cache()
    e = np.exp2(X * np.float32(3.5) + np.float32(0.25))
    np.testing.assert_allclose(z.numpy(), e.sum(1, keepdims=True) + e, rtol=1e-5)


@needs_opencl
def test_device_lost_while_building_a_kernel(monkeypatch, no_hang):
    """Not a compile error: the runtime fails during the build (a DeviceError, not a CompileError)."""
    import pyopencl as cl

    def program(*a, **kw):
        raise _lost("clBuildProgram")
    monkeypatch.setattr(cl, "Program", program)
    engine.clear_cache()
    x = Tensor(X, device="OPENCL")
    y = (x * 3.25 - 0.125).exp2()                          # a kernel source not built before
    with pytest.raises(eqgrad.DeviceError, match=r"OPENCL device failed building kernel k0 .*DEVICE_NOT_AVAILABLE"):
        y.realize()
    monkeypatch.undo()
    np.testing.assert_allclose(y.numpy(), np.exp2(X * np.float32(3.25) - np.float32(0.125)), rtol=1e-6)
