"""Kernels whose sizes keep changing compile once (eqgrad/devices/sizeargs.py): after two sizes of
a kernel family, the next one compiles a program that reads its sizes from an argument, and every
later size runs it -- with the numbers of NumPy, and of the code compiled for that one size."""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, engine
from eqgrad.devices import get_device
from eqgrad.devices.sizeargs import CONCRETE_SIZES, SPECULATE_MIN, Families, Sized, split_sizes
from eqgrad.graph.loopir import INDEX, LInst, LoopKernel
from eqgrad.dtype import float32

from conftest import DEVICES, forget_what_a_new_process_lacks


def decode(T: int, D: int = 8, seed: int = 0, device: str | None = None) -> tuple[list[Tensor], list[np.ndarray]]:
    """One decode step over a cache of length T that grows by ``cat``: attention of one query, and
    the cache flipped and padded (index divisions whose numerators are negative at some positions:
    floor division by a size that is now a runtime value). Returns the tensors and NumPy's answers."""
    rng = np.random.default_rng(seed + T)
    cache, new, q = (rng.standard_normal(s).astype(np.float32) for s in ((1, T, D), (1, 1, D), (1, 1, D)))
    k = Tensor(cache, device=device).cat(Tensor(new, device=device), dim=1)
    att = ((Tensor(q, device=device) @ k.transpose(-1, -2)) * (1 / np.sqrt(D))).softmax(-1) @ k
    side = k.flip(1).pad(((0, 0), (2, 1), (0, 0))).reshape(1, -1).sum(1)
    kn = np.concatenate([cache, new], axis=1)
    s = q @ kn.transpose(0, 2, 1) / np.sqrt(D)
    e = np.exp(s - s.max(-1, keepdims=True))
    want_side = np.pad(kn[:, ::-1], ((0, 0), (2, 1), (0, 0))).reshape(1, -1).sum(1)
    return [att, side, k], [(e / e.sum(-1, keepdims=True)) @ kn, want_side, kn]


def run_steps(lengths, device: str | None = None) -> list[int]:
    """Realize decode steps at these cache lengths; check each against NumPy; return the kernels
    compiled per step."""
    compiled = []
    for T in lengths:
        ts, want = decode(T, device=device)
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


def test_a_growing_caches_members_run_without_loop_ir_and_verify_says_so(fresh_llvm, monkeypatch):
    """Once a changed kernel's body lowers from a trace and its family has a sized program, a new
    length finds that program from the trace's holes alone (``LLVMDevice._rebound``,
    ``Families.rebound``): no loop IR is instantiated for it. Under EQGRAD_VERIFY (the suite's
    setting) the usual way is worked out beside it and must agree -- and does not where the holes
    are read wrong."""
    from eqgrad import devices
    from eqgrad.devices.sizeargs import Families
    from eqgrad.lower import trace
    dev = get_device("LLVM")
    devices._lowered.clear()           # (loop IR an earlier test kept at these sizes is used as it is)
    trace.TRACES.clear()
    run_steps(range(5, 13))                                      # traced, sized programs compiled
    r0 = dev.families.rebinds
    run_steps(range(13, 17))                                     # (verified against the usual way)
    assert dev.families.rebinds - r0 >= 4, dev.families.rebinds - r0
    made = []
    real = trace.Trace.instantiate
    monkeypatch.setattr(trace.Trace, "instantiate", lambda self, env: made.append(env) or real(self, env))
    with eqgrad.Context(VERIFY=0):
        r1 = dev.families.rebinds
        assert run_steps(range(17, 21)) == [0, 0, 0, 0]         # NumPy's answers, nothing compiled
    assert dev.families.rebinds - r1 >= 4 and made == [], (dev.families.rebinds - r1, made)
    real_rebound = Families.rebound

    def off_by_one(self, tr, env):
        r = real_rebound(self, tr, env)
        return None if r is None else (r[0], r[1] + 1)
    monkeypatch.setattr(Families, "rebound", off_by_one)
    with pytest.raises(AssertionError, match="read from its trace"):
        run_steps([21])


