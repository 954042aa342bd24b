"""The device's rewrites as a named stage (Device.rewrite -> DevicePlan): what the LLVM device does to
an extracted plan before it lowers it -- full reductions split into parallel partials, contractions
handed to the BLAS with the ops after them split off -- is one step with a line per rewrite, shown
by explain() and DEBUG=3, and the plan it runs is the one it describes."""
import numpy as np
import pytest

import eqgrad
from eqgrad import Tensor, engine
from eqgrad.devices import DevicePlan, blas, get_device
from conftest import blas_always_pays

rng = np.random.default_rng(0)


def _t(*shape, device="LLVM"):
    return Tensor(rng.standard_normal(shape).astype(np.float32), device=device)


def test_a_full_sum_is_split_into_partials_on_two_threads(monkeypatch, capsys):
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    x = _t(2048, 1024)
    s = x.sum()
    ex = eqgrad.explain(s)
    dp = ex.device_plan()
    assert isinstance(dp, DevicePlan) and len(dp.plan.kernels) == len(ex.plan.kernels) + 1
    assert len(dp.scratch) == 1 and "parallel partials" in dp.notes[0]
    assert "device stage (LLVM): 1 rewrite(s), 2 kernel(s) run" in str(ex)
    np.testing.assert_allclose(s.numpy(), x.numpy().astype(np.float64).sum(), rtol=1e-4)
    monkeypatch.setenv("DEBUG", "3")
    capsys.readouterr()
    y = _t(1024, 2048)                     # planned and prepared under DEBUG=3
    np.testing.assert_allclose(y.sum().numpy(), y.numpy().astype(np.float64).sum(), rtol=1e-4)
    assert "device stage (LLVM): 1 rewrite(s)" in capsys.readouterr().out


def test_one_thread_and_no_blas_leave_the_plan_as_extracted(monkeypatch):
    monkeypatch.setenv("EQGRAD_THREADS", "1")
    monkeypatch.setenv("EQGRAD_BLAS", "0")
    ex = eqgrad.explain(_t(2048, 1024).sum())
    dp = ex.device_plan()
    assert dp.plan is ex.plan and dp.notes == [] and dp.scratch == []
    assert "device stage (LLVM): the plan as extracted" in str(ex)


def test_a_contraction_with_an_epilogue_goes_to_the_blas_in_its_own_kernel(monkeypatch):
    """Whether a contraction pays on the BLAS is measured on the machine; here it always does (as
    tests/test_blas.py's fixture), so the test does not depend on the host's speed."""
    if blas.blas() is None:
        pytest.skip("no BLAS library found")
    monkeypatch.setenv("EQGRAD_BLAS", "1")
    blas_always_pays(monkeypatch)
    a, b = _t(256, 256), _t(256, 256)
    y = (a @ b).relu()
    dp = eqgrad.explain(y).device_plan()
    assert any("to the BLAS" in n and "split off" in n for n in dp.notes), dp.notes
    assert len(dp.plan.kernels) == 2
    np.testing.assert_allclose(y.numpy(), np.maximum(a.numpy() @ b.numpy(), 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", ["NUMPY"])
def test_devices_without_rewrites_describe_the_plan_as_extracted(device):
    ex = eqgrad.explain(_t(64, 64, device=device).sum())
    assert get_device(device).rewrite(ex.plan).plan is ex.plan
    assert f"device stage ({device}): the plan as extracted" in str(ex)
