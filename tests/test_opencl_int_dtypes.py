"""int8, uint8, int16, uint32 and int64 on the OPENCL device (docs/semantics.md, "Dtypes" and "Per
device"): computed in OpenCL C's own types (char, uchar, short, uint, long) with the LLVM and NUMPY
devices' semantics -- wrapping arithmetic in the dtype's width, unsigned order and division for the
unsigned ones, x / 0 = x % 0 = 0 and MIN / -1 = MIN, float -> integer casts that truncate and
saturate with NaN -> 0, integer -> narrower integer casts that wrap, sums and maxima in the dtype
(also through a work-group reduction). Every result is compared bit for bit with the NUMPY device."""
import os
import shutil
import subprocess

import numpy as np
import pytest

import eqgrad.dtype as dt
from eqgrad import Tensor
from eqgrad.devices.cstyle import SUPPORTED_KINDS
from eqgrad.devices.cuda import CUDARenderer
from eqgrad.devices.opencl import OpenCLRenderer
from eqgrad.errors import DTypeError
from eqgrad.ops import OPS
from conftest import DEVICES

needs_opencl = pytest.mark.skipif("OPENCL" not in DEVICES, reason="no OpenCL platform")
CXX = shutil.which("g++") or shutil.which("clang++") or shutil.which("c++")

INTS = ["int8", "uint8", "int16", "uint32", "int64"]
ALL_INTS = INTS + ["int32"]