def test_rebinding_says_none_where_it_cannot_tell(fresh_llvm):
    """``Traces.bind`` finds no trace for sizes its guards refuse (then the lowering decides), and
    ``Families.rebound`` reads nothing for a trace whose first instance its families have not been
    through (then the instance is made)."""
    from eqgrad import devices
    from eqgrad.engine.session import current_session
    from eqgrad.lower import trace
    devices._lowered.clear()
    trace.TRACES.clear()
    run_steps(range(5, 14))
    plan = current_session()._local.last_plan.plan
    dev = get_device("LLVM")
    bound = [(k, trace.TRACES.bind(k, plan, dev.trace_key)) for k in plan.kernels]
    bound = [(k, b) for k, b in bound if b is not None]
    assert bound, "no kernel of a growing cache's step is bound to a trace"
    for k, (tr, env) in bound:
        assert dev.families.rebound(tr, env) is not None or tr.decomposed_holes(dev.families.native) is None
        assert Families(dev.families.native).rebound(tr, env) is None         # never through shape_of
        held = [tr.holds(tuple(x for _ in env)) for x in (1, 2, 10**6)]
        assert not all(held) or not tr.n_guards, (k.name, tr.n_guards)
        assert not tr.holds(tuple(0 for _ in env))       # its symbols are taken to be >= 1


def column_sums(rows: int, seed: int = 0) -> tuple[int, np.ndarray, np.ndarray]:
    """Realize ``(x * 2).sum(0)`` for x of shape (rows, 24); (kernels compiled, result, NumPy's)."""
    x = np.random.default_rng(seed + rows).standard_normal((rows, 24)).astype(np.float32)
    c0 = GlobalCounters.kernels_compiled
    out = (Tensor(x) * 2).sum(0).numpy()
    return GlobalCounters.kernels_compiled - c0, out, (x.astype(np.float64) * 2).sum(0)


def test_a_long_reduction_takes_a_new_length_without_compiling(fresh_llvm):
    """A reduction loop of SPECULATE_MIN or more iterations reads its extent at run time from the
    first compile on: the last partial batch (64 rows, then 29, then 40) compiles nothing."""
    compiled = []
    for rows in (64, 29, 40, 64):
        c, got, want = column_sums(rows)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        compiled.append(c)
    assert compiled[0] > 0 and compiled[1:] == [0, 0, 0], compiled


def test_a_short_reduction_keeps_its_literal_extent(fresh_llvm):
    """Below SPECULATE_MIN the extent stays a literal (LLVM unrolls such a loop completely): a new
    short length compiles, as before sized programs, until the family's sizes keep changing."""
    assert SPECULATE_MIN > 5
    compiled = []
    for rows in (3, 5):
        c, got, want = column_sums(rows)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        compiled.append(c)
    assert all(c > 0 for c in compiled), compiled


CHILD = textwrap.dedent("""
    import json, numpy as np
    from eqgrad import GlobalCounters, Tensor
    outs = []
    for rows in (64, 29):
        x = np.random.default_rng(rows).standard_normal((rows, 24)).astype(np.float32)
        outs.append((Tensor(x) * 2).sum(0).numpy().tolist())
    print(json.dumps(dict(compiled=GlobalCounters.kernels_compiled, lowered=GlobalCounters.lowered_disk_hits, outs=outs)))
""")


