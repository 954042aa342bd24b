"""A compile long enough to hide a full garbage collection ends with one (engine/core.py
``_settled``, docs/engine.md "The garbage collector after a compile"); a short one, a resize and a
process whose collections are costly do not."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from eqgrad import Tensor, engine
from eqgrad.engine import core


@pytest.fixture
def collections(monkeypatch):
    """The full collections ``_settled`` asks for (gc.collect calls), counted, not run."""
    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(a) or 0)
    saved = list(core._LAST_FULL)
    try:
        yield calls
    finally:
        core._LAST_FULL[:] = saved


def _realize(n: int) -> np.ndarray:
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    got = (Tensor(x) * 2.0 + 1.0).sum(axis=1).numpy()
    np.testing.assert_allclose(got, (x * 2 + 1).sum(1))
    return got


def test_a_compile_that_hides_a_collection_ends_with_one(collections):
    core._LAST_FULL[0] = 1e-9                # a collection this cheap hides in any compile
    engine.clear_cache()
    _realize(5)
    assert collections == [()]
    _realize(5)                              # a cached plan: no compile, no collection
    assert collections == [()]


def test_a_resize_does_not_collect(collections):
    engine.clear_cache()
    _realize(5)
    core._LAST_FULL[0] = 1e-9
    collections.clear()
    _realize(7)                              # the same program at another size: resized
    assert collections == []


@pytest.mark.parametrize("last", [0.0, 1e4])
def test_no_collection_timed_yet_or_one_too_costly(collections, last):
    core._LAST_FULL[0] = last                # none timed in this process, or one of hours
    engine.clear_cache()
    _realize(5)
    assert collections == []


def test_with_the_collector_off_nothing_is_collected(collections):
    core._LAST_FULL[0] = 1e-9
    engine.clear_cache()
    gc.disable()
    try:
        _realize(5)
    finally:
        gc.enable()
    assert collections == []


def test_nested_compiles_collect_once_at_the_outermost(collections, monkeypatch):
    core._LAST_FULL[0] = 1e-9
    seen = []
    real = core._compile

    def inner(*a, **k):                      # a compile that compiles another (a measured extractor's candidates)
        seen.append(core._COMPILES[0])
        if len(seen) == 1:
            from eqgrad.frontend.tensor import Tensor as T
            (T(np.ones(4, np.float32)) + 3.0).numpy()
        return real(*a, **k)
    monkeypatch.setattr(core, "_compile", inner)
    engine.clear_cache()
    _realize(6)
    assert seen == [1, 2] and collections == [()]
    assert core._COMPILES == [0]


def test_a_failed_compile_leaves_the_count_closed(collections, monkeypatch):
    core._LAST_FULL[0] = 1e-9

    def fails(*a, **k):
        raise RuntimeError("the compile failed")
    monkeypatch.setattr(core, "_compile", fails)
    engine.clear_cache()
    with pytest.raises(RuntimeError, match="the compile failed"):
        _realize(4)
    assert core._COMPILES == [0] and collections == []


def test_each_full_collection_is_timed():
    core._LAST_FULL[0] = 0.0
    gc.collect(1)                            # a young collection is not timed
    assert core._LAST_FULL[0] == 0.0
    gc.collect()
    assert 0.0 < core._LAST_FULL[0] < 60.0


def test_a_fork_starts_the_child_with_no_compile_open():
    """A fork while a compile is open (in another thread of the parent): the child's compiles end
    with the rule, not inside a count that never closes there."""
    import os
    core._COMPILES[0] += 1
    try:
        pid = os.fork()
        if pid == 0:                         # the child: report and leave at once
            os._exit(0 if core._COMPILES == [0] else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        core._COMPILES[0] -= 1
    assert os.waitstatus_to_exitcode(status) == 0
