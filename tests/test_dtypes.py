"""Dtypes: promotion against NumPy/torch for every pair, strict names, casts of special
values, arithmetic and reductions in every dtype against NumPy on LLVM and NUMPY, float16/bfloat16
against torch, int64 beyond int32."""
import warnings

import numpy as np
import pytest

import eqgrad.dtype as dt
from eqgrad import Tensor
from eqgrad.errors import DTypeError

torch = pytest.importorskip("torch")
DEVICES = ["NUMPY", "LLVM"]
ALL = dt.ALL_DTYPES
TORCH = {d: getattr(torch, "bool" if d is dt.bool_ else d.name) for d in ALL}


@pytest.mark.parametrize("a", ALL, ids=lambda d: d.name)
def test_promotion_table_matches_torch_and_numpy(a):
    for b in ALL:
        got = dt.promote(a, b)
        assert got is dt.promote(b, a)
        try:
            want = torch.promote_types(TORCH[a], TORCH[b])
        except RuntimeError:             # torch does not promote uint32 with the others: NumPy's table
            want = None
        if want is not None:
            assert got.name == str(want).removeprefix("torch."), (a, b)
        if dt.bfloat16 not in (a, b) and a.kind == b.kind or {a.kind, b.kind} <= {"i", "u"}:
            if dt.bfloat16 not in (a, b):
                assert np.dtype(got.np) == np.promote_types(a.np, b.np), (a, b)


@pytest.mark.parametrize("name", ["float8", "complex64", "uint16", "uint64", "int", "half", "long", "cfloat"])
def test_unknown_names_are_errors_naming_the_supported(name):
    if name in ("int", "half", "long"):      # torch's aliases name real dtypes
        assert dt.to_dtype(name) in ALL
        return
    with pytest.raises(DTypeError, match="eqgrad supports bool, uint8"):
        dt.to_dtype(name)


def test_numpy_and_torch_dtypes_map_exactly_or_fail():
    for d in ALL:
        if d is not dt.bfloat16:
            assert dt.to_dtype(np.dtype(d.np)) is d
        assert dt.to_dtype(TORCH[d]) is d
    for bad in (np.uint16, np.uint64, np.complex64, torch.uint16, torch.complex64):
        with pytest.raises(DTypeError):
            dt.to_dtype(bad)
    with pytest.raises(DTypeError):
        Tensor(np.zeros(3, np.uint64))


@pytest.mark.parametrize("npd", [np.int8, np.uint8, np.int16, np.int64, np.uint32, np.float16, np.float64])
def test_numpy_inputs_keep_their_dtype(npd):
    a = (np.arange(6) % 5).astype(npd).reshape(2, 3)
    t = Tensor(a)
    assert t.dtype is dt.to_dtype(npd)
    np.testing.assert_array_equal(t.numpy(), a)
    assert t.numpy().dtype == npd


def test_dtype_attributes():
    assert (dt.int8.min, dt.int8.max, dt.uint32.max, dt.int64.min) == (-128, 127, 2**32 - 1, -2**63)
    assert dt.float16.max == 65504.0 and dt.bfloat16.itemsize == 2 and dt.float64.itemsize == 8
    assert dt.bfloat16.is_float and dt.uint8.is_int and not dt.uint8.is_signed and dt.int16.is_signed