def test_a_sized_programs_members_are_read_back_by_a_second_process(tmp_path):
    """A kernel that compiled a sized program is kept on disk with its sizes (kernelcache.store_lowered):
    a second process reads it back without lowering it; a later member of the family is lowered
    again but not compiled (the object code is on disk by its source); the same bits."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, EQGRAD_CACHE_DIR=str(tmp_path), EQGRAD_DISK_CACHE="1", PYTHONPATH=str(root))
    runs = []
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["compiled"] > 0 and second["compiled"] == 0, runs
    assert second["lowered"] >= 1, runs            # the kernel that compiled the sized program
    assert second["outs"] == first["outs"]
    for rows, out in zip((64, 29), first["outs"]):
        x = np.random.default_rng(rows).standard_normal((rows, 24)).astype(np.float32)
        np.testing.assert_allclose(out, (x.astype(np.float64) * 2).sum(0), rtol=1e-5, atol=1e-5)


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
    assert a.reductions == () and split_sizes(kernel(SPECULATE_MIN, 5)).reductions == (0,)  # the RANGE at 4
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


def test_a_short_loop_keeps_its_literal_in_a_family_of_long_ones():
    """A family seen at long extents, then at a short one: the short extent stays a literal (LLVM
    unrolls and vectorizes a loop it knows the count of), in a concrete program and in a sized one
    where another size varies; once the family counts through short extents there, they are
    arguments like any other size."""
    fams = Families(native={})
    key = ("k",)
    long_a, long_b = split_sizes(kernel(20, 5)), split_sizes(kernel(24, 5))
    for sh in (long_a, long_b):
        fams.add(key, sh, _Program())
    short = split_sizes(kernel(6, 5))
    assert short.short == (0,) and long_a.short == ()
    assert fams.plan(key, short) is None                 # only the short extent differs: concrete
    fams.add(key, short, _Program())
    other_stride = split_sizes(kernel(6, 7))
    assert fams.plan(key, other_stride) == {5: 0}        # the stride is an argument, the extent not
    bound = fams.add_sized(key, other_stride, {5: 0}, _Program())
    assert list(bound.sizes) == [7]
    assert fams.find(key, split_sizes(kernel(7, 9))) is None     # another extent: not a member
    assert fams.plan(key, split_sizes(kernel(7, 9))) == {4: 0, 5: 1}   # 6 was seen: 7 is counted


def test_a_short_row_after_long_ones_runs_code_with_its_literal_length(fresh_llvm, capsys):
    """Softmax over rows of 64, 128, then 15 in one process: the third plan is resized and lowered
    from a trace, and its sized program keeps the rows' length of 15 a literal."""
    rng = np.random.default_rng(0)
    for r in (64, 128, 15):
        x = rng.standard_normal((6, r, r)).astype(np.float32)
        with eqgrad.Context(DEBUG=4 if r == 15 else 0):
            got = (Tensor(x) * 0.5).softmax(-1).numpy()
        e = np.exp(x * 0.5 - (x * 0.5).max(-1, keepdims=True))
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    out = capsys.readouterr().out
    assert "sizes are arguments" in out                   # a sized program, as before
    assert "icmp slt i64 %r" in out and ", 15\n" in out  # with loops of a literal 15


def test_a_long_reduction_is_sized_from_the_first_compile_and_the_programs_are_kept_apart():
    """The first member of a family with a long reduction loop compiles sized in that extent; a
    member that differs in a literal (a stride) compiles its own, and both stay found."""
    fams = Families(native={})
    key = ("k",)
    a, b, c = (split_sizes(kernel(e, s)) for e, s in ((64, 5), (29, 7), (40, 5)))
    assert fams.plan(key, a) == {4: 0} and fams.plan(key, a, speculate=False) is None
    pa, pb = _Program(), _Program()
    fams.add_sized(key, a, {4: 0}, pa)
    assert fams.find(key, b) is None and fams.plan(key, b) == {4: 0}     # one other size seen: literal stride
    fams.add_sized(key, b, {4: 0}, pb)
    hit_c, hit_b = fams.find(key, c), fams.find(key, split_sizes(kernel(50, 7)))
    assert hit_c.program is pa and list(hit_c.sizes) == [40]
    assert hit_b.program is pb and list(hit_b.sizes) == [50]


def test_a_traced_instance_keeps_the_literal_of_a_long_reduction_its_trace_holds_fixed():
    """An untraced family's sized program reads its long reduction extents at run time too (the
    speculation of its first programs: a new batch size, whose extents the family's other kernels
    did not vary, compiles nothing); an instance of a trace reads exactly its trace's sizes, so a
    long reduction extent that the trace holds fixed (a head dim, while a cache's length grows) is
    a literal in its program."""
    import dataclasses
    fams = Families(native={})
    key = ("k",)
    for stride in (5, 7):
        sh = split_sizes(kernel(64, stride))
        assert sh.reductions == (0,) and fams.plan(key, sh) == {4: 0}
        fams.add_sized(key, sh, {4: 0}, _Program())
    third = split_sizes(kernel(64, 9))
    assert fams.plan(key, third) == {4: 0, 5: 1}                    # untraced: speculated, and the stride
    assert fams.plan(key, dataclasses.replace(third, traced=(1,))) == {5: 0}     # traced: the stride alone


