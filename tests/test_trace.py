"""A kernel body whose sizes keep changing is lowered once with its sizes as symbols, and each later
size vector instantiates that trace when the guards it recorded hold (eqgrad/lower/trace.py): the
loop IR must be the one the lowering gives for those sizes, in every case the corpus covers, and a
guard that fails must fall back to the lowering."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import eqgrad
from eqgrad import GlobalCounters, Tensor, devices, engine
from eqgrad.devices import get_device
from eqgrad.graph.interp import run_loop
from eqgrad.graph.loopir import LoopKernel
from eqgrad.lower import symbolic, trace
from eqgrad.lower.lowering import lower_kernel
from eqgrad.graph.sizes import body_sizes, with_sizes
from eqgrad.lower.trace import Sym, Traces, TraceError, _Recorder
import eqgrad.nn.functional as F

from conftest import forget_what_a_new_process_lacks


# ------------------------------------------------------------------ the numbers themselves

def test_a_sym_computes_like_its_value_and_records_what_is_observed():
    rec = _Recorder()
    n = Sym(12, "s0", 0, rec)
    m = (n + 4) * 2 // 3 - n % 5
    assert isinstance(m, Sym) and m.v == (12 + 4) * 2 // 3 - 12 % 5
    assert eval(f"lambda s0: {m.e}")(12) == m.v and eval(f"lambda s0: {m.e}")(40) == (40 + 4) * 2 // 3 - 40 % 5
    assert not rec.guards                                   # arithmetic observes nothing
    assert (n < 16) is True and (n >= 13) is False and bool(n - 12) is False
    assert bool(n) is True and n > 0                        # a symbol is >= 1 (Trace.holds): nothing learnt
    assert rec.guards == {"s0<16": True, "s0>=13": False, "(s0+-12)!=0": False}
    assert list(range(n)) == list(range(12))                 # a C-level use of the value specializes
    assert rec.guards["s0==12"] is True
    assert hash(n) == hash(12) and "12" not in repr(n)       # repr shows the expression, not the value
    assert n * 0 == 0 and type(n * 0) is int and n * 1 is n and n + 0 is n
    assert isinstance(n / 4, float) and n / 4 == 3.0         # a float of a size is a value: specialized


def test_sizes_of_different_traces_do_not_mix():
    a, b = Sym(3, "s0", 0, _Recorder()), Sym(3, "s0", 0, _Recorder())
    with pytest.raises(TraceError):
        a + b
    assert (a == b) is False


def test_an_expression_too_deep_becomes_its_value():
    """A floor division that does not come out exact nests (a polynomial does not: ``x * 3 + 1``
    stays one polynomial, however often it is applied)."""
    rec = _Recorder()
    x = Sym(10 ** 30, "s0", 0, rec)
    for _ in range(trace.MAX_DEPTH + 5):
        x = (x * 3 + 1) // 2 if isinstance(x, Sym) else x
    assert type(x) is int
    assert any(r for c, r in rec.guards.items() if c.endswith(f"=={x}") or "==" in c)
    y = Sym(1, "s0", 0, _Recorder())
    for _ in range(trace.MAX_DEPTH + 5):
        y = y * 3 + 1
    assert isinstance(y, Sym) and eval(f"lambda s0: {y.e}")(1) == y.v and not y.t.guards


def test_a_syms_polynomial_folds_the_identities_of_index_arithmetic():
    """Canonical polynomials: what is the same at every value of the symbols is a plain int and
    records nothing; a division by a size folds under the guard that makes it exact."""
    rec = _Recorder()
    n, m = Sym(12, "s0", 0, rec), Sym(5, "s1", 0, rec)
    assert (n * 64 + m) - (m + 64 * n) == 0 and type(n - n) is int
    assert (n * 64 + 10) // 64 is not None and ((n * 64 + 10) // 64).e == "s0"
    assert (64 * n) % 64 == 0 and (n + 1) > n and not rec.guards
    assert (16 * n) // n == 16 and 0 // n == 0 and (512 * n - 2) // (192 * n) == 2 and not rec.guards
    assert (16 * n + 3) % n == 3 and 1 % n == 1
    assert rec.guards == {"s0>3": True, "s0>1": True}
    assert ((n * m) // m).e == "s0" and ((n * m) // (2 * m)).v == 6
    rec = _Recorder()
    k = Sym(2, "s0", 0, rec)
    r = 5 % k                                                 # at s0 = 2: not folded
    assert isinstance(r, Sym) and r.v == 1 and rec.guards == {"s0>5": False}
    fs = [lambda a, b: (a * 7 + b) // 3 - a % 4, lambda a, b: (a * b + 2 * b) % (b + 1),
          lambda a, b: (3 * a + 2) // a + (a * a - 1) // (a + 1), lambda a, b: -(a - 2 * b) // 5]
    rng = np.random.default_rng(0)
    for _ in range(300):                     # random expressions of index arithmetic's operations
        fs.append(_random_size_expression(rng, 4))
    for f in fs:
        for at in ((9, 4), (4, 9), (1, 1), (64, 3)):
            rec = _Recorder()
            try:
                got = f(Sym(at[0], "s0", 0, rec), Sym(at[1], "s1", 0, rec))
            except ZeroDivisionError:
                continue
            assert (got.v if isinstance(got, Sym) else got) == f(*at)
            fn = eval(f"lambda s0, s1: {got.e}") if isinstance(got, Sym) else (lambda s0, s1: got)
            check = eval(f"lambda s0, s1: {' and '.join(f'({c}) == {r}' for c, r in rec.guards.items()) or 'True'}")
            for a in range(1, 24):
                for b in range(1, 24):
                    try:
                        want, holds = f(a, b), check(a, b)
                    except ZeroDivisionError:
                        continue
                    if holds:
                        assert fn(a, b) == want, (a, b, got, at)


def _random_size_expression(rng, depth: int):
    """A random function of two sizes built from +, -, *, // and % with small constants."""
    if depth == 0 or rng.random() < 0.2:
        leaf = int(rng.integers(0, 3))
        c = int(rng.integers(-3, 9))
        return (lambda a, b: a) if leaf == 0 else (lambda a, b: b) if leaf == 1 else (lambda a, b: c)
    x, y = _random_size_expression(rng, depth - 1), _random_size_expression(rng, depth - 1)
    op = ["+", "-", "*", "//", "%"][int(rng.integers(0, 5))]
    if op in ("//", "%") and rng.random() < 0.5:
        k = int(rng.integers(1, 70))
        return (lambda a, b: x(a, b) // k) if op == "//" else (lambda a, b: x(a, b) % k)
    return {"+": lambda a, b: x(a, b) + y(a, b), "-": lambda a, b: x(a, b) - y(a, b),
            "*": lambda a, b: x(a, b) * y(a, b), "//": lambda a, b: x(a, b) // y(a, b),
            "%": lambda a, b: x(a, b) % y(a, b)}[op]


# ------------------------------------------------------------------ the corpus: every size, the lowering's own IR

def _decode(T: int) -> list[Tensor]:
    rng = np.random.default_rng(T)
    D = 8
    cache, new, q = (Tensor(rng.standard_normal(s).astype(np.float32)) for s in ((1, T, D), (1, 1, D), (1, 1, D)))
    k = cache.cat(new, dim=1)
    att = ((q @ k.transpose(-1, -2)) * (1 / np.sqrt(D))).softmax(-1) @ k
    side = k.flip(1).pad(((0, 0), (2, 1), (0, 0))).reshape(1, -1).sum(1)
    return [att, side, k]


def _decode_attention(T: int) -> np.ndarray:
    """NumPy's answer for ``_decode(T)``'s attention (its inputs drawn again)."""
    rng = np.random.default_rng(T)
    cache, new, q = (rng.standard_normal(s).astype(np.float32) for s in ((1, T, 8), (1, 1, 8), (1, 1, 8)))
    kn = np.concatenate([cache, new], axis=1)
    s = q @ kn.transpose(0, 2, 1) / np.sqrt(8)
    e = np.exp(s - s.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ kn


def _matmul(n: int) -> list[Tensor]:
    rng = np.random.default_rng(n)
    a, b = (Tensor(rng.standard_normal(s).astype(np.float32)) for s in ((n, 24), (24, n + 3)))
    return [(a @ b).relu()]


def _norms(n: int) -> list[Tensor]:
    x = Tensor(np.random.default_rng(n).standard_normal((n, 40)).astype(np.float32))
    return [x.softmax(-1), F.layer_norm(x, (40,)), (x * 2).sum(0), x.T.amax(1)]


def _conv(n: int) -> list[Tensor]:
    rng = np.random.default_rng(n)
    x = Tensor(rng.standard_normal((2, 3, n, n + 1)).astype(np.float32))
    w = Tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    return [F.conv2d(x, w, padding=1).relu(), x.reshape(2, 3, -1).mean(-1)]


CORPUS = {"decode": (_decode, [5, 6, 7, 8, 9, 13, 16, 17, 31, 32, 33, 64]),
          "matmul": (_matmul, [5, 6, 7, 9, 16, 17, 29, 32, 33, 48]),
          "norms": (_norms, [3, 4, 5, 7, 8, 15, 16, 17, 100]),
          "conv": (_conv, [4, 5, 6, 7, 8, 11, 16])}


def _plans(make, sizes) -> list:
    out = []
    for n in sizes:
        ts = make(n)
        eqgrad.realize(*ts)
        out.append(engine.last_plan.plan)
    return out


def _runs_alike(lk, ref, k, plan, seed: int = 0) -> None:
    """Both loop kernels, run by the (bounds-checked) loop-IR interpreter on the same inputs, write
    the same output."""
    rng = np.random.default_rng(seed)
    bufs = [rng.standard_normal(plan.buffers[b][0]).astype(plan.buffers[b][1].np).reshape(-1) for b in (k.out, *k.inputs)]
    a, b = [x.copy() for x in bufs], [x.copy() for x in bufs]
    run_loop(lk, a)
    run_loop(ref, b)
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_a_traced_body_lowers_to_the_loop_ir_of_its_sizes(name):
    """Instruction for instruction, except where the lowering at those sizes shares two equal
    constants that the trace keeps apart (a size that happens to equal another number: the decode
    step's total length 8 and its head size 8) -- the same program, one instruction longer."""
    make, sizes = CORPUS[name]
    tr = Traces()
    plans = _plans(make, sizes)
    checked, unshared = 0, 0
    for plan in plans:
        for k in plan.kernels:
            lk = tr.lower(k, plan, lower_kernel)
            ref = lower_kernel(k, plan)
            assert (lk.params, lk.parallel, lk.vector_lanes, lk.loop_vectorize) == \
                   (ref.params, ref.parallel, ref.vector_lanes, ref.loop_vectorize)
            if lk.insts != ref.insts:
                assert lk.__dict__.get("traced") is not None and len(lk.insts) > len(ref.insts), k.ast.render()
                _runs_alike(lk, ref, k, plan)
                unshared += 1
            checked += 1
    assert tr.failed == 0
    assert tr.traced >= 1 and tr.hits >= tr.traced, (tr.traced, tr.hits)   # lowered once, then instantiated
    assert checked > tr.hits and unshared <= 2, unshared


def test_a_size_affine_in_another_shares_its_symbol_and_the_trace_checks_it():
    """The padded convolution's sizes n, n + 1, 4n + 8, ... are one symbol and functions of it; a
    size vector that breaks one of those functions gets no instance (it would lower as usual)."""
    make, sizes = CORPUS["conv"]
    tr = Traces()
    plans = _plans(make, sizes[:4])
    for plan in plans:
        for k in plan.kernels:
            tr.lower(k, plan, lower_kernel)
    traced = [(t, k, plan) for plan in plans[3:] for k in plan.kernels
              for t in tr._bodies[body_sizes(k, plan)[0]].traces if t.related]
    assert traced, "no trace relates a size to another's symbol"
    for t, k, plan in traced:
        sizes_now = body_sizes(k, plan)[1]
        env = t.env(sizes_now)
        assert env is not None and len(t.groups) < len(set(t.related) | {p for g in t.groups for p in g})
        p, (j, a, b) = next(iter(t.related.items()))
        broken = list(sizes_now)
        broken[p] += 1
        assert t.env(tuple(broken)) is None


def test_an_instantiated_kernel_computes_what_the_lowered_one_does():
    """Run both in the loop-IR interpreter (bounds-checked) on the same buffers."""
    tr = Traces()
    plans = _plans(_decode, [5, 6, 7, 11, 12, 20])
    ran = 0
    for plan in plans[3:]:
        for k in plan.kernels:
            lk = tr.lower(k, plan, lower_kernel)
            if lk.__dict__.get("traced") is None:
                continue
            _runs_alike(lk, lower_kernel(k, plan), k, plan, ran)
            ran += 1
    assert ran >= 3


def test_a_guard_that_fails_falls_back_to_the_lowering():
    """Lanes: 16 of a last axis that 16 divides, fewer otherwise -- a trace made at 17, 18, 19
    columns does not apply at 32, which is traced again there (the body's trace was instantiated at
    20: ``test_a_body_whose_traces_paid_is_traced_again_at_once_where_none_holds``) or lowered as
    usual, the result its own IR either way."""
    tr = Traces()
    for n in (17, 18, 19, 20, 32, 21):
        eqgrad.realize(*_matmul(n - 3))
        plan = engine.last_plan.plan
        for k in plan.kernels:
            lk = tr.lower(k, plan, lower_kernel)
            assert lk.insts == lower_kernel(k, plan).insts
    assert tr.traced >= 1 and tr.hits >= 1


def test_traced_expressions_are_never_handed_to_a_plain_lowering():
    tr = Traces()
    plans = _plans(_decode, [5, 6, 7, 8])
    for plan in plans:
        for k in plan.kernels:
            tr.lower(k, plan, lower_kernel)
    assert tr.traced >= 1
    for key in list(symbolic._INTERNED):
        if not (len(key) == 2 and key[1] == "traced"):
            assert not trace._has_sym(key), key
    for plan in plans:             # the same sizes lowered plainly: no Sym anywhere in their IR
        for k in plan.kernels:
            lk = lower_kernel(k, plan)
            assert not any(trace._has_sym(x.arg) for x in lk.insts)


def test_body_sizes_keeps_the_structure_apart_from_the_sizes():
    eqgrad.realize(*_decode(5))
    p5 = engine.last_plan.plan
    eqgrad.realize(*_decode(9))
    p9 = engine.last_plan.plan
    s5 = {body_sizes(k, p5)[0]: body_sizes(k, p5)[1] for k in p5.kernels}
    s9 = {body_sizes(k, p9)[0]: body_sizes(k, p9)[1] for k in p9.kernels}
    assert s5.keys() == s9.keys()
    assert any(s5[k] != s9[k] for k in s5)
    for k in p5.kernels:           # rebuilt with its own sizes, a body is the same body
        sk, splan = with_sizes(k, p5, list(body_sizes(k, p5)[1]))
        assert sk.ast.render() == k.ast.render()
        assert [splan.buffers[b] for b in (k.out, *k.inputs)] == [p5.buffers[b] for b in (k.out, *k.inputs)]


def _new_process() -> None:
    """What a new process starts without: plans, lowered loop IR, traces, size families."""
    forget_what_a_new_process_lacks()
    gc.collect()


def _one_query(T: int, heads: int = 2, hd: int = 64) -> tuple[Tensor, np.ndarray]:
    """A decode step's attention: one query a head over a cache of T positions, and NumPy's answer."""
    rng = np.random.default_rng(T)
    q = rng.standard_normal((1, heads, 1, hd)).astype(np.float32)
    k, v = (rng.standard_normal((1, heads, T, hd)).astype(np.float32) for _ in range(2))
    s = q @ k.transpose(0, 1, 3, 2) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    return ((Tensor(q) @ Tensor(k).transpose(-2, -1)) * 0.125).softmax(-1) @ Tensor(v), (p / p.sum(-1, keepdims=True)) @ v


def test_a_lone_rows_arrays_keep_one_trace_and_one_program_as_the_cache_doubles():
    """On the CPU a lone row's row-stash array holds ``ROW_STASH_MAX`` floats whatever the row
    (lower/indexing.py ``row_array_size``), so a decode step's attention kernel, once traced, is
    neither traced again nor compiled when its cache passes 16 or 32 positions: with the power of
    two at or above the row, each doubling was another band, another trace and another program."""
    _new_process()
    seen = []
    for T in range(12, 48):
        c0, t0 = GlobalCounters.kernels_compiled, trace.TRACES.traced
        out, want = _one_query(T)
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
        seen.append((T, GlobalCounters.kernels_compiled - c0, trace.TRACES.traced - t0))
    assert sum(t for _, _, t in seen) >= 1, seen                      # traced
    assert all(c == 0 and t == 0 for T, c, t in seen if T >= 16), seen


def test_the_device_lowers_a_growing_cache_from_traces(monkeypatch):
    _new_process()                     # (an earlier test in this process may have lowered these sizes)
    h0 = trace.TRACES.hits
    for T in range(5, 20):
        ts = _decode(T)
        eqgrad.realize(*ts)
    assert trace.TRACES.hits - h0 >= 10
    # the answers are still NumPy's (a traced kernel runs the sized program with its sizes)
    np.testing.assert_allclose(ts[0].numpy(), _decode_attention(19), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("EQGRAD_SIZE_ARGS", "0")            # off with sized programs
    h1 = trace.TRACES.hits
    for T in range(20, 24):
        eqgrad.realize(*_decode(T))
    assert trace.TRACES.hits == h1


def test_the_device_stage_does_not_ask_a_traced_body_for_a_pack_at_every_step(monkeypatch):
    """The device stage asks each new kernel body whether packing an operand gives it register lanes
    (``lane_pack``, ``row_pack``: dry runs of its schedule; a decode step's attention fused into its
    output projection spent 3.5 ms a step there). A growing cache's kernels are new bodies at every
    step: where a traced body's structure had no pack at sizes within MEASURED_SPAN x, it is not
    asked again, and the answers stay NumPy's."""
    from eqgrad.devices import cpustage
    _new_process()
    monkeypatch.setattr(get_device("LLVM").stage, "_no_pack", {}, raising=False)
    asked: list[int] = []
    for name in ("lane_pack", "row_pack"):
        real = getattr(cpustage, name)
        monkeypatch.setattr(cpustage, name, lambda root, o, real=real: (asked.append(1), real(root, o))[1])
    late = 0
    for T in range(5, 20):
        before = len(asked)
        ts = _decode(T)
        eqgrad.realize(*ts)
        if T >= 12:
            late += len(asked) - before
    assert asked and late == 0, (len(asked), late)
    np.testing.assert_allclose(ts[0].numpy(), _decode_attention(19), rtol=1e-5, atol=1e-5)


def test_a_growing_cache_is_traced_where_every_length_is_on_disk(tmp_path, monkeypatch):
    """A process that finds every size vector of a body on disk (kept by earlier processes that
    did not trace it: here with sized programs off) still traces the structure once its sizes keep
    changing, instead of reading each new length's kernels back from disk at every step."""
    monkeypatch.setenv("EQGRAD_DISK_CACHE", "1")
    monkeypatch.setenv("EQGRAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EQGRAD_SIZE_ARGS", "0")
    _new_process()
    for T in range(5, 14):
        eqgrad.realize(*_decode(T))
    monkeypatch.delenv("EQGRAD_SIZE_ARGS")
    _new_process()
    d0 = GlobalCounters.lowered_disk_hits
    for T in range(5, 14):
        ts = _decode(T)
        eqgrad.realize(*ts)
    assert GlobalCounters.lowered_disk_hits > d0           # the first lengths: from disk
    assert trace.TRACES.traced >= 1 and trace.TRACES.hits >= 5, (trace.TRACES.traced, trace.TRACES.hits)
    np.testing.assert_allclose(ts[0].numpy(), _decode_attention(13), rtol=1e-5, atol=1e-5)
    _new_process()


def _template(rng: np.random.Generator):
    """A random chain of movement ops (and maybe a sum) over an input whose second axis has size
    ``n``: a function of n giving the tensor, valid for every n >= 4."""
    rank = int(rng.integers(2, 4))
    fixed = [int(rng.integers(1, 4)) for _ in range(rank)]
    steps = []
    for _ in range(int(rng.integers(2, 6))):
        op = rng.choice(["permute", "flip", "pad", "shrink", "merge", "sum", "mul"])
        steps.append((op, int(rng.integers(0, 1 << 30))))

    def make(n: int) -> Tensor:
        shape = list(fixed)
        shape[1] = n
        x = Tensor(np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32).reshape(shape))
        for op, seed in steps:
            r = np.random.default_rng(seed)
            nd = len(x.shape)
            if op == "permute":
                x = x.permute(*[int(a) for a in r.permutation(nd)])
            elif op == "flip":
                x = x.flip(int(r.integers(0, nd)))
            elif op == "pad":
                a = int(r.integers(0, nd))
                x = x.pad(tuple((int(r.integers(0, 3)), int(r.integers(0, 3))) if d == a else (0, 0) for d in range(nd)))
            elif op == "shrink":
                a = int(np.argmax(x.shape))            # the longest axis: at least n >= 4
                x = x.shrink(tuple((1, s - 1) if d == a else None for d, s in enumerate(x.shape)))
            elif op == "merge" and nd >= 2:
                a = int(r.integers(0, nd - 1))
                x = x.reshape(*x.shape[:a], x.shape[a] * x.shape[a + 1], *x.shape[a + 2:])
            elif op == "sum" and nd >= 2:
                x = x.sum(int(r.integers(0, nd)))
            elif op == "mul":
                x = x * 3 + 1
        return x
    return make


@pytest.mark.parametrize("seed", range(24))
def test_random_movement_chains_lower_alike_from_their_traces(seed):
    rng = np.random.default_rng([7, seed])
    make = _template(rng)
    sizes = [int(v) for v in rng.choice(np.arange(4, 40), size=7, replace=False)]
    tr = Traces()
    for n in sizes:
        t = make(n)
        eqgrad.realize(t)
        plan = engine.last_plan.plan
        for k in plan.kernels:
            lk = tr.lower(k, plan, lower_kernel)
            ref = lower_kernel(k, plan)
            if lk.insts != ref.insts or lk.vector_lanes != ref.vector_lanes or lk.parallel != ref.parallel:
                assert lk.__dict__.get("traced") is not None
                _runs_alike(lk, ref, k, plan, n)
    assert tr.failed == 0


def test_a_guard_against_an_infinite_float_is_valid_python():
    rec = _Recorder()
    n = Sym(5, "s0", 0, rec)
    assert (n < float("inf")) is True and (n == float("nan")) is False
    tr = trace.Trace([(0,)], {}, dict(rec.guards), LoopKernel("k", [], []))
    assert tr.check(7) is True


def test_a_body_whose_traces_never_apply_stops_being_traced():
    """A lowering that specializes on a size (here: a ``range`` over it) records ``s == value``, so
    its trace applies to no other size: after ``MAX_TRIES`` traces the body is lowered as usual."""
    def specializing(k, plan):
        list(range(plan.buffers[k.out][0][0]))
        return LoopKernel("k", [], [])
    tr = Traces()
    for n in range(4, 16):
        eqgrad.realize(*_matmul(n))
        plan = engine.last_plan.plan
        tr.lower(plan.kernels[0], plan, specializing)
    assert tr.hits == 0 and tr.traced == trace.MAX_TRIES, (tr.traced, tr.hits)


def test_threads_that_trace_and_lower_at_once_get_right_answers():
    """Two threads realize growing decode steps (one traces while the other lowers plain sizes and
    instantiates): the interned expressions of a trace never reach the other's lowering."""
    import threading
    engine.clear_cache()
    devices._lowered.clear()
    trace.TRACES.clear()
    errors: list[BaseException] = []

    def run(D: int, lengths) -> None:
        try:
            for T in lengths:
                rng = np.random.default_rng(T + 100 * D)
                cache, new, q = (rng.standard_normal(s).astype(np.float32) for s in ((1, T, D), (1, 1, D), (1, 1, D)))
                k = Tensor(cache).cat(Tensor(new), dim=1)
                got = ((Tensor(q) @ k.transpose(-1, -2)) * 0.5).softmax(-1).numpy()
                kn = np.concatenate([cache, new], axis=1)
                s = q @ kn.transpose(0, 2, 1) * 0.5
                e = np.exp(s - s.max(-1, keepdims=True))
                np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
        except BaseException as e:        # noqa: BLE001 -- reported below
            errors.append(e)
    threads = [threading.Thread(target=run, args=(D, range(3, 23))) for D in (4, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert trace.TRACES.hits > 0


def test_kernels_of_one_plan_at_other_sizes_count_as_one_plan():
    """A model's layers share bodies at other widths; their lane decisions rarely agree, so sizes
    count as changing only between plans: a trace needs two earlier plans, not two kernels."""
    def program(scale: int) -> list[Tensor]:
        rng = np.random.default_rng(scale)
        return [(Tensor(rng.standard_normal((n, 24), dtype=np.float32)) @
                 Tensor(rng.standard_normal((24, n + 3), dtype=np.float32))).relu() for n in (5 * scale, 7 * scale, 9 * scale)]
    tr = Traces()
    plans = []
    for scale in (1, 2, 3):
        eqgrad.realize(*program(scale))
        plans.append(engine.last_plan.plan)
    shapes = {body_sizes(k, plans[0])[0] for k in plans[0].kernels}
    assert len(shapes) < len(plans[0].kernels)          # one body at several sizes in one plan
    for plan in plans[:2]:
        for k in plan.kernels:
            tr.lower(k, plan, lower_kernel)
    assert tr.traced == 0
    for k in plans[2].kernels:                          # the third plan may trace; right either way
        lk = tr.lower(k, plans[2], lower_kernel)
        ref = lower_kernel(k, plans[2])
        if lk.insts != ref.insts:
            _runs_alike(lk, ref, k, plans[2])


def test_a_gcd_of_a_traced_size_does_not_fix_it():
    """Index simplification takes gcds of a coefficient and a divisor that may be a traced size;
    ``math.gcd`` would take its ``int()`` and pin the trace to that one value. ``symbolic._gcd``
    gives the same numbers and records only what the result depends on."""
    for c in (-96, -7, 0, 1, 6, 64, 100):
        for d in (1, 3, 64, 704, 1000):
            assert symbolic._gcd(c, d) == np.gcd(c, d)
            rec = _Recorder()
            got = symbolic._gcd(c, Sym(d, "s0", 0, rec))
            assert f"s0=={d}" not in rec.guards, rec.guards
            assert (got.v if isinstance(got, Sym) else got) == np.gcd(c, d)
    rec = _Recorder()
    assert symbolic._gcd(64, Sym(11, "s0", 0, rec) * 64) == 64 and rec.guards == {}    # (64*s0) % 64 is 0


def _gqa(T: int) -> list[Tensor]:
    """A decode step's grouped-query attention over a cache of T positions: the kv heads are
    repeated by an expand and a reshape, whose index divides by the cache's stride (64 * T)."""
    rng = np.random.default_rng(T)
    nkv, rep, hd = 2, 3, 64
    q = Tensor(rng.standard_normal((1, nkv * rep, 1, hd)).astype(np.float32))
    k, v = (Tensor(rng.standard_normal((1, nkv, T, hd)).astype(np.float32)) for _ in range(2))
    kk, vv = (t.reshape(1, nkv, 1, T, hd).expand(1, nkv, rep, T, hd).reshape(1, nkv * rep, T, hd) for t in (k, v))
    return [((q @ kk.transpose(-2, -1)) * 0.125).softmax(-1) @ vv]


@pytest.mark.slow
def test_grouped_query_attention_over_a_growing_cache_is_traced_once_for_every_length():
    """Traced at one length, its products instantiate at every later one (a gcd with the cache's
    stride once pinned each trace to the length it was made at: the products were lowered anew at
    every decode step, 1.4x -> 1.65x the fixed-shape step). Lengths from 20: the softmax's lowering
    decides on ``s0 > 16``, so a run that crosses 16 traces it once more on the other side (lowered
    as usual at the lengths before that); once a length equal to a register lane's offset pinned a
    trace too, before traced sizes were polynomials (lower/trace.py)."""
    tr = Traces()
    plans = _plans(_gqa, list(range(20, 32)))
    lowered: list[int] = []

    def count(k, plan):
        lowered.append(len(plans))
        return lower_kernel(k, plan)
    late = 0
    for i, plan in enumerate(plans):
        for k in plan.kernels:
            before = len(lowered)
            lk = tr.lower(k, plan, count)
            if i >= 6:
                late += len(lowered) - before
                _runs_alike(lk, lower_kernel(k, plan), k, plan)
    assert tr.traced >= 1 and late == 0, (tr.traced, tr.hits, late)


def test_a_body_whose_traces_paid_is_traced_again_at_once_where_none_holds():
    """A growing cache that crosses a guard of its body's trace (the softmax's ``s0 > 16``, a lane
    multiple) is traced again at that length with the symbols of the newest trace, where the body's
    traces have each been instantiated: not lowered as usual at CONCRETE more lengths first, each of
    which a device compiled as a program of its own (a decode step's attention: 3 programs, ~55 ms
    a step, at lengths 16, 32 and 64). The instances give the lowering's numbers."""
    tr = Traces()
    plans = _plans(_gqa, list(range(8, 36)))
    lowered: list[int] = []

    def count(k, plan):
        if not symbolic._tracing[0]:              # (a trace lowers with its sizes as symbols)
            lowered.append(1)
        return lower_kernel(k, plan)
    bodies = set()
    for i, plan in enumerate(plans):
        for k in plan.kernels:
            before = len(lowered)
            lk = tr.lower(k, plan, count)
            bodies.add(body_sizes(k, plan)[0])
            if i >= CROSS_FROM:
                assert len(lowered) == before, (8 + i, k.name)        # traced or instantiated, never lowered
                _runs_alike(lk, lower_kernel(k, plan), k, plan)
    assert tr.traced > len(bodies), (tr.traced, len(bodies))           # traced again past a guard


CROSS_FROM = 4      # (lengths from 12: every body of the step has been traced by then)