def _inputs(d: dt.DType, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if d.is_float:
        a, b = rng.standard_normal((2, 5, 6)) * 4
    elif d is dt.bool_:
        a, b = rng.random((2, 5, 6)) > 0.5
    else:
        lo = 0 if d.kind == "u" else -9
        a, b = rng.integers(lo, 10, (2, 5, 6))
    return a, b


def _ref(x: np.ndarray, d: dt.DType) -> np.ndarray:
    """The value each element has in ``d`` (bfloat16: float32 rounded to bfloat16)."""
    return dt.round_bf16(x.astype(np.float32)) if d is dt.bfloat16 else x.astype(d.np)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("d", [x for x in ALL if x is not dt.bool_], ids=lambda d: d.name)
def test_arithmetic_and_reductions_against_numpy(device, d):
    rng = np.random.default_rng(0)
    a, b = _inputs(d, rng)
    ta, tb = Tensor(a, dtype=d, device=device), Tensor(b, dtype=d, device=device)
    ra, rb = _ref(a, d), _ref(b, d)
    tol = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-6, "float64": 1e-12}.get(d.name, 0)
    cmp = (lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol)) if d.is_float else np.testing.assert_array_equal

    def rnd(x):                          # NumPy's result rounded to d, as eqgrad's per-op rounding
        return _ref(np.asarray(x, np.float64 if d.is_float else x.dtype), d)
    with np.errstate(all="ignore"):
        cmp((ta + tb).numpy(), rnd(ra + rb) if d is not dt.bfloat16 else rnd(ra.astype(np.float64) + rb))
        cmp((ta * tb).numpy(), rnd(ra.astype(np.float64) * rb) if d.is_float else (ra * rb))
        cmp(ta.maximum(tb).numpy() if hasattr(ta, "maximum") else (ta * 0).numpy(),
            np.maximum(ra, rb) if hasattr(ta, "maximum") else (ra * 0))
        cmp((ta < tb).numpy(), ra < rb)
        cmp(ta.sum(axis=1).numpy(), rnd(ra.astype(np.float64).sum(axis=1)) if d.is_float else ra.sum(axis=1, dtype=d.np))
        cmp(ta.max().numpy(), ra.max())
        # non-contiguous (a transposed, sliced view), 0-d and size-0
        cmp((ta.T[1:, ::2] + 1).numpy(), rnd(ra.T[1:, ::2].astype(np.float64) + 1) if d.is_float else ra.T[1:, ::2] + d.np(1))
        cmp((Tensor(a[0, 0], dtype=d, device=device) * 2).numpy(), rnd(ra[0, 0].astype(np.float64) * 2) if d.is_float else ra[0, 0] * d.np(2))
        z = Tensor(np.zeros((0, 3)), dtype=d, device=device)
        assert (z + z).numpy().shape == (0, 3) and z.sum().numpy() == 0
    assert (ta + tb).dtype is d


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("src", [dt.float32, dt.float64, dt.float16], ids=lambda d: d.name)
@pytest.mark.parametrize("dst", [x for x in ALL if x is not dt.bfloat16], ids=lambda d: d.name)
def test_casts_of_special_values(device, src, dst):
    vals = np.array([0.0, -0.0, 1.5, -2.5, 100.7, -129.0, 300.0, 7e4, -7e4, 3e9, -3e9, 1e20, np.inf, -np.inf, np.nan],
                    np.float64)
    with np.errstate(over="ignore"):
        x = vals.astype(src.np)
    got = Tensor(x, device=device).cast(dst).numpy()
    if dst.is_int:      # documented: truncate toward zero, saturate at the type's range, NaN -> 0
        want = [0 if np.isnan(v) else dst.min if v <= dst.min else dst.max if v >= dst.max else int(v)
                for v in x.astype(np.float64)]
        np.testing.assert_array_equal(got, np.array(want, dst.np))
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            np.testing.assert_array_equal(got, x.astype(dst.np))


def _bf16_nearest(d: np.ndarray) -> np.ndarray:
    """float64 values rounded once to bfloat16 (8 significant bits, float32's exponent range), ties
    to even, computed exactly in float64: scaling by a power of two and np.rint are exact."""
    m, e = np.frexp(d)
    ulp = np.ldexp(1.0, np.maximum(e - 8, -133))
    with np.errstate(over="ignore", invalid="ignore"):
        r = np.rint(d / ulp) * ulp
        return np.where(np.abs(r) > 3.3895313892515355e38, np.copysign(np.inf, d), r)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dst", ["float16", "bfloat16"])
