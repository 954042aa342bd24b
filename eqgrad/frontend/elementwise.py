"""Elementwise math composed from the primitives: inverse and hyperbolic trigonometry, erf, rounding, remainders, comparisons of closeness, activations, integer bit shifts.

``Tensor`` inherits these methods (frontend/tensor.py); they build on Tensor's own methods through
``self`` and ``type(self)`` (this module cannot import tensor.py, which imports it).

Where the gradient of the composition would differ from torch's at an edge (a where() whose dropped
branch is inf, a pole, 0 * inf), an op records torch's gradient formula instead (``_custom_grad``).
Semantics and accuracy: docs/semantics.md, "Elementwise math".
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from eqgrad.dtype import bool_, float32, float64, int32, promote, result_with_scalar
from eqgrad.errors import DTypeError

INF = float("inf")
NAN = float("nan")
FLOAT32_MAX = 3.4028234663852886e38
LN_2 = math.log(2.0)
LOG10_2 = math.log10(2.0)
PI = math.pi
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
# Numerical Recipes' erfcc (Press et al., 2nd ed., section 6.2): a Chebyshev fit of
# erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z/2), fractional error < 1.2e-7 for every z >= 0
_ERFC_P = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
           1.48851587, -0.82215223, 0.17087277)
# Cephes atanf: odd minimax polynomial on [-tan(pi/8), tan(pi/8)] (peak relative error 1.9e-7)
_ATAN_P = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_TAN_3PI_8, _TAN_PI_8 = 2.414213562373095, 0.4142135623730950


def float_math(f: Callable[..., Any]) -> Callable[..., Any]:
    """A float composite ``f(self, ...)``, written for a float32 or float64 ``self``, for any dtype:
    float32 and float64 compute in their own type; float16 and bfloat16 compute in float32 and
    round the result once to their type (as torch's CPU kernels: rounding every step of a
    composite to 11 bits would lose most of them); integers and bool give float32."""
    @functools.wraps(f)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        d = self.dtype
        if d is float32 or d is float64:
            return f(self, *args, **kwargs)
        out = f(self.float(), *args, **kwargs)
        return out.cast(d) if d.is_narrow_float and out.dtype is float32 else out
    return run


def float_math2(f: Callable[..., Any]) -> Callable[..., Any]:
    """``float_math`` for a binary composite ``f(self, other, ...)``: its operands promote first
    (``_floats`` computes in the promoted float32/float64), a float16/bfloat16 promotion rounds the
    result once to its type."""
    @functools.wraps(f)
    def run(self: Any, other: Any, *args: Any, **kwargs: Any) -> Any:
        out = f(self, other, *args, **kwargs)
        # the promoted dtype, without building the operands a second time (f built them)
        if isinstance(other, type(self)):
            d = promote(self.dtype, other.dtype)
        elif isinstance(other, (bool, int, float, np.bool_, np.integer, np.floating)):
            d = result_with_scalar(self.dtype, other)
        else:
            d = self._operands(other, f.__name__)[0].dtype
        return out.cast(d) if d.is_narrow_float and out.dtype is float32 else out
    return run


def _exp_top(x: Any) -> float:
    """Below the largest argument whose exp is finite in ``x``'s float type (88.72 / 709.78)."""
    return 709.0 if x.dtype is float64 else 88.0


def _horner(x: Any, coeffs: tuple[float, ...]) -> Any:
    """c0 * x^(n-1) + ... + c(n-1), by Horner's rule (``coeffs`` highest power first)."""
    out = x * coeffs[0] + coeffs[1]
    for c in coeffs[2:]:
        out = out * x + c
    return out


