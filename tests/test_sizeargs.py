"""Kernels whose sizes keep changing compile once (eqgrad/devices/sizeargs.py): after two sizes of
a kernel family, the next one compiles a program that reads its sizes from an argument, and every
later size runs it -- with the numbers of NumPy, and of the code compiled for that one size."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.devices import get_device
from eqgrad.devices.sizeargs import CONCRETE_SIZES, Families, Sized, split_sizes
from eqgrad.graph.loopir import INDEX, LInst, LoopKernel
from eqgrad.dtype import float32


def decode(T: int, D: int = 8, seed: int = 0) -> tuple[list[Tensor], list[np.ndarray]]:
    """One decode step over a cache of length T that grows by ``cat``: attention of one query, and
    the cache flipped and padded (index divisions whose numerators are negative at some positions:
    floor division by a size that is now a runtime value). Returns the tensors and NumPy's answers."""
    rng = np.random.default_rng(seed + T)
    cache, new, q = (rng.standard_normal(s).astype(np.float32) for s in ((1, T, D), (1, 1, D), (1, 1, D)))
    k = Tensor(cache).cat(Tensor(new), dim=1)
    att = ((Tensor(q) @ k.transpose(-1, -2)) * (1 / np.sqrt(D))).softmax(-1) @ k
    side = k.flip(1).pad(((0, 0), (2, 1), (0, 0))).reshape(1, -1).sum(1)
    kn = np.concatenate([cache, new], axis=1)
    s = q @ kn.transpose(0, 2, 1) / np.sqrt(D)
    e = np.exp(s - s.max(-1, keepdims=True))
    want_side = np.pad(kn[:, ::-1], ((0, 0), (2, 1), (0, 0))).reshape(1, -1).sum(1)
    return [att, side, k], [(e / e.sum(-1, keepdims=True)) @ kn, want_side, kn]


def run_steps(lengths) -> list[int]:
    """Realize decode steps at these cache lengths; check each against NumPy; return the kernels
    compiled per step."""
    compiled = []
    for T in lengths:
        ts, want = decode(T)
        c0 = GlobalCounters.kernels_compiled
        eqgrad.realize(*ts)
        compiled.append(GlobalCounters.kernels_compiled - c0)
        for t, w in zip(ts, want):
            np.testing.assert_allclose(t.numpy(), w, rtol=1e-5, atol=1e-5)
    return compiled


@pytest.fixture
def fresh_llvm():
    engine.clear_cache()
    gc.collect()
    get_device("LLVM").families.clear()
    yield
    engine.clear_cache()


def test_a_growing_cache_compiles_its_kernels_once_more_then_never(fresh_llvm):
    """Lengths 5 and 6 compile code of their own, 7 compiles the sized programs, and from then on a
    new length compiles nothing -- except where the new sizes change a kernel's structure (at length
    7 the total length 8 equals the head size, and the lowering shares the two constants)."""
    compiled = run_steps(range(5, 21))
    assert compiled[0] > 0 and compiled[1] > 0, compiled
    later = compiled[4:]
    assert sum(c == 0 for c in later) >= len(later) - 2 and sum(later) <= compiled[0], compiled


def test_with_size_args_off_every_length_compiles(fresh_llvm, monkeypatch):
    monkeypatch.setenv("EQGRAD_SIZE_ARGS", "0")
    compiled = run_steps(range(5, 12))
    assert all(c > 0 for c in compiled), compiled


def test_sized_code_gives_the_numbers_of_code_compiled_for_the_size(fresh_llvm, monkeypatch):
    """Float results bit for bit aside (the vectorizer may split a reduction whose trip count it no
    longer knows differently), sized and concrete code agree closely at every length."""
    got = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("EQGRAD_SIZE_ARGS", flag)
        engine.clear_cache()
        get_device("LLVM").families.clear()
        outs = []
        for T in range(3, 15):
            ts, _ = decode(T, seed=7)
            eqgrad.realize(*ts)
            outs.append([t.numpy() for t in ts])
        got[flag] = outs
    for a, b in zip(got["1"], got["0"]):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------ the bookkeeping, by hand

def kernel(extent: int, stride: int, split: int = 4, scale: float = 2.0) -> LoopKernel:
    """out[i] = scale * sum_j in[i * stride + j] for j < extent, i < split (a split loop)."""
    I = [LInst("PARAM", float32, (), 0), LInst("PARAM", float32, (), 1),
         LInst("RANGE", INDEX, (), split),                                   # 2: the split loop
         LInst("DEFACC", float32, (), 0.0),                                  # 3
         LInst("RANGE", INDEX, (), extent),                                  # 4
         LInst("CONST", INDEX, (), stride),                                  # 5
         LInst("MUL", INDEX, (2, 5)), LInst("ADD", INDEX, (6, 4)),           # 6, 7
         LInst("LOAD", float32, (1, 7)), LInst("ACCUM", None, (3, 8), "ADD"),
         LInst("ENDRANGE", None, (4,)), LInst("ACCREAD", float32, (3,)),     # 10, 11
         LInst("CONST", float32, (), scale), LInst("MUL", float32, (11, 12)),
         LInst("STORE", None, (0, 2, 13)), LInst("ENDRANGE", None, (2,))]
    return LoopKernel("eqk", [("b0", float32, True), ("b1", float32, False)], I, parallel=1)