def test_narrow_casts_round_once(device, dst):
    """float64 and float32 -> float16/bfloat16 round to nearest once, also just above and below the
    midpoints between two neighbours (where rounding to float32 first and then again is wrong).
    LLVM writes these conversions without library routines: x86 has no double -> half instruction,
    and the JIT did not find libgcc's __truncdfhf2 on an AMD EPYC (a segfault)."""
    if device in ("OPENCL", "CUDA"):
        pytest.skip(f"{device} has no {dst} kernels (docs/semantics.md, Dtypes)")
    if dst == "float16":
        vals = np.arange(0, 0x7C00, 37, dtype=np.uint16).view(np.float16).astype(np.float64)
    else:
        vals = (np.arange(0, 0x7F80, 37, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
    mids = (vals[:-1] + vals[1:]) / 2
    d = np.concatenate([vals, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                        np.random.default_rng(1).standard_normal(500) * 10.0 ** np.arange(-6, 6).repeat(42)[:500],
                        [np.inf, 1e300, 65520.0, 65519.99, 5e-324]])
    d = np.concatenate([d, -d, [np.nan]])
    want = d.astype(np.float16).astype(np.float64) if dst == "float16" else _bf16_nearest(d)
    got = Tensor(d, device=device).cast(dst).numpy().astype(np.float64)
    np.testing.assert_array_equal(got, want)
    with np.errstate(over="ignore"):
        f = d.astype(np.float32)              # float32 sources: their own nearest
        want32 = f.astype(np.float16).astype(np.float64) if dst == "float16" else _bf16_nearest(f.astype(np.float64))
    np.testing.assert_array_equal(Tensor(f, device=device).cast(dst).numpy().astype(np.float64), want32)
    # the host conversion (Tensor(float64 array, dtype=...)) rounds once as well (a finite value
    # that would become inf is an OverflowError there)
    keep = np.isfinite(want) | ~np.isfinite(d)
    np.testing.assert_array_equal(Tensor(d[keep], dtype=dst, device=device).numpy().astype(np.float64), want[keep])


def _bf16_of_int(v: int) -> float:
    """An integer rounded once to bfloat16 (8 significant bits), ties to even, in exact arithmetic."""
    n = abs(v)
    shift = max(n.bit_length() - 8, 0)
    q, r = divmod(n, 1 << shift)
    if shift and (r > 1 << (shift - 1) or (r == 1 << (shift - 1) and q & 1)):
        q += 1
    return float(q << shift) * (-1 if v < 0 else 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("src", ["int16", "int32", "uint32", "int64"])
def test_ints_to_bfloat16_round_once(device, src):
    """Integer -> bfloat16 rounds to nearest once: just above a midpoint between two bfloat16
    neighbours, going through float32 (as LLVM's own conversion and NumPy-then-round do) lands on
    the midpoint and then rounds to even, the lower one (2**24 + 2**16 + 1 gave 2**24)."""
    if device in ("OPENCL", "CUDA"):
        pytest.skip(f"{device} has no bfloat16 kernels (docs/semantics.md, Dtypes)")
    d = getattr(dt, src)
    vals = {0, 1, 255, 256, 257, 383, 384, 385, d.min, d.max}
    for e in range(8, 64):
        mid = (1 << e) + (1 << (e - 8))              # between 2**e and its next bfloat16
        for k in (1, 3, 5):
            vals |= {mid * k - 1, mid * k, mid * k + 1, mid * k + (1 << max(e - 30, 0))}
    vals = sorted(v for v in vals | {-v for v in vals} if d.min <= v <= d.max)
    x = np.array(vals, d.np)
    want = np.array([_bf16_of_int(int(v)) for v in vals])
    got = Tensor(x, device=device).cast("bfloat16").numpy().astype(np.float64)
    np.testing.assert_array_equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # the host says when a value is not exact
        host = Tensor(x, dtype="bfloat16", device=device).numpy().astype(np.float64)
    np.testing.assert_array_equal(host, want)


def test_a_uint64_host_array_rounds_once_into_bfloat16():
    """NumPy's uint64 has no eqgrad dtype, but the host converts it: beyond 2**63 too, once."""
    v = [2 ** 64 - 1, 2 ** 63 + 2 ** 55 + 1, 2 ** 63 + 2 ** 55, 2 ** 53 + 2 ** 45 + 1, 5]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = Tensor(np.array(v, np.uint64), dtype="bfloat16").numpy().astype(np.float64)
    np.testing.assert_array_equal(got, [_bf16_of_int(x) for x in v])


def test_own_bfloat16_routines_round_as_the_reference():
    """__truncsfbf2/__truncdfbf2, which LLVM calls on targets without AVX512-BF16 once its optimizer
    has narrowed a comparison or select to bfloat16 (libgcc has no such routines), are compiled by
    eqgrad and given to the JIT; called directly here, they round as dtype.f32_to_bf16."""
    import ctypes

    from eqgrad.devices import llvm as L
    comp = L.compiler()
    L._libcalls(comp)
    llvm = comp.llvm
    src = "".join(f"declare bfloat @{n}({t})\ndefine i16 @w_{t}({t} %x) {{\n  %r = call bfloat @{n}({t} %x)\n"
                  f"  %b = bitcast bfloat %r to i16\n  ret i16 %b\n}}\n"
                  for n, t in (("__truncsfbf2", "float"), ("__truncdfbf2", "double")))
    engine = llvm.create_mcjit_compiler(llvm.parse_assembly(src), comp.target_machine())
    engine.finalize_object()
    vals = (np.arange(0, 0x7F80, 37, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
    mids = (vals[:-1] + vals[1:]) / 2
    d = np.concatenate([vals, mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf),
                        [np.inf, 3.4e38, 1e300, 1e-45, 5e-324, 0.0]])
    d = np.concatenate([d, -d])
    for ty, cty, xs in (("float", ctypes.c_float, d.astype(np.float32)), ("double", ctypes.c_double, d)):
        fn = ctypes.CFUNCTYPE(ctypes.c_uint16, cty)(engine.get_function_address(f"w_{ty}"))
        got = np.array([fn(float(v)) for v in xs], np.uint16)
        np.testing.assert_array_equal(got, dt.f32_to_bf16(xs), err_msg=ty)
        nan = fn(float("nan"))
        assert dt.bf16_to_f32(np.uint16(nan)) != dt.bf16_to_f32(np.uint16(nan)), hex(nan)


@pytest.mark.parametrize("device", DEVICES)
def test_int_to_int_casts_wrap_as_numpy(device):
    x = np.array([0, 1, -1, 127, 128, 255, 256, -129, 2**31 - 1, -2**31, 2**40 + 5, -2**40 - 3], np.int64)
    for d in (dt.int8, dt.uint8, dt.int16, dt.int32, dt.uint32, dt.float32, dt.bool_):
        np.testing.assert_array_equal(Tensor(x, device=device).cast(d).numpy(), x.astype(d.np))
    u = np.array([0, 1, 2**31, 2**32 - 1], np.uint32)
    np.testing.assert_array_equal(Tensor(u, device=device).cast(dt.int64).numpy(), u.astype(np.int64))
    np.testing.assert_array_equal(Tensor(u, device=device).cast(dt.float64).numpy(), u.astype(np.float64))


@pytest.mark.parametrize("device", DEVICES)
def test_int64_beyond_int32_stays_exact(device):
    x = np.array([2**40 + 1, -2**50 - 3, 2**62 + 7, 3], np.int64)
    t = Tensor(x, device=device)
    assert t.dtype is dt.int64
    np.testing.assert_array_equal((t + t).numpy(), x + x)
    np.testing.assert_array_equal((t * 3).numpy(), x * 3)
    np.testing.assert_array_equal(t.sum().numpy(), x.sum())
    np.testing.assert_array_equal((t // 7).numpy(), x // 7)
    np.testing.assert_array_equal((t == Tensor(x, device=device)).numpy(), np.ones(4, bool))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_narrow_floats_against_torch(device, name):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 64)).astype(np.float32) * 3
    ta, tb = torch.tensor(a, dtype=getattr(torch, name)), torch.tensor(b, dtype=getattr(torch, name))
    ea, eb = Tensor(a, device=device).cast(name), Tensor(b, device=device).cast(name)
    # round trip: exactly torch's rounding (nearest even)
    np.testing.assert_array_equal(ea.numpy(), ta.float().numpy())
    np.testing.assert_array_equal(ea.float().numpy(), ta.float().numpy())
    for f in (lambda x, y: x + y, lambda x, y: x * y, lambda x, y: x - y):
        np.testing.assert_array_equal(f(ea, eb).numpy(), f(ta, tb).float().numpy())
    tol = 1e-2 if name == "bfloat16" else 1e-3
    # NOTE: x / y is x * (1 / y): two roundings in the narrow type, within 1 ulp of torch's one
    np.testing.assert_allclose((ea / eb).numpy(), (ta / tb).float().numpy(), rtol=tol)
    assert (ea / eb).dtype.name == name
    np.testing.assert_allclose(ea.sum().numpy(), ta.sum().float().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(ea.exp().numpy(), ta.exp().float().numpy(), rtol=2 * tol)
    assert ea.numpy().dtype == (np.float16 if name == "float16" else np.float32)   # NumPy has no bfloat16


def test_loading_narrow_weights_and_the_torch_methods():
    w = np.linspace(-2, 2, 12, dtype=np.float16).reshape(3, 4)
    t = Tensor(w)
    assert t.dtype is dt.float16
    np.testing.assert_array_equal(t.numpy(), w)
    x = Tensor(np.ones((2, 3), np.float32))
    assert (x @ t.float()).dtype is dt.float32
    bf = torch.tensor(w.astype(np.float32)).bfloat16()
    tb = Tensor(bf.float().numpy(), dtype="bfloat16")
    np.testing.assert_array_equal(tb.numpy(), bf.float().numpy())
    assert [getattr(t, m)().dtype.name for m in ("float", "half", "bfloat16", "double", "long", "int")] == \
        ["float32", "float16", "bfloat16", "float64", "int64", "int32"]


def test_weak_scalars_keep_the_tensor_dtype():
    for d in (dt.int8, dt.uint8, dt.int64, dt.float16, dt.bfloat16, dt.float64):
        assert (Tensor([1, 2], dtype=d) + 1).dtype is d
    assert (Tensor([1, 2], dtype=dt.int8) + 1.5).dtype is dt.float32
    assert (Tensor([1, 2], dtype=dt.float16) * 2.5).dtype is dt.float16
    with pytest.raises(OverflowError, match="int8"):
        Tensor([1, 2], dtype=dt.int8) + 300
    with pytest.raises(OverflowError, match="float16"):
        Tensor([1.0], dtype=dt.float16) + 1e5


def test_cstyle_renderers_refuse_unsupported_dtypes():
    from eqgrad.devices.cstyle import SUPPORTED_KINDS
    assert "int8" not in SUPPORTED_KINDS and "float16" not in SUPPORTED_KINDS