class ElementwiseOps:
    __slots__ = ()

    # ------------------------------------------------------------------ helpers
    def _custom_grad(self, name: str, forward: Callable[..., Any], grad: Callable[..., tuple], *others: Any) -> Any:
        """``forward(self, *others)`` recorded for autograd with ``grad(g, out, self, *others)``
        (Tensors in, one Tensor or None per input out): torch's own gradient formula, for ops whose
        composition would give a different (NaN) gradient at an edge."""
        T = type(self)

        def lazy_grad(g: Any, out: Any, srcs: tuple) -> tuple:
            gs = grad(T(g), T(out), *[T(s) for s in srcs])
            return tuple(None if x is None else x.lazydata for x in gs)

        return T._composite(name, forward, lazy_grad, self, *others)

    def _sign_bit(self) -> Any:
        """True where the sign bit is set, -0.0 and NaN's included (read through a bit cast); float64
        compares instead (OPENCL/CUDA have no int64 to cast to), so a float64 NaN counts as positive."""
        if self.dtype.is_float and self.dtype.itemsize in (2, 4):
            return self.bitcast(int32 if self.dtype.itemsize == 4 else "int16") < 0
        return (self < 0) | ((self == 0) & (self.float().reciprocal() < 0))

    def _floats(self, other: Any, op: str, reverse: bool = False) -> tuple[Any, Any]:
        """The operands promoted, in the float type the op computes in: float64 stays, any other
        promotion computes in float32 (``float_math2`` rounds a narrow float's result back)."""
        a, b = self._operands(other, op, reverse)
        w = float64 if a.dtype is float64 else float32
        return a.cast(w), b.cast(w)

    # ------------------------------------------------------------------ classification
    def isnan(self) -> Any:
        """True where NaN. ``Tensor([1.0, float("nan")]).isnan().tolist() == [False, True]``"""
        return self != self if self.dtype.is_float else self.full_like(False).bool()

    def isinf(self) -> Any:
        """True where +inf or -inf."""
        if not self.dtype.is_float:
            return self.full_like(False).bool()
        return (self == INF) | (self == -INF)

    def isfinite(self) -> Any:
        """True where neither inf nor NaN."""
        if not self.dtype.is_float:
            return self.full_like(True).bool()
        # NOTE: comparisons, not (x - x) == 0, which an algebraic rewrite may fold to True
        return (self < INF) & (self > -INF)

    def nan_to_num(self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Any:
        """NaN, +inf and -inf replaced (by default by 0 and the dtype's largest finite values), as torch.

            >>> Tensor([float("nan"), float("inf"), 1.0]).nan_to_num().tolist()
            [0.0, 3.4028234663852886e+38, 1.0]
        """
        if not self.dtype.is_float:
            return self
        posinf = self.dtype.max if posinf is None else posinf
        neginf = self.dtype.min if neginf is None else neginf
        return self.isnan().where(nan, (self == INF).where(posinf, (self == -INF).where(neginf, self)))

    def isclose(self, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> Any:
        """``|a - b| <= atol + rtol * |b|`` or ``a == b`` (inf included), as torch.isclose."""
        a, b = self._operands(other, "isclose")
        close = a == b
        if not a.dtype.is_float:
            a, b = a.float(), b.float()
        if equal_nan:
            close = close | (a.isnan() & b.isnan())
        err = (a - b).abs()
        return close | (err.isfinite() & (err <= atol + (b * rtol).abs()))

    def allclose(self, other: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False) -> bool:
        """``isclose(...).all()`` as a Python bool (realizes)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    # ------------------------------------------------------------------ sign
    @float_math2
    def copysign(self, other: Any) -> Any:
        """``|a|`` with the sign of ``b`` (float32), -0.0 included.

            >>> Tensor([1.0, 2.0]).copysign(Tensor([-0.0, 3.0])).tolist()
            [-1.0, 2.0]
        """
        # NOTE: a NaN's sign bit cannot be read without a bit cast: NaN ``b`` counts as positive
        a, b = self._floats(other, "copysign")
        # torch's gradient: out / a, 0 where a == 0 (NaN for infinite a)
        return a._custom_grad("COPYSIGN", lambda x, y: y._sign_bit().where(-x.abs(), x.abs()),
                              lambda g, out, x, y: (g * (x == 0).where(0.0, out / x), None), b)

    # ------------------------------------------------------------------ rounding
    def round(self, decimals: int = 0) -> Any:
        """Round half to even (as torch and NumPy); ``decimals`` scales by 10**decimals first.

            >>> Tensor([0.5, 1.5, 2.5, -0.5]).round().tolist()
            [0.0, 2.0, 2.0, -0.0]
        """
        if not self.dtype.is_float:
            return self
        if decimals:
            s = 10.0 ** decimals
            return (self * s).round() / s
        f = self.floor()
        d = self - f           # exact: x and floor(x) are within 1 (or equal where |x| >= 2**23)
        odd = (f * 0.5).floor() * 2 != f
        up = (d > 0.5) | ((d == 0.5) & odd)
        # NOTE: copysign keeps the sign of zero: round(-0.3) is -0.0
        return up.where(f + 1, f).copysign(self)

    def frac(self) -> Any:
        """``x - trunc(x)`` (sign of x; NaN for inf, as torch)."""
        if not self.dtype.is_float:
            raise DTypeError(f"frac: needs a float32 tensor, got {self.dtype.name}")
        return self - self.trunc()

    # ------------------------------------------------------------------ remainders and division
    def fmod(self, other: Any) -> Any:
        """C's fmod: the remainder of truncated division, with the sign of the dividend.

            >>> Tensor([-3.0, 3.0]).fmod(2.0).tolist()
            [-1.0, 1.0]
        """
        a, b = self._operands(other, "fmod")
        if a.dtype is bool_:
            a, b = a.int(), b.int()
        if not a.dtype.is_float:
            return a._alu("MOD", b)          # NOTE: x fmod 0 is 0 here (torch raises)
        return a._custom_grad("FMOD", lambda x, y: x._fmod_float(y),
                              lambda g, out, x, y: (g, -g * x.divide(y, "trunc")), b)

    def _fmod_float(self, b: Any) -> Any:
        a = self
        # NOTE: a - trunc(a/b)*b, then one correction into (-|b|, |b|) with a's sign. The product
        # n*b rounds once n has more bits than b's trailing zeros: the result is then within an
        # ulp of a (not exact, as torch's std::fmod is); for |a/b| >= 2**24 it is not meaningful
        r = a - (a / b).trunc() * b
        ab = b.abs()
        r = ((a >= 0) & (r < 0)).where(r + ab, ((a < 0) & (r > 0)).where(r - ab, r))
        r = (r.abs() >= ab).where(r - (a < 0).where(-ab, ab), r)
        return (b.isinf() & a.isfinite()).where(a, r)

    def remainder(self, other: Any) -> Any:
        """Python's ``%``: the remainder with the sign of the divisor (torch.remainder).

            >>> Tensor([-3.0, 3.0]).remainder(2.0).tolist()
            [1.0, 1.0]
        """
        a, b = self._operands(other, "remainder")
        if not a.dtype.is_float:
            return a.mod(b)

        def fwd(x: Any, y: Any) -> Any:
            r = x._fmod_float(y)
            return ((r != 0) & ((r < 0) != (y < 0))).where(r + y, r)

        return a._custom_grad("REMAINDER", fwd, lambda g, out, x, y: (g, -g * x.divide(y, "floor")), b)

    def divide(self, other: Any, rounding_mode: str | None = None) -> Any:
        """``a / b`` (float), or rounded toward zero (``"trunc"``) or down (``"floor"``), keeping an
        int32 dtype for int32 operands, as torch.div; the rounded quotients have zero gradient.

            >>> Tensor([-7, 7]).divide(2, rounding_mode="trunc").tolist()
            [-3, 3]
        """
        if rounding_mode is None:
            return self.div(other)
        if rounding_mode not in ("trunc", "floor"):
            raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        a, b = self._operands(other, "div")
        if a.dtype is bool_:
            a, b = a.int(), b.int()
        if not a.dtype.is_float:
            return a._alu("IDIV", b) if rounding_mode == "trunc" else a.floordiv(b)
        return a._custom_grad(f"DIV_{rounding_mode.upper()}", lambda x, y: x._rounded_div(y, rounding_mode),
                              lambda g, out, x, y: (None, None), b)     # torch: zero gradients

    def _rounded_div(self, b: Any, rounding_mode: str) -> Any:
        a = self
        if rounding_mode == "trunc":
            return (a / b).trunc()
        # NOTE: torch's div_floor_floating (Python's float //): (a - fmod(a, b)) / b, moved down by
        # one where the remainder's sign differs from b's, then rounded to the nearest integer
        mod = a._fmod_float(b)
        q = (a - mod) / b
        q = ((mod != 0) & ((b < 0) != (mod < 0))).where(q - 1, q)
        fq = q.floor()
        fq = (q - fq > 0.5).where(fq + 1, fq)
        return (b == 0).where(a / b, (q == 0).where((a / b).full_like(0.0).copysign(a / b), fq))

    # ------------------------------------------------------------------ interpolation, log-sum
    @float_math2
    def lerp(self, end: Any, weight: Any) -> Any:
        """``self + weight * (end - self)``, evaluated from the nearer end as torch.lerp.

            >>> Tensor([0.0]).lerp(Tensor([10.0]), 0.25).tolist()
            [2.5]
        """
        a, e = self._floats(end, "lerp")
        w = weight if isinstance(weight, type(self)) else a.full_like(float(weight))
        d = e - a
        # NOTE: torch's two-sided form: exact at weight 0 and 1
        return (w.abs() < 0.5).where(a + w * d, e - d * (1 - w))

    @float_math2
    def logaddexp(self, other: Any) -> Any:
        """``log(exp(a) + exp(b))`` without overflow: ``max + log1p(exp(-|a - b|))``.

            >>> round(Tensor([0.0]).logaddexp(Tensor([0.0])).item(), 4)
            0.6931
        """
        a, b = self._floats(other, "logaddexp")

        def fwd(x: Any, y: Any) -> Any:
            m = x.maximum(y)
            # NOTE: equal infinities give themselves (inf - inf would be NaN)
            return (m.isinf() & (x == y)).where(x, m + (-(x - y).abs()).exp().log1p())

        return a._custom_grad("LOGADDEXP", fwd, lambda g, out, x, y: (g / (1 + (y - x).exp()), g / (1 + (x - y).exp())), b)

    @float_math2
    def hypot(self, other: Any) -> Any:
        """``sqrt(a^2 + b^2)`` without overflow or underflow; inf if either is inf (even with NaN).

            >>> Tensor([3.0]).hypot(Tensor([4.0])).tolist()
            [5.0]
        """
        a, b = self._floats(other, "hypot")

        def fwd(x: Any, y: Any) -> Any:
            ax, ay = x.abs(), y.abs()
            hi, lo = ax.maximum(ay), ax.minimum(ay)
            r = lo / (hi == 0).where(1.0, hi)
            out = hi * (1 + r * r).sqrt()
            return (ax.isinf() | ay.isinf()).where(INF, out)

        return a._custom_grad("HYPOT", fwd, lambda g, out, x, y: (g * x / out, g * y / out), b)

    # ------------------------------------------------------------------ exp and log
    @float_math
    def log10(self) -> Any:
        """Base-10 logarithm."""
        return self.log2() * LOG10_2

    @float_math
    def log1p(self) -> Any:
        """``log(1 + x)``, accurate near 0.

            >>> f"{Tensor([1e-10]).log1p().item():.6g}"
            '1e-10'
        """
        x = self

        def fwd(x: Any) -> Any:
            # NOTE: Goldberg's trick (What every computer scientist should know..., thm. 4):
            # log(u) * x / (u - 1) with u = 1 + x rounded cancels u's rounding error
            u = x + 1.0
            um1 = u - 1.0
            out = (um1 == 0).where(x, u.log() * (x / (um1 == 0).where(1.0, um1)))
            return (x == INF).where(INF, out)

        return x._custom_grad("LOG1P", fwd, lambda g, out, x: (g / (x + 1),))

    @float_math
    def expm1(self) -> Any:
        """``exp(x) - 1``, accurate near 0.

            >>> f"{Tensor([1e-10]).expm1().item():.6g}"
            '1e-10'
        """
        x = self

        def fwd(x: Any) -> Any:
            # NOTE: Kahan's trick: (u - 1) * x / log(u) with u = exp(x) rounded cancels u's error
            u = x.exp()
            um1 = u - 1.0
            lu = u.log()
            mid = um1 * (x / (lu == 0).where(1.0, lu))
            return (um1 == 0).where(x, (um1 == -1).where(-1.0, (u == INF).where(INF, mid)))

        return x._custom_grad("EXPM1", fwd, lambda g, out, x: (g * (out + 1),))

    @float_math
    def erfc(self) -> Any:
        """``1 - erf(x)``, with relative accuracy kept for large x (``erfc(10)`` is ``2.09e-45``).

            >>> f"{Tensor([5.0]).erfc().item():.4e}"
            '1.5375e-12'
        """
        x = self

        def fwd(x: Any) -> Any:
            # NOTE: 1 - erf(x) below 0.5 (erfc >= 0.47 there, no cancellation); above, Numerical
            # Recipes' erfcc (relative error < 1.2e-7 before float32 rounding, ~1e-6 after for
            # x > 5, where exp's argument is about -x^2)
            # float64: 1 - erf(x) up to x = 3 (relative error < 1e-11 there), the fit beyond
            cut = 3.0 if x.dtype is float64 else 0.5
            z = (x < cut).where(cut, x)
            t = 1.0 / (1.0 + 0.5 * z)
            big = t * (-z * z + _horner(t, _ERFC_P[::-1])).exp()
            return (x < cut).where(1.0 - x.erf(), big)

        c = -2.0 / math.sqrt(math.pi)
        return x._custom_grad("ERFC", fwd, lambda g, out, x: (g * c * (-(x * x)).exp(),))

    # ------------------------------------------------------------------ inverse trigonometry
    @float_math
    def atan(self) -> Any:
        """Arctangent, accurate over the whole range (Cephes atanf's range reduction).

            >>> round(Tensor([1.0]).atan().item(), 6)
            0.785398
        """
        x = self

        def fwd(x: Any) -> Any:
            # NOTE: |x| > tan(3pi/8): pi/2 + atan(-1/|x|); |x| > tan(pi/8): pi/4 + atan((|x|-1)/(|x|+1));
            # else the polynomial on x itself (keeps -0.0). The reciprocals are guarded so that no
            # dropped branch divides by zero.
            ax = x.abs()
            big, mid = ax > _TAN_3PI_8, ax > _TAN_PI_8
            r = big.where(-1.0 / big.where(ax, 1.0), mid.where((ax - 1.0) / (ax + 1.0), x))
            z = r * r
            p = _horner(z, _ATAN_P) * z * r + r
            if p.dtype is float64:
                # NOTE: the polynomial is float32's (1.9e-7); one Newton step on tan(p) = r, with
                # |r| <= tan(pi/8), gives float64's accuracy (the error squares)
                c = p.cos()
                p = p - (p.sin() - r * c) * c
            reduced = big.where(x.full_like(PI / 2), PI / 4) + p      # pi/2 in x's own float type
            return mid.where((x < 0).where(-reduced, reduced), p)

        return x._custom_grad("ATAN", fwd, lambda g, out, x: (g / (x * x + 1),))

    @float_math2
    def atan2(self, other: Any) -> Any:
        """The angle of the point (x=other, y=self) in [-pi, pi], with C's signed zeros and infinities.

            >>> round(Tensor([1.0]).atan2(Tensor([-1.0])).item(), 6)
            2.356194
        """
        y, x = self._floats(other, "atan2")

        def fwd(y: Any, x: Any) -> Any:
            ay, ax = y.abs(), x.abs()
            both_inf = ay.isinf() & ax.isinf()
            q = (both_inf | ((ay == 0) & (ax == 0))).where(ay.minimum(1.0), ay / ax)   # inf/inf -> 1, 0/0 -> 0
            r = q.atan()
            r = x._sign_bit().where(PI - r, r)
            return y._sign_bit().where(-r, r)

        def grad(g: Any, out: Any, y: Any, x: Any) -> tuple:
            # torch's atan2_backward: grad * other * recip, grad * -self * recip, recip 0 where
            # x^2 + y^2 is 0 (at the origin, and where the squares underflow)
            d = y * y + x * x
            recip = (d == 0).where(0.0, d.reciprocal())
            return g * x * recip, g * -y * recip

        return y._custom_grad("ATAN2", fwd, grad, x)

    arctan2 = atan2

    @float_math
    def asin(self) -> Any:
        """Arcsine: ``atan(x / sqrt((1 - x)(1 + x)))``; NaN outside [-1, 1].

            >>> round(Tensor([0.5]).asin().item(), 6)
            0.523599
        """
        x = self
        # NOTE: (1 - x)(1 + x), not 1 - x^2: no cancellation near |x| = 1
        return x._custom_grad("ASIN", lambda x: (x / ((1 - x) * (1 + x)).sqrt()).atan(),
                              lambda g, out, x: (g / ((1 - x) * (1 + x)).sqrt(),))

    @float_math
    def acos(self) -> Any:
        """Arccosine: ``2 atan(sqrt((1 - x) / (1 + x)))``; NaN outside [-1, 1].

            >>> round(Tensor([0.5]).acos().item(), 6)
            1.047198
        """
        x = self
        # NOTE: not pi/2 - asin(x), which cancels near x = 1
        return x._custom_grad("ACOS", lambda x: ((1 - x) / (1 + x)).sqrt().atan() * 2.0,
                              lambda g, out, x: (-g / ((1 - x) * (1 + x)).sqrt(),))

    # ------------------------------------------------------------------ hyperbolic
    @float_math
    def sinh(self) -> Any:
        """Hyperbolic sine, accurate near 0 (through expm1) and finite up to 89.4 (float32; 710.4 in float64).

            >>> round(Tensor([1.0]).sinh().item(), 5)
            1.1752
        """
        x = self

        def fwd(x: Any) -> Any:
            ax = x.abs()
            top = _exp_top(x)
            e = ax.minimum(top).expm1()
            small = 0.5 * (e + e / (e + 1))
            # NOTE: exp(|x|) overflows at 88.7 but sinh at 89.4 (float32): exp(|x|/2)^2 / 2 in between
            h = (0.5 * ax).exp()
            return (ax > top).where((0.5 * h) * h, small).copysign(x)

        return x._custom_grad("SINH", fwd, lambda g, out, x: (g * x.cosh(),))

    @float_math
    def cosh(self) -> Any:
        """Hyperbolic cosine, finite up to 89.4 (float32; 710.4 in float64).

            >>> round(Tensor([1.0]).cosh().item(), 5)
            1.54308
        """
        x = self

        def fwd(x: Any) -> Any:
            ax = x.abs()
            top = _exp_top(x)
            e = ax.minimum(top).exp()
            h = (0.5 * ax).exp()
            return (ax > top).where((0.5 * h) * h, 0.5 * (e + 1.0 / e))

        return x._custom_grad("COSH", fwd, lambda g, out, x: (g * x.sinh(),))

    @float_math
    def asinh(self) -> Any:
        """Inverse hyperbolic sine: ``log1p(|x| + x^2 / (1 + sqrt(1 + x^2)))`` with x's sign.

            >>> round(Tensor([1.0]).asinh().item(), 6)
            0.881374
        """
        x = self

        def fwd(x: Any) -> Any:
            ax = x.abs()
            big = ax > 2.0 ** 28          # NOTE: there x^2 + 1 is x^2: log(2|x|) (x^2 could overflow)
            s = big.where(1.0, ax)
            out = big.where(ax.log() + LN_2, (s + s * s / (1 + (1 + s * s).sqrt())).log1p())
            return out.copysign(x)

        return x._custom_grad("ASINH", fwd, lambda g, out, x: (g * (x * x + 1).rsqrt(),))

    @float_math
    def acosh(self) -> Any:
        """Inverse hyperbolic cosine: ``log1p(t + sqrt(2t + t^2))``, t = x - 1; NaN below 1.

            >>> round(Tensor([2.0]).acosh().item(), 6)
            1.316958
        """
        x = self

        def fwd(x: Any) -> Any:
            big = x > 2.0 ** 28
            t = big.where(1.0, x) - 1.0
            out = big.where(x.log() + LN_2, (t + (2 * t + t * t).sqrt()).log1p())
            return (x < 1).where(NAN, out)      # t * t overflows for x below -1.8e19

        return x._custom_grad("ACOSH", fwd, lambda g, out, x: (g * (x * x - 1).rsqrt(),))

    @float_math
    def atanh(self) -> Any:
        """Inverse hyperbolic tangent: ``log1p(2|x| / (1 - |x|)) / 2`` with x's sign; +-inf at +-1.

            >>> round(Tensor([0.5]).atanh().item(), 6)
            0.549306
        """
        x = self

        def fwd(x: Any) -> Any:
            ax = x.abs()
            return (0.5 * (2 * ax / (1 - ax)).log1p()).copysign(x)

        return x._custom_grad("ATANH", fwd, lambda g, out, x: (g / (1 - x * x),))

    arcsin, arccos, arctan, arcsinh, arccosh, arctanh = asin, acos, atan, asinh, acosh, atanh

    # ------------------------------------------------------------------ activations
    @float_math
    def softsign(self) -> Any:
        """``x / (1 + |x|)``.

            >>> Tensor([-1.0, 3.0]).softsign().tolist()
            [-0.5, 0.75]
        """
        return self / (1 + self.abs())

    @float_math
    def selu(self) -> Any:
        """``scale * elu(x, alpha)`` with torch's constants (alpha 1.6733, scale 1.0507).

            >>> round(Tensor([1.0]).selu().item(), 4)
            1.0507
        """
        x = self
        # NOTE: expm1 of x-or-0 (a select, not minimum, whose gradient splits at 0): accurate near 0,
        # and no inf in the branch where() drops
        pos = x > 0
        return pos.where(x * SELU_SCALE, pos.where(0.0, x).expm1() * (SELU_ALPHA * SELU_SCALE))

    @float_math
    def celu(self, alpha: float = 1.0) -> Any:
        """``max(0, x) + min(0, alpha * (exp(x / alpha) - 1))``.

            >>> round(Tensor([-1.0]).celu().item(), 4)
            -0.6321
        """
        if alpha == 0:
            raise ValueError("celu: alpha must not be 0")
        x = self
        pos = x > 0          # NOTE: select, as selu
        return pos.where(x, (pos.where(0.0, x) * (1.0 / alpha)).expm1() * alpha)

    @float_math
    def quick_gelu(self) -> Any:
        """``x * sigmoid(1.702 x)`` (the GELU approximation of CLIP).

            >>> round(Tensor([1.0]).quick_gelu().item(), 4)
            0.8458
        """
        return self * (self * 1.702).sigmoid()

    # ------------------------------------------------------------------ bit shifts (integers)
    def _shift_operands(self, other: Any, op: str, reverse: bool) -> tuple[Any, Any, int]:
        """The promoted operands and their width in bits."""
        a, b = self._operands(other, op, reverse)
        if not a.dtype.is_int:
            raise DTypeError(f"{op}: shifts need integer tensors (int8, uint8, int16, int32, uint32, int64), "
                             f"got {a.dtype.name}")
        return a, b, 8 * a.dtype.itemsize

    @staticmethod
    def _pow2(b: Any, bits: int) -> Any:
        """2**b for b in [0, bits) in b's dtype (2**(bits-1) of a signed type wraps to its minimum: the
        bit pattern)."""
        out = b.ones_like()
        for bit in range(bits.bit_length() - 1):
            out = ((b & (1 << bit)) != 0).where(out * (1 << (1 << bit)), out)
        return out

    def bitwise_left_shift(self, other: Any, reverse: bool = False) -> Any:
        """``a << b`` on integers, bits beyond the type's width dropped (wraps); 0 for b < 0 or b >=
        the width, as torch.

            >>> (Tensor([1, -3]) << 2).tolist()
            [4, -12]
        """
        a, b, bits = self._shift_operands(other, "bitwise_left_shift", reverse)
        ok = (b >= 0) & (b < bits)
        # NOTE: a * 2**b with wrap-around is the shift's bit pattern, negative a included
        return ok.where(a * self._pow2(ok.where(b, 0), bits), 0)

    def bitwise_right_shift(self, other: Any, reverse: bool = False) -> Any:
        """``a >> b``: arithmetic on signed integers (rounds down; b < 0 or b >= width - 1 shifts by
        width - 1), logical on unsigned ones (0 for b < 0 or b >= width), as torch.

            >>> (Tensor([-7, 7]) >> 1).tolist()
            [-4, 3]
        """
        a, b, bits = self._shift_operands(other, "bitwise_right_shift", reverse)
        if a.dtype.name.startswith("u"):
            ok = (b >= 0) & (b < bits)
            # NOTE: 2**(bits-1) is positive in an unsigned type: floor division is the logical shift
            return ok.where(a.floordiv(self._pow2(ok.where(b, 0), bits)), 0)
        ok = (b >= 0) & (b < bits - 1)
        # NOTE: floor division by 2**b (0 <= b <= bits - 2, a positive divisor) is the arithmetic shift
        return ok.where(a.floordiv(self._pow2(ok.where(b, 0), bits)), (a < 0).where(-1, 0))

    def __lshift__(self, o: Any) -> Any: return self.bitwise_left_shift(o)
    def __rlshift__(self, o: Any) -> Any: return self.bitwise_left_shift(o, True)
    def __rshift__(self, o: Any) -> Any: return self.bitwise_right_shift(o)
    def __rrshift__(self, o: Any) -> Any: return self.bitwise_right_shift(o, True)