def test_an_instance_of_a_trace_compiles_sized_in_its_symbols_at_once():
    """A loop kernel instantiated from a trace (its body's sizes keep changing: lower/trace.py)
    that starts a family -- a growing cache traced again past a lane multiple -- compiles a sized
    program with the trace's sizes as arguments at once, not CONCRETE_SIZES programs of literals
    first; a short loop's extent among them stays a literal, as in any sized program, and so does a
    long reduction's extent that the trace holds fixed (no speculation: the trace says what varies)."""
    import dataclasses
    fams = Families(native={})
    key = ("k",)
    sh = split_sizes(kernel(3, 5))
    assert fams.plan(key, sh) is None                                        # not traced: literals
    traced = dataclasses.replace(sh, traced=(0, 1))
    assert traced.short == (0,) and fams.plan(key, traced) == {5: 0}         # the stride, not the short extent
    long_traced = dataclasses.replace(split_sizes(kernel(SPECULATE_MIN, 5)), traced=(1,))
    assert long_traced.reductions == (0,)
    assert fams.plan(("j",), long_traced) == {5: 0}          # a long reduction the trace holds fixed: a literal


def test_a_member_that_shares_a_live_skeleton_keeps_its_long_reductions():
    """shape_of gives a family's members one Skeleton object; the member that takes the live one
    keeps its reduction loops' positions (they were dropped with the skeleton swap, so a later
    member's long extents compiled as literals)."""
    fams = Families(native={})
    first, second = kernel(64, 5), kernel(40, 5)
    _, a = fams.shape_of(first)
    _, b = fams.shape_of(second)
    assert b.skeleton is a.skeleton
    assert a.reductions == b.reductions == (0,) == split_sizes(second).reductions


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


# ------------------------------------------------------------------ OpenCL and CUDA: sized C sources

CSTYLE = [d for d in ("OPENCL", "CUDA") if d in DEVICES]
needs_cstyle = pytest.mark.skipif(not CSTYLE, reason="no OpenCL platform or CUDA GPU")


@pytest.fixture(params=CSTYLE)
def fresh_cstyle(request):
    forget_what_a_new_process_lacks()           # (the lowered loop IR and traces of the test before too)
    yield request.param
    engine.clear_cache()


@needs_cstyle
def test_cstyle_a_growing_cache_compiles_its_kernels_once_more_then_never(fresh_cstyle):
    """As on the CPU: a decode step's kernels build programs for the first lengths, then a sized
    program per family, and from then on a new length builds nothing (each PoCL build ~85 ms: a
    growing cache's step took ~420 ms on OpenCL, now ~3 ms; on CUDA each build is an nvcc run)."""
    compiled = run_steps(range(5, 21), device=fresh_cstyle)
    assert compiled[0] > 0 and compiled[1] > 0, compiled
    later = compiled[5:]
    assert sum(c == 0 for c in later) >= len(later) - 2 and sum(later) <= compiled[0], compiled


@needs_cstyle
def test_cstyle_a_growing_cache_lowers_from_traces_of_its_own_lowering(fresh_cstyle, monkeypatch):
    """Its kernels' loop IR comes from traces (lower/trace.py) of the device's own lowering, kept
    apart from the CPU's by the device's capabilities (a GPU's: no register blocks; a CPU OpenCL's:
    row arrays in a work-item's private memory, sized to the row, not a thread's stack)."""
    from eqgrad.graph.caps import CPU
    from eqgrad.lower import trace
    dev = get_device(fresh_cstyle)
    assert dev.caps != CPU and not dev.caps.row_arrays_full
    h0 = trace.TRACES.hits
    run_steps(range(5, 15), device=fresh_cstyle)
    assert trace.TRACES.hits > h0
    assert any(len(key) == 2 and isinstance(key[1], type(dev.caps)) and key[1] == dev.caps
               for key in trace.TRACES._bodies)