def values(name: str, n: int = 48, seed: int = 0) -> np.ndarray:
    """The dtype's extremes and small values, then random ones over its whole range."""
    info = np.iinfo(name)
    lo, hi = int(info.min), int(info.max)
    special = [lo, lo + 1, lo + 2, -3, -2, -1, 0, 1, 2, 3, 7, hi // 2, hi // 2 + 1, hi - 2, hi - 1, hi]
    special = [v for v in dict.fromkeys(special) if lo <= v <= hi]
    rng = np.random.default_rng(seed)
    rand = rng.integers(lo, hi, size=max(n - len(special), 0), endpoint=True,
                        dtype=np.int64 if name != "uint32" else np.uint64)
    out = np.array(special + [int(v) for v in rand], dtype=name)
    return out if n >= len(special) else rng.permutation(out)[:n]


def divisors(name: str, n: int = 48) -> np.ndarray:
    """Divisors with zeros, -1 (paired with MIN in ``values``), 1 and the extremes."""
    info = np.iinfo(name)
    d = values(name, n, seed=1)
    d[0], d[1], d[2], d[3] = (-1 if info.min < 0 else 0), 0, 1, info.max
    d[10:14] = 0
    if info.min < 0:
        d[5] = -1
    return d


def run(fn, *arrays, device: str):
    out = fn(*[Tensor(a, device=device) for a in arrays])
    outs = out if isinstance(out, tuple) else (out,)
    return [(o.dtype, o.numpy()) for o in outs]


def same(fn, *arrays):
    """``fn`` of the arrays on OPENCL equals it on NUMPY: dtypes, and values bit for bit."""
    got, want = run(fn, *arrays, device="OPENCL"), run(fn, *arrays, device="NUMPY")
    for (gd, g), (wd, w) in zip(got, want):
        assert gd is wd, (gd, wd)
        assert g.dtype == w.dtype and g.shape == w.shape
        assert np.array_equal(g.reshape(-1).view(np.uint8), w.reshape(-1).view(np.uint8)), f"\nOPENCL {g}\nNUMPY  {w}"
    return [g for _, g in got]


@needs_opencl
def test_the_renderers_kinds():
    # OpenCL computes every integer dtype; CUDA (untestable here) keeps its kinds; narrow floats stay refused
    assert set(INTS) <= OpenCLRenderer.supported_kinds
    assert CUDARenderer.supported_kinds == SUPPORTED_KINDS
    assert not set(INTS) & CUDARenderer.supported_kinds
    assert "float16" not in OpenCLRenderer.supported_kinds and "bfloat16" not in OpenCLRenderer.supported_kinds
    with pytest.raises(DTypeError, match="does not support float16 yet"):
        (Tensor(np.ones(4, np.float16), device="OPENCL") * 2).numpy()


@needs_opencl
@pytest.mark.parametrize("name", INTS)
def test_add_mul_neg_wrap_around(name):
    x = values(name)
    y = np.roll(x, 5)
    g = same(lambda a, b: (a + b, a * b, a - b, -a, a * a * a, a + 1, a * 3), x, y)
    with np.errstate(over="ignore"):
        assert np.array_equal(g[0], x + y) and np.array_equal(g[1], x * y) and np.array_equal(g[3], -x)
    info = np.iinfo(name)
    # at the extremes: MAX + 1 == MIN, -MIN == MIN, MAX * 2 == -2 (unsigned: MAX - 1)
    e = np.array([info.max, info.min], name)
    g = same(lambda a: (a + 1, -a, a * 2, a - 1), e)
    assert g[0][0] == info.min and g[1][1] == info.min and g[3][1] == info.max
    assert g[2][0] == (-2 if info.min < 0 else info.max - 1)


@needs_opencl
@pytest.mark.parametrize("name", INTS)
def test_compare_max_min_where(name):
    x = values(name)
    y = np.roll(x, 3)
    g = same(lambda a, b: (a < b, a <= b, a > b, a == b, a != b, a.maximum(b), (a < b).where(a, b)), x, y)
    assert np.array_equal(g[0], x < y) and np.array_equal(g[5], np.maximum(x, y))     # unsigned order for uint
    assert np.array_equal(g[6], np.where(x < y, x, y))
    same(lambda a: (a > 5, a.maximum(0), (a == 0).where(a, 7)), x)


@needs_opencl
@pytest.mark.parametrize("name", INTS)
def test_division_and_modulo(name):
    x, d = values(name), divisors(name)
    g = same(lambda a, b: (a // b, a % b, a.divide(b, rounding_mode="trunc")), x, d)
    info = np.iinfo(name)
    assert np.all(g[0][d == 0] == 0) and np.all(g[1][d == 0] == 0)
    if info.min < 0:                       # MIN // -1 wraps to MIN, MIN % -1 == 0
        assert g[0][0] == info.min and g[1][0] == 0
    with np.errstate(divide="ignore", over="ignore"):
        ok = d != 0
        assert np.array_equal(g[0][ok], (x // np.where(ok, d, 1))[ok])
        assert np.array_equal(g[1][ok], (x % np.where(ok, d, 1))[ok])
    same(lambda a: (a // 7, a % 7, a // 0, a % 0) if info.min >= 0 else (a // 7, a % -7, a // -1, a % 0), x)


F32 = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 0.99, -0.99, 1.5, -1.5, 126.9, 127.0,
                127.5, 128.0, 128.5, -127.9, -128.0, -128.5, -129.0, 255.0, 255.9, 256.0, 256.5, -1.0,
                32767.0, 32767.9, 32768.0, -32768.0, -32768.9, -32769.0, 65535.0, 65536.0, 2.0 ** 31 - 128,
                2.0 ** 31, -2.0 ** 31, -2.0 ** 31 - 256, 2.0 ** 32 - 256, 2.0 ** 32, 2.0 ** 32 + 512,
                2.0 ** 63 - 2 ** 40, 2.0 ** 63, -2.0 ** 63, -2.0 ** 63 - 2 ** 41, 2.0 ** 64, 3e38, -3e38,
                1e-40, 12345.678, -98765.4])
F64 = np.concatenate([F32, [2.0 ** 31 - 0.5, 2.0 ** 32 - 0.25, 4294967295.9, -2147483648.9, 2.0 ** 63 - 1024,
                            -2.0 ** 63 + 1024, 1e300, -1e300, 9007199254740993.0]])


@needs_opencl
@pytest.mark.parametrize("name", INTS)
@pytest.mark.parametrize("fdt", ["float32", "float64"])
def test_float_to_int_truncates_and_saturates(name, fdt):
    f = (F32 if fdt == "float32" else F64).astype(fdt)
    (g,) = same(lambda a: a.cast(name), f)
    info = np.iinfo(name)
    with np.errstate(invalid="ignore"):
        f64 = f.astype(np.float64)
        want = np.where(np.isnan(f64), 0, np.clip(np.trunc(np.nan_to_num(f64)), info.min, info.max))
    exact = np.abs(want) < 2 ** 53                  # beyond it the float itself is the saturated limit
    assert np.array_equal(g[exact].astype(np.float64), want[exact])
    assert np.all(g[np.isnan(f)] == 0)
    assert np.all(g[f >= 2.0 ** 64] == info.max) and np.all(g[f <= -2.0 ** 64] == info.min)


@needs_opencl
@pytest.mark.parametrize("name", INTS)
def test_int_to_float(name):
    x = values(name)
    g = same(lambda a: (a.float(), a.double(), a.float() * 0.5, a.double() + 0.25), x)
    assert np.array_equal(g[0], x.astype(np.float32)) and np.array_equal(g[1], x.astype(np.float64))


@needs_opencl
@pytest.mark.parametrize("src", ALL_INTS)
def test_casts_between_integer_dtypes(src):
    x = values(src)
    g = same(lambda a: tuple(a.cast(d) for d in ALL_INTS if d != src), x)
    for d, got in zip([d for d in ALL_INTS if d != src], g):
        assert np.array_equal(got, x.astype(d)), d          # wraps (two's complement), as NumPy's astype


@needs_opencl
@pytest.mark.parametrize("name", INTS)
def test_bool_casts(name):
    x = values(name)
    g = same(lambda a: (a.bool(), a.bool().cast(name), (a > 0).cast(name) + a, ~(a != 0)), x)
    assert np.array_equal(g[0], x != 0)
    b = np.array([True, False, True, True, False])
    same(lambda c: (c.cast(name), c.cast(name) * 3), b)


@needs_opencl
@pytest.mark.parametrize("name", INTS)
@pytest.mark.parametrize("n", [7, 1000])
def test_sum_and_max_reductions(name, n):
    # 1000 is long enough for a work-group per output element (CStyleRenderer.group_reduce)
    a = np.stack([values(name, n, seed=s) for s in range(3)])
    g = same(lambda t: (t.sum(1), t.amax(1), t.sum(), t.amax(), t.amax(0)), a)
    assert np.array_equal(g[1], a.max(1)) and np.array_equal(g[3], a.max())


@needs_opencl
@pytest.mark.parametrize("name", INTS)
def test_composites(name):
    x = values(name).reshape(6, 8)
    same(lambda a: ((a * 3 + 1) // 2, a.cumsum(0), a.amax(0), a.abs() if np.iinfo(name).min < 0 else a, a.minimum(5)), x)
    idx = np.array([[0, 5, 5, 1], [47, 2, 3, 0]], np.int64)
    w = values(name).astype(np.float32)
    same(lambda w_, i: (w_[i], w_[i] * 2), w, idx)
    same(lambda v, i: v[i] + 1, values(name), idx)


@needs_opencl
@pytest.mark.parametrize("name", INTS)
def test_shifts_and_bitwise(name):
    x = values(name)
    same(lambda a: (a << 3, a >> 1, ~a, a & 6, a | 8, a ^ (a >> 2), a ** 3), x)


@needs_opencl
def test_float64_group_reductions():
    # a work-group reduction combines its accumulators in local memory of their own type (float64
    # once went through an int32 array: truncated sums and maxima)
    x = np.random.default_rng(0).standard_normal((3, 1000)) * 1e10
    (m,) = same(lambda t: t.amax(1), x)
    assert np.array_equal(m, x.max(1))
    t = Tensor(x, device="OPENCL")
    np.testing.assert_allclose(t.sum(1).numpy(), x.sum(1), rtol=1e-12)        # another summation order


@needs_opencl
def test_int64_index_arithmetic_and_gather():
    idx = np.array([3, 0, 2, 2, 1], np.int64)
    w = np.arange(20, dtype=np.float32).reshape(4, 5)
    same(lambda w_, i: (w_[i], w_[i * 1 + 0], w_[:, i]), w, idx)


@needs_opencl
@pytest.mark.parametrize("src,dst", [("int8", "uint8"), ("uint8", "int8"), ("int32", "uint32"), ("uint32", "int32"),
                                     ("uint32", "float32"), ("float32", "uint32"), ("int64", "float64"),
                                     ("float64", "int64")])
def test_bitcasts(src, dst):
    x = values(src) if src not in ("float32", "float64") else (F32 if src == "float32" else F64).astype(src)
    (g,) = same(lambda a: a.bitcast(dst), x)
    assert np.array_equal(g.view(np.uint8), x.view(dst).view(np.uint8))
    assert g.dtype == np.dtype(dst)
    assert dt.to_dtype(dst).np == np.dtype(dst)


# ---------------------------------------------------------------------------- the C on the host
def _host_program(name: str) -> tuple[str, list[tuple[str, str, str]]]:
    """A C++ program applying OpenCLRenderer's expressions for ``name`` to every input (pair)."""
    r = OpenCLRenderer()
    r.used = set()
    t = r.reg_type(name)
    exprs = [(op, "ii", r.alu(op, name, ["a", "b"])) for op in ("ADD", "MUL", "IDIV", "MOD", "MAX", "CMPLT", "CMPEQ")]
    exprs += [("NEG", "i", r.alu("NEG", name, ["a"])), ("CAST-f", "f", r.cast("a", "float32", name)),
              ("CAST-d", "d", r.cast("a", "float64", name))]
    exprs += [(f"CAST-{d}", "i", r.cast("a", name, d)) for d in ALL_INTS if d != name]
    helpers = "\n".join(r.helpers()[h].replace(r.func_prefix, "static inline", 1) for h in sorted(r.used))
    body = []
    for op, ins, e in exprs:
        arr, ty = {"i": ("I", t), "ii": ("I", t), "f": ("F", "float"), "d": ("D", "double")}[ins]
        show = 'printf("%lld\\n", (long long)(r));'
        if ins == "ii":
            loop = f"for (int i = 0; i < n; i++) for (int j = 0; j < n; j++) {{ {t} a = I[i], b = I[j]; auto r = {e}; {show} }}"
        else:
            loop = f"for (int i = 0; i < n{'' if ins == 'i' else ins}; i++) {{ {ty} a = {arr}[i]; auto r = {e}; {show} }}"
        body.append(f'  printf("{op}\\n"); {loop}')
    src = ("#include <cstdio>\n#include <cstring>\n#include <cmath>\n"
           "typedef unsigned char uchar; typedef unsigned short ushort; typedef unsigned int uint; "
           "typedef unsigned long ulong;\n" + helpers + "\n"
           "int main() {\n  int n, nf, nd; static " + t + " I[256]; static float F[256]; static double D[256];\n"
           "  if (scanf(\"%d\", &n) != 1) return 2;\n"
           "  for (int i = 0; i < n; i++) { long long v; if (scanf(\"%lld\", &v) != 1) return 2; I[i] = (" + t + ")v; }\n"
           "  if (scanf(\"%d\", &nf) != 1) return 2;\n"
           "  for (int i = 0; i < nf; i++) { unsigned u; if (scanf(\"%u\", &u) != 1) return 2; memcpy(&F[i], &u, 4); }\n"
           "  if (scanf(\"%d\", &nd) != 1) return 2;\n"
           "  for (int i = 0; i < nd; i++) { unsigned long long u; if (scanf(\"%llu\", &u) != 1) return 2; memcpy(&D[i], &u, 8); }\n"
           + "\n".join(body) + "\n  return 0;\n}\n")
    return src, exprs


@pytest.mark.skipif(CXX is None, reason="no C++ compiler (g++, clang++) on PATH")
@pytest.mark.parametrize("name", INTS)
def test_the_c_code_on_the_host_has_no_undefined_behaviour(name, tmp_path):
    """The renderer's expressions and helpers for ``name``, compiled as C++ at -O2 (which exploits
    undefined behaviour) under UBSan (which aborts on it), give the op table's results -- so the
    rules are checked where there is no OpenCL platform too. (OpenCL C's char is signed: -fsigned-char.)"""
    src, exprs = _host_program(name)
    (tmp_path / "ops.cpp").write_text(src)
    exe = tmp_path / "ops"
    base = [CXX, "-std=c++17", "-O2", "-fsigned-char", "-o", str(exe), str(tmp_path / "ops.cpp")]
    res = subprocess.run(base + ["-fsanitize=undefined,float-cast-overflow", "-fno-sanitize-recover=all"],
                         capture_output=True, text=True)
    if res.returncode != 0:                                   # no sanitizer runtime: plain -O2
        res = subprocess.run(base, capture_output=True, text=True)
    assert res.returncode == 0, f"the {name} C does not compile as C++:\n{res.stderr}\n{src}"
    x = values(name, 40)
    f, d = F32.astype(np.float32), F64
    stdin = (f"{len(x)} {' '.join(str(int(v)) for v in x)} {len(f)} {' '.join(map(str, f.view(np.uint32).tolist()))} "
             f"{len(d)} {' '.join(map(str, d.view(np.uint64).tolist()))}\n")
    out = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "runtime error" not in out.stderr, f"{name}: undefined behaviour:\n{out.stderr}"
    lines = out.stdout.split()
    a, b = np.repeat(x, len(x)), np.tile(x, len(x))
    D = dt.to_dtype(name)
    for op, ins, e in exprs:
        k = lines.index(op)
        if op.startswith("CAST-"):
            src_arr = {"i": x, "f": f, "d": d}[ins]
            to = D if ins in "fd" else dt.to_dtype(op[5:])
            ref = OPS["CAST"].ref([src_arr], to, to)
        else:
            xs = [a, b] if ins == "ii" else [x]
            ref = OPS[op].ref(xs, None, dt.bool_ if op.startswith("CMP") else D)
        got = np.array([int(v) for v in lines[k + 1:k + 1 + len(ref)]])
        assert np.array_equal(got, np.asarray(ref).astype(np.int64) if ref.dtype != np.uint64 else ref), \
            f"{name} {op}: {e}"