def test_split_sizes_leaves_out_sizes_and_only_sizes():
    a, b = split_sizes(kernel(3, 5)), split_sizes(kernel(7, 9, split=100))
    assert a.skeleton == b.skeleton and hash(a.skeleton) == hash(b.skeleton)   # the split extent is the launch's
    assert a.positions == (4, 5) and a.values == (3, 5) and b.values == (7, 9)
    assert split_sizes(kernel(3, 5, scale=3.0)).skeleton != a.skeleton     # a float constant is structure


class _Program:
    def __call__(self, *ptrs: int, lo: int, hi: int) -> None: ...


def test_families_compile_concrete_first_then_one_sized_program():
    fams = Families(native={})
    progs = [_Program() for _ in range(4)]
    key = ("k",)
    shapes = [split_sizes(kernel(e, 5)) for e in (3, 4, 6, 8)]
    for i in range(CONCRETE_SIZES):
        assert fams.find(key, shapes[i]) is None and fams.plan(key, shapes[i]) is None
        fams.add(key, shapes[i], progs[i])
        assert fams.find(key, shapes[i]) is progs[i]
    sized = fams.plan(key, shapes[2])
    assert sized == {4: 0}                        # only the extent changed: one slot
    bound = fams.add_sized(key, shapes[2], sized, progs[2])
    assert isinstance(bound, Sized) and list(bound.sizes) == [6]
    hit = fams.find(key, shapes[3])
    assert isinstance(hit, Sized) and hit.program is progs[2] and list(hit.sizes) == [8]
    # a stride the sized program has as a literal: not a member; the next plan makes it an argument
    other = split_sizes(kernel(8, 7))
    assert fams.find(key, other) is None and fams.plan(key, other) == {4: 0, 5: 1}


def test_the_bookkeeping_keeps_no_loop_kernel_alive():
    """(The lowering's memo drops kernels past its bound; what families derived from them goes too.)"""
    import weakref
    fams = Families(native={})
    for extent in (3, 4):
        lk = kernel(extent, 5)
        fams.shape_of(lk)
        ref = weakref.ref(lk)
        del lk
        gc.collect()
        assert ref() is None
    assert not fams._shapes


def test_members_share_one_skeleton_object():
    """Members of a family get the same Skeleton object, so their lookups compare by identity (a
    growing KV cache compared ~200 instructions at each of 24 lookups a decode step); a kernel of
    another family keeps its own, and interning keeps no skeleton alive."""
    import weakref
    fams = Families(native={})
    lks = [kernel(e, 5) for e in (3, 4, 9)]
    shapes = [fams.shape_of(lk)[1] for lk in lks]
    assert shapes[0].skeleton is shapes[1].skeleton is shapes[2].skeleton
    assert [s.values for s in shapes] == [(3, 5), (4, 5), (9, 5)]
    other = fams.shape_of(kernel(3, 5, scale=3.0))[1]
    assert other.skeleton is not shapes[0].skeleton and other.skeleton != shapes[0].skeleton
    ref = weakref.ref(shapes[0].skeleton)
    del lks, shapes, other
    gc.collect()
    assert ref() is None
    assert all(r() is None for bucket in fams._skeletons.values() for r in bucket)


def test_a_prepare_works_out_each_kernels_structure_once(fresh_llvm, monkeypatch):
    """The LLVM device's prefetch and build passes ask for each kernel's structure (its lowering
    memo's key, the disk cache's key) several times; a prepare computes it once per kernel."""
    import eqgrad.devices as devices
    calls = []
    real = devices.kernel_structure
    monkeypatch.setattr(devices, "kernel_structure", lambda k, plan: calls.append(id(k)) or real(k, plan))
    monkeypatch.setenv("EQGRAD_THREADS", "2")
    outs, want = decode(13)
    eqgrad.realize(*outs)
    for o, w in zip(outs, want):
        np.testing.assert_allclose(o.numpy(), w, rtol=1e-5, atol=1e-5)
    plan = engine.last_plan.plan
    assert len(plan.kernels) >= 2 and calls
    assert len(calls) == len(set(calls)), "a kernel's structure was computed twice in one prepare"
    assert get_device("LLVM")._structures == {}, "the memo is the prepare's only"