def _cases(n: int, rng: np.random.Generator) -> list[tuple[Callable[..., Tensor], Callable[..., np.ndarray], list[np.ndarray]]]:
    """Programs whose kernels' sizes change with ``n``, covering the launch forms of the C-style
    renderer (CStyleRenderer.launch): a grid whose extents are not multiples of the group (its
    bounds check), more than two parallel loops (delinearized from one id), a long reduction done
    by a work-group, floor division and modulo by sizes."""
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    a, b, c, d = f(3, n, 5, 7), f(n, 300), f(n + 2, 9), f(2 * n + 1)
    return [
        (lambda x: (x.permute(2, 0, 3, 1) * 2 + 1).exp2(), lambda x: np.exp2(x.transpose(2, 0, 3, 1) * 2 + 1), [a]),
        (lambda x: x.sum(1), lambda x: x.sum(1), [b]),                                   # rows: one group each
        (lambda x: x.sum(0), lambda x: x.sum(0), [b]),
        (lambda x: x.flip(0).pad(((1, 2), (0, 0))).reshape(-1, 3).amax(1),
         lambda x: np.pad(x[::-1], ((1, 2), (0, 0))).reshape(-1, 3).max(1), [c]),
        (lambda x: x.reshape(1, -1).expand(3, -1).T.contiguous() * 3,
         lambda x: np.broadcast_to(x.reshape(1, -1), (3, x.size)).T * 3, [d]),
    ]


@needs_cstyle
def test_cstyle_sized_programs_give_numpys_numbers_at_every_size(fresh_cstyle, monkeypatch):
    """Each case at six sizes (the last ones run the families' sized programs), against NumPy and
    against the code built for each size alone (EQGRAD_SIZE_ARGS=0)."""
    dev = fresh_cstyle
    got: dict[str, list] = {}
    for flag in ("1", "0"):
        monkeypatch.setenv("EQGRAD_SIZE_ARGS", flag)
        engine.clear_cache()
        get_device(dev).families.clear()
        outs = []
        for n in (4, 6, 9, 13, 20, 33):
            rng = np.random.default_rng(n)
            for fn, ref, xs in _cases(n, rng):
                out = fn(*[Tensor(x, device=dev) for x in xs]).numpy()
                np.testing.assert_allclose(out, ref(*xs), rtol=1e-5, atol=1e-5)
                outs.append(out)
        got[flag] = outs
        sized = sum(bool(f.sized) for f in get_device(dev).families._items.values())
        assert (sized > 0) == (flag == "1"), sized
    for x, y in zip(got["1"], got["0"]):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


@needs_cstyle
def test_cstyle_sized_source_reads_its_sizes_from_an_argument(fresh_cstyle):
    """The renderer's sized form: the positions it is given are ``sz[slot]`` (a loop's extent, an
    index constant, a work-item's bounds check and its delinearization), the argument is last."""
    dev = get_device(fresh_cstyle)
    r = dev.renderer
    lk = kernel(40, 5, split=7)
    dk, shape = dev.families.shape_of(lk)
    assert shape.values == (7, 40, 5)                   # the work-items' extent is a size here
    sized = {p: j for j, p in enumerate(shape.positions)}
    src = r.render(dk, sized)
    assert f"const {r.index_type}* {r.restrict} sz)" in src and all(f"sz[{j}]" in src for j in range(3))
    assert "40" not in src and r.render(dk) != src
    if "EXP2" not in r.code_for_op:        # (CUDA renders every op natively: nothing is decomposed)
        with pytest.raises(ValueError, match="decomposed"):
            r.render(_needs_decomposing(), {2: 0})


def _needs_decomposing() -> LoopKernel:
    I = [LInst("PARAM", float32, (), 0), LInst("PARAM", float32, (), 1), LInst("RANGE", INDEX, (), 4),
         LInst("LOAD", float32, (1, 2)), LInst("EXP2", float32, (3,)), LInst("STORE", None, (0, 2, 4)),
         LInst("ENDRANGE", None, (2,))]
    return LoopKernel("eqk", [("b0", float32, True), ("b1", float32, False)], I, parallel=1)
