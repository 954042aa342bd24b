"""Kernel (a body of KNodes) -> loop IR, as a flat list of named passes.

``lower_kernel`` runs, in order:
1. ``output_loops``: one loop per output axis (size-1 axes get index 0).
2. ``render``: the body is evaluated per output element by a recursive index function. Movement
   ops transform the symbolic index (``symbolic.Lin``) instead of moving data -- reshape through
   linearize/delinearize with bound-aware simplification, permute by reordering, expand by zeroing,
   shrink by offsetting, flip by mirroring, pad by offsetting plus a validity mask that clamps the
   load and selects 0. A reduction opens its own loops at the point of use with an accumulator.
   Values are memoized per (node, index, mask) within the loop scope that computed them.
3. ``store``: the output element at its contiguous index.
"""
from __future__ import annotations

import math
from typing import Any

from eqgrad.dtype import DType, bool_
from eqgrad.graph.plan import Kernel, KernelPlan, KNode
from eqgrad.ops import numel, reduce_identity
from eqgrad.graph.loopir import INDEX, NONNEG, LInst, LoopKernel
from eqgrad.lower.symbolic import Div, Lin, Mod, Var, substitute_free


def strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc if s != 1 else 0)
        acc *= s
    return tuple(reversed(st))


class Lowerer:
    def __init__(self, kernel: Kernel, plan: KernelPlan, upcast: tuple[int, int] | None = None):
        self.kernel = kernel
        self.upcast = upcast          # (lanes on the last output axis, lanes on the one before); None: heuristic
        self.param_of: dict[int, int] = {kernel.out: 0}
        self.params: list[tuple[str, DType, bool]] = [(f"b{kernel.out}", plan.buffers[kernel.out][1], True)]
        for b in kernel.inputs:
            self.param_of[b] = len(self.params)
            self.params.append((f"b{b}", plan.buffers[b][1], False))
        self.insts: list[LInst] = []
        self.scopes: list[dict[Any, int]] = [{}]
        self.vars: dict[str, int] = {}
        self.n_ranges = 0

    # ------------------------------------------------------------------ emission with scoped CSE
    def emit(self, op: str, dtype: Any, src: tuple[int, ...] = (), arg: Any = None, cse: bool = True) -> int:
        key = ("i", op, dtype, src, arg)
        if cse:
            for sc in reversed(self.scopes):
                if key in sc:
                    return sc[key]
        self.insts.append(LInst(op, dtype, src, arg))
        i = len(self.insts) - 1
        if cse:
            self.scopes[-1][key] = i
        return i

    def const(self, v: Any, dtype: Any) -> int:
        return self.emit("CONST", dtype, (), v)

    def open_range(self, extent: int) -> Lin:
        name = f"r{self.n_ranges}"
        self.n_ranges += 1
        rid = self.emit("RANGE", INDEX, (), extent, cse=False)
        self.vars[name] = rid
        self.scopes.append({})
        return Lin.var(name, extent)

    def close_range(self, lin: Lin) -> None:
        name = lin.terms[0][0].name
        self.scopes.pop()
        self.emit("ENDRANGE", None, (self.vars[name],), cse=False)

    # ------------------------------------------------------------------ index expressions
    def index(self, x: Lin) -> int:
        acc: int | None = None
        for atom, c in x.terms:
            if isinstance(atom, Var):
                a = self.vars[atom.name]
            else:
                assert isinstance(atom, (Div, Mod))
                # floor semantics; truncating instructions only where the bounds prove x >= 0
                sign = NONNEG if atom.x.bounds[0] >= 0 else None
                a = self.emit("IDIV" if isinstance(atom, Div) else "MOD", INDEX,
                              (self.index(atom.x), self.const(atom.d, INDEX)), sign)
            if c != 1:
                a = self.emit("MUL", INDEX, (a, self.const(c, INDEX)))
            acc = a if acc is None else self.emit("ADD", INDEX, (acc, a))
        if acc is None:
            return self.const(x.const, INDEX)
        if x.const:
            acc = self.emit("ADD", INDEX, (acc, self.const(x.const, INDEX)))
        return acc

    def in_range(self, x: Lin, n: int) -> int | None:
        """Bool instruction for 0 <= x < n, or None when the bounds prove it."""
        lo, hi = x.bounds
        conds = []
        if lo < 0:
            conds.append(self.emit("CMPLT", bool_, (self.const(-1, INDEX), self.index(x))))
        if hi >= n:
            conds.append(self.emit("CMPLT", bool_, (self.index(x), self.const(n, INDEX))))
        return self.and_(conds)

    def and_(self, conds: list[int | None]) -> int | None:
        out = None
        for c in conds:
            if c is None:
                continue
            out = c if out is None else self.emit("AND", bool_, (out, c))
        return out

    # ------------------------------------------------------------------ the recursive index function
    def render(self, n: KNode, idx: tuple[Lin, ...], valid: int | None) -> int:
        key = ("n", id(n), idx, valid)
        for sc in reversed(self.scopes):
            if key in sc:
                return sc[key]
        v = self._render(n, idx, valid)
        self.scopes[-1][key] = v
        return v

    def _render(self, n: KNode, idx: tuple[Lin, ...], valid: int | None) -> int:
        op = n.op
        if op == "CONST":
            return self.const(n.arg, n.dtype)
        if op == "BUF":
            flat = Lin.num(0)
            for i, st in zip(idx, strides_of(n.shape)):
                flat = flat + i * st
            fi = self.index(flat)
            if valid is not None:
                fi = self.emit("WHERE", INDEX, (valid, fi, self.const(0, INDEX)))
            return self.emit("LOAD", n.dtype, (self.param_of[n.arg], fi))
        if op in ("RSUM", "RMAX"):
            return self._reduce(n, idx, valid)
        if op == "PAD":
            before, _after = n.arg
            src = n.src[0]
            cidx = tuple(i - b for i, b in zip(idx, before))
            mask = self.and_([self.in_range(ci, s) for ci, s in zip(cidx, src.shape)])
            inner = self.render(src, cidx, self.and_([valid, mask]))
            if mask is None:
                return inner
            return self.emit("WHERE", n.dtype, (mask, inner, self.const(_zero(n.dtype), n.dtype)))
        if op in ("RESHAPE", "PERMUTE", "EXPAND", "SHRINK", "FLIP"):
            return self.render(n.src[0], self.move_index(n, idx), valid)
        srcs = tuple(self.render(s, idx, valid) for s in n.src)
        return self.emit(op, n.arg if op == "CAST" else n.dtype, srcs, None)

    def move_index(self, n: KNode, idx: tuple[Lin, ...]) -> tuple[Lin, ...]:
        src = n.src[0]
        if 0 in src.shape:      # nothing is ever read from an empty tensor
            return tuple(Lin.num(0) for _ in src.shape)
        if n.op == "RESHAPE":
            flat = Lin.num(0)
            for i, st in zip(idx, _full_strides(n.shape)):
                flat = flat + i * st
            out = []
            for s, st in zip(src.shape, _full_strides(src.shape)):
                out.append(Lin.num(0) if s == 1 else (flat // st) % s)
            return tuple(out)
        if n.op == "PERMUTE":
            out: list[Lin] = [Lin.num(0)] * len(idx)
            for i, p in enumerate(n.arg):
                out[p] = idx[i]
            return tuple(out)
        if n.op == "EXPAND":
            return tuple(Lin.num(0) if s == 1 else i for i, s in zip(idx, src.shape))
        if n.op == "SHRINK":
            return tuple(i + b for i, b in zip(idx, n.arg[0]))
        if n.op == "FLIP":
            return tuple(Lin.num(s - 1) - i if d in n.arg else i for d, (i, s) in enumerate(zip(idx, n.shape)))
        raise NotImplementedError(n.op)

    def _reduce(self, n: KNode, idx: tuple[Lin, ...], valid: int | None) -> int:
        return self._reduce_lanes(n, (idx,), (valid,))[0]

    # ------------------------------------------------------------------ hoisting (row fusion)
    def hoist(self, out_idx: list[Lin | None]) -> bool:
        """Render now, in the current loop, every reduction whose index depends only on the output
        loops open so far (``out_idx`` is None for the axes still to open). This is what lets one
        kernel hold softmax or layernorm: each row's max/sum/mean/variance is reduced once, in
        its own loop inside the row loop, before the loop over the row's outputs, instead of
        once per output element. Reductions that use other hoisted ones (the variance uses the
        mean) come after them. Returns whether anything was hoisted."""
        root = self.kernel.ast
        idx = tuple(i if i is not None else Lin.var(f"_o{d}", s) for d, (i, s) in enumerate(zip(out_idx, root.shape)))
        order: list[tuple[KNode, tuple[Lin, ...]]] = []
        seen: set = set()

        def walk(n: KNode, ix: tuple[Lin, ...]) -> None:
            if (id(n), ix) in seen or not self.has_reduce[id(n)] or n.op == "PAD":   # masked reads stay put
                return
            seen.add((id(n), ix))
            for x, cix in self._dry_sources(n, ix, "_r"):
                walk(x, cix)
            if n.op in ("RSUM", "RMAX") and n is not root and not any(
                    v.startswith("_") for i in ix for v in substitute_free(i)):
                order.append((n, ix))             # after the reductions it uses

        walk(root, idx)
        before = len(self.insts)
        for n, ix in order:
            self.render_lanes(n, (ix,), (None,))      # the key the main pass looks up
        return len(self.insts) > before

    # ------------------------------------------------------------------ lanes (upcast)
    # A kernel whose output axes are upcast renders several output elements ("lanes") at once.
    # Subtrees without reductions are rendered lane by lane (CSE shares what the lanes have in
    # common); a reduction renders ONE loop nest with one accumulator per lane, so e.g. a matmul
    # tile keeps its lanes' partial sums in registers and LLVM's SLP vectorizer packs them.
    def render_lanes(self, n: KNode, idxs: tuple, valids: tuple) -> tuple[int, ...]:
        if not self.has_reduce[id(n)]:
            return tuple(self.render(n, i, v) for i, v in zip(idxs, valids))
        key = ("l", id(n), idxs, valids)
        for sc in reversed(self.scopes):
            if key in sc:
                return sc[key]
        out = self._render_lanes(n, idxs, valids)
        self.scopes[-1][key] = out
        return out

    def _render_lanes(self, n: KNode, idxs: tuple, valids: tuple) -> tuple[int, ...]:
        op = n.op
        if op in ("RSUM", "RMAX"):
            return self._reduce_lanes(n, idxs, valids)
        if op == "PAD":
            return tuple(self._render(n, i, v) for i, v in zip(idxs, valids))
        if op in ("RESHAPE", "PERMUTE", "EXPAND", "SHRINK", "FLIP"):
            return self.render_lanes(n.src[0], tuple(self.move_index(n, i) for i in idxs), valids)
        srcs = [self.render_lanes(s, idxs, valids) for s in n.src]
        dt = n.arg if op == "CAST" else n.dtype
        return tuple(self.emit(op, dt, tuple(sv[lane] for sv in srcs), None) for lane in range(len(idxs)))

    # Blocked float sums (docs/semantics.md "Sums", docs/lowering.md "blocked sums"). A float sum of
    # more than SUM_BLOCK elements is split into levels, each with its own accumulator, so that no
    # accumulator adds more than SUM_BLOCK (innermost and outermost level) or SUM_RADIX (the levels
    # between) values: the rounding error is then bounded by sum_error_terms(n) * 2**-24 * sum|x|
    # whatever the device does with the innermost loop (LLVM vectorizes it, which only shortens it).
    SUM_BLOCK = 1024              # values per innermost block (and most iterations of the outermost level)
    SUM_RADIX = 32                # values per accumulator of the levels between

    def _reduce_lanes(self, n: KNode, idxs: tuple, valids: tuple) -> tuple[int, ...]:
        """One loop nest over the reduced axes, one accumulator per lane.

        Float sums of more than ``SUM_BLOCK`` elements are *blocked* (``_sum_levels``): a single
        float accumulator over n values has an error bound of (n - 1) ulps of the running sum (a
        sequential sum of 1e6 x 0.1f: 2.2e-4 relative; 1e9 ones saturate at 2**24 per accumulator);
        with levels no accumulator adds more than 1024 values."""
        src = n.src[0]
        accs = tuple(self.emit("DEFACC", n.dtype, (), reduce_identity(n.op, n.dtype), cse=False) for _ in idxs)
        axes = [d for d in n.arg if src.shape[d] > 1]
        sub: dict[int, Lin] = {d: Lin.num(0) for d in n.arg if src.shape[d] <= 1}
        if 0 not in src.shape:              # an empty axis means the identity
            blocked = (n.op == "RSUM" and n.dtype.is_float
                       and numel(tuple(src.shape[d] for d in axes)) > self.SUM_BLOCK)
            self._reduce_axes(n, idxs, valids, axes, 0, sub, accs, blocked)
        return tuple(self.emit("ACCREAD", n.dtype, (acc,), cse=False) for acc in accs)

    def _reduce_axes(self, n: KNode, idxs: tuple, valids: tuple, axes: list[int], k: int,
                     sub: dict[int, Lin], accs: tuple[int, ...], blocked: bool) -> None:
        """Reduce ``axes[k:]`` of ``n``'s source into ``accs`` (one per lane). An axis that, with the
        axes inside it, sums at most ``SUM_BLOCK`` values is one plain loop; a longer one (blocked
        sums only) is split into levels by ``_sum_levels``."""
        src = n.src[0]
        if k == len(axes):
            cidxs = tuple(tuple(sub.get(d, i) for d, i in enumerate(idx)) for idx in idxs)
            vals = self.render_lanes(src, cidxs, valids)
            for acc, v in zip(accs, vals):
                self.emit("ACCUM", None, (acc, v), "ADD" if n.op == "RSUM" else "MAX", cse=False)
            return
        d, e = axes[k], src.shape[axes[k]]
        inner = numel(tuple(src.shape[a] for a in axes[k + 1:]))
        if not blocked or e * inner <= self.SUM_BLOCK:
            r = self.open_range(e)
            self._reduce_axes(n, idxs, valids, axes, k + 1, {**sub, d: r}, accs, blocked)
            self.close_range(r)
            return
        # the axes inside sum into the innermost level directly, or (when they are long) into their
        # own accumulator that adds one value per iteration
        block = self.SUM_BLOCK // inner if 2 * inner <= self.SUM_BLOCK else self.SUM_BLOCK
        first = True
        for offset, extents in sum_pieces(e, block, self.SUM_RADIX, self.SUM_BLOCK):
            tgt = accs if first else self._fresh_accs(n, len(accs))
            self._sum_levels(n, idxs, valids, axes, k, sub, tgt, offset, extents)
            if not first:
                self._fold(n, accs, tgt)
            first = False

    def _sum_levels(self, n: KNode, idxs: tuple, valids: tuple, axes: list[int], k: int,
                    sub: dict[int, Lin], accs: tuple[int, ...], offset: int, extents: tuple[int, ...]) -> None:
        """One piece of a blocked axis: loops ``extents`` (outermost first) over the elements
        ``offset + r0 * (e1 * e2 ...) + r1 * (e2 ...) + ...``; each loop adds into its own
        accumulator, folded into the enclosing loop's accumulator after the loop."""
        d = axes[k]
        loops: list[Lin] = []
        levels: list[tuple[int, ...]] = [accs]
        for j, ext in enumerate(extents):
            if j:
                levels.append(self._fresh_accs(n, len(accs)))
            loops.append(self.open_range(ext))
        pos, stride = Lin.num(offset), 1
        for r, ext in zip(reversed(loops), reversed(extents)):
            pos, stride = pos + r * stride, stride * ext
        inner = numel(tuple(n.src[0].shape[a] for a in axes[k + 1:]))
        if 2 * inner > self.SUM_BLOCK:
            part = self._fresh_accs(n, len(accs))
            self._reduce_axes(n, idxs, valids, axes, k + 1, {**sub, d: pos}, part, True)
            self._fold(n, levels[-1], part)
        else:
            self._reduce_axes(n, idxs, valids, axes, k + 1, {**sub, d: pos}, levels[-1], True)
        for j in range(len(loops) - 1, -1, -1):
            self.close_range(loops[j])
            if j:
                self._fold(n, levels[j - 1], levels[j])

    def _fresh_accs(self, n: KNode, lanes: int) -> tuple[int, ...]:
        return tuple(self.emit("DEFACC", n.dtype, (), reduce_identity(n.op, n.dtype), cse=False) for _ in range(lanes))

    def _fold(self, n: KNode, into: tuple[int, ...], part: tuple[int, ...]) -> None:
        for a, p in zip(into, part):
            self.emit("ACCUM", None, (a, self.emit("ACCREAD", n.dtype, (p,), cse=False)), "ADD", cse=False)

    def choose_upcast(self) -> dict[int, int]:
        """Output axes to split into register lanes: {axis: lanes}. Only for kernels with a
        reduction whose output's last axis is not reduced (matmul, column sums): their lanes read
        contiguous memory. Other kernels vectorize their innermost loop without help."""
        root = self.kernel.ast
        shape = root.shape
        big = [d for d, n in enumerate(shape) if n > 1]
        if not self.has_reduce[id(root)] or not big:
            return {}
        last = big[-1]          # the innermost output axis with more than one element (a reduction
                                # kept as its own kernel ends in a size-1 axis)
        if not self._contiguous_under_reduce(root, last):
            return {}
        body = len(root.walk())
        up: dict[int, int] = {}
        if self.upcast is not None:             # forced by the kernel search (or a user)
            w1s, w0s = (self.upcast[0],), (self.upcast[1],)
        else:
            w1s, w0s = (16, 8, 4), (8, 4, 2)
        w1 = next((w for w in w1s if w > 1 and shape[last] % w == 0 and body * w <= 8192), 1)
        if w1 > 1:
            up[last] = w1
            prev = next((d for d in range(last - 1, -1, -1) if shape[d] > 1), None)
            if prev is not None:
                w0 = next((w for w in w0s if w > 1 and shape[prev] % w == 0 and body * w * w1 <= 8192), 1)
                if w0 > 1:
                    up[prev] = w0
        return up

    TILE_BLOCKS = 8               # register blocks of the outer lane axis per cache tile
    TILE_MIN_STREAM = 1 << 20     # bytes a block's reduce loop streams from the lane-axis operand

    def choose_tile(self, up: dict[int, int]) -> tuple[int, int] | None:
        """Cache tiling of a two-axis register block (matmul-like): (axis, blocks) or None.

        Loops are normally (outer blocks, inner blocks, reduce): every outer block streams the
        whole lane operand (B of A @ B) again, from DRAM once it outgrows the cache (matmul 2048:
        16 MB per block row). Tiling visits ``TILE_BLOCKS`` outer blocks per inner block, loops
        (outer tiles, inner blocks, outer blocks within the tile, reduce), so each strip of the
        lane operand is reused from cache ``TILE_BLOCKS`` times."""
        if len(up) != 2:
            return None
        outer, inner = sorted(up)
        root = self.kernel.ast
        n_outer = root.shape[outer] // up[outer]
        t = self.TILE_BLOCKS
        if n_outer < 2 * t or n_outer % t:
            return None
        red = max((numel(n.src[0].shape) // max(1, numel(n.shape)) for n in root.walk()
                   if n.op in ("RSUM", "RMAX")), default=1)
        if red * root.shape[inner] * 4 < self.TILE_MIN_STREAM:
            return None
        return outer, t

    def _dry_sources(self, n: KNode, idx: tuple[Lin, ...], tag: str) -> list[tuple[KNode, tuple[Lin, ...]]]:
        """The sources of ``n`` with the index each is read at, as the render pass maps them: a
        reduction's reduced axes become fresh variables named ``{tag}{id}_{axis}``. For the dry
        runs of the index function (``hoist``, ``_contiguous_under_reduce``)."""
        if n.op in ("RSUM", "RMAX"):
            src = n.src[0]
            return [(src, tuple(Lin.var(f"{tag}{id(n)}_{d}", src.shape[d]) if d in n.arg else i
                                for d, i in enumerate(idx)))]
        if n.op == "PAD":
            return [(n.src[0], tuple(i - b for i, b in zip(idx, n.arg[0])))]
        if n.op in ("RESHAPE", "PERMUTE", "EXPAND", "SHRINK", "FLIP"):
            return [(n.src[0], self.move_index(n, idx))]
        return [(x, idx) for x in n.src]

    def _contiguous_under_reduce(self, root: KNode, axis: int) -> bool:
        """Does some buffer read inside a reduction step by exactly 1 along output ``axis``?
        (A dry run of the index function, with symbolic output and reduce variables.)"""
        out = tuple(Lin.var(f"o{d}", s) for d, s in enumerate(root.shape))
        target = f"o{axis}"
        stack: list[tuple[KNode, tuple[Lin, ...], bool]] = [(root, out, False)]
        seen: set = set()
        while stack:
            n, idx, under = stack.pop()
            if (id(n), idx) in seen:
                continue
            seen.add((id(n), idx))
            if n.op == "BUF" and under:
                flat = Lin.num(0)
                for i, st in zip(idx, strides_of(n.shape)):
                    flat = flat + i * st
                # only a load streamed by the reduce loop counts (not a broadcast operand like a max)
                streamed = any(isinstance(a, Var) and a.name.startswith("r") for a, _ in flat.terms)
                if streamed and any(isinstance(a, Var) and a.name == target and c == 1 for a, c in flat.terms):
                    return True
            else:
                under = under or n.op in ("RSUM", "RMAX")
                stack.extend((x, cix, under) for x, cix in self._dry_sources(n, idx, "r"))
        return False

    # ------------------------------------------------------------------ passes
    def lower(self) -> LoopKernel:
        root = self.kernel.ast
        self.has_reduce: dict[int, bool] = {}
        for n in root.walk():
            self.has_reduce[id(n)] = n.op in ("RSUM", "RMAX") or any(self.has_reduce[id(x)] for x in n.src)
        up = self.choose_upcast()
        tile = self.choose_tile(up)
        loops, out_idx, lane_axes = [], [None] * len(root.shape), []
        parallel = None          # output loops before the first hoisted reduction
        for d in range(len(root.shape)):
            s, w = root.shape[d], up.get(d, 1)
            if s <= 1:
                out_idx[d] = Lin.num(0)
            elif s // w == 1:
                out_idx[d] = Lin.num(0)
                lane_axes.append(d)
            elif tile is not None and d == tile[0]:
                r = self.open_range(s // (w * tile[1]))       # the tile loop; its inner loop opens last
                loops.append(r)
                out_idx[d] = r * (w * tile[1])
                lane_axes.append(d)
            else:
                r = self.open_range(s // w)
                loops.append(r)
                out_idx[d] = r * w
                if w > 1:
                    lane_axes.append(d)
                elif not up and self.hoist(out_idx) and parallel is None:
                    parallel = len(loops)
        if not loops and not up:
            self.hoist(out_idx)           # e.g. a full variance: the mean before the sum of squares
        if tile is not None:
            r = self.open_range(tile[1])
            loops.append(r)
            out_idx[tile[0]] = out_idx[tile[0]] + r * up[tile[0]]
        if 0 not in root.shape:
            lanes = [tuple(out_idx)]
            for d in lane_axes:      # lanes: every combination of offsets on the upcast axes
                lanes = [l[:d] + (l[d] + u,) + l[d + 1:] for l in lanes for u in range(up.get(d, root.shape[d]))]
            vals = self.render_lanes(root, tuple(lanes), (None,) * len(lanes))
            for idx, v in zip(lanes, vals):
                flat = Lin.num(0)
                for i, st in zip(idx, strides_of(root.shape)):
                    flat = flat + i * st
                self.emit("STORE", None, (0, self.index(flat), v), cse=False)   # src[0]: parameter 0
        for r in reversed(loops):
            self.close_range(r)
        return LoopKernel(self.kernel.name, self.params, self._params_first(), loop_vectorize=not up,
                          parallel=len(loops) if parallel is None else parallel)

    def _params_first(self) -> list[LInst]:
        """Prefix PARAM instructions and renumber: loads/stores refer to parameters by number."""
        shift = len(self.params)
        head = [LInst("PARAM", d, (), i) for i, (_, d, _) in enumerate(self.params)]
        out = []
        for x in self.insts:
            if x.op == "LOAD":
                out.append(LInst("LOAD", x.dtype, (x.src[0], x.src[1] + shift), None))
            elif x.op == "STORE":
                out.append(LInst("STORE", None, (0, x.src[1] + shift, x.src[2] + shift), None))
            else:
                out.append(LInst(x.op, x.dtype, tuple(s + shift for s in x.src), x.arg))
        return head + out


def sum_pieces(e: int, block: int, radix: int, top: int) -> list[tuple[int, tuple[int, ...]]]:
    """Split ``e`` iterations into pieces of nested loops for a blocked sum: [(offset, extents
    outermost first)], biggest piece first. The extents are the digits of ``e`` in the mixed radix
    (innermost first) ``block``, ``radix``, ``radix``, ..., with as few ``radix`` levels as keep the
    outermost digit below ``top`` (so that the outermost loop is long enough to share between
    threads or work-items). Loops of one iteration are left out.

    >>> sum_pieces(1_000_000, 1024, 32, 1024)
    [(0, (976, 1024)), (999424, (576,))]
    """
    q, mids = e // block, 0
    while q // radix ** mids >= top:
        mids += 1
    radices = [block] + [radix] * mids + [0]        # 0: the outermost digit is unbounded (< top)
    digits, rest = [], e
    for rad in radices:
        digits.append(rest % rad if rad else rest)
        rest = rest // rad if rad else 0
    pieces, offset = [], 0
    for p in range(len(digits) - 1, -1, -1):       # most significant digit first
        if digits[p]:
            ext = (digits[p],) + tuple(radices[:p][::-1])
            pieces.append((offset, tuple(x for x in ext if x > 1)))
            offset += digits[p] * math.prod(radices[:p])
    return pieces


def sum_error_terms(n: int, block: int = 1024, radix: int = 32, top: int = 1024) -> int:
    """The largest number of additions any one element of a blocked float sum of ``n`` elements
    (one reduced axis, or axes that sum at most ``block`` values inside it) goes through:
    the first-order error bound is ``sum_error_terms(n) * 2**-24 * sum(|x_i|)`` (docs/semantics.md)."""
    if n <= block:
        return max(0, n - 1)
    pieces = sum_pieces(n, block, radix, top)
    return max(sum(x - 1 for x in ext) for _, ext in pieces) + len(pieces) - 1


def sum_depth(k: LoopKernel) -> int:
    """The most rounded additions any one summed value goes through in ``k``'s float sum
    accumulators (the first-order error bound of a float sum is ``sum_depth * 2**-24 * sum|x_i|``,
    docs/semantics.md "Sums"). A value added into an accumulator goes through every later addition
    into it, then through the additions that follow where that accumulator is folded (ACCREAD)
    into the next one. Read from the loop IR, so it checks what the lowering emitted. Conservative:
    a value added inside a loop counts every addition of that loop and after it."""
    open_at: list[int] = []                  # open RANGEs: instruction ids
    ext: dict[int, int] = {}
    at: dict[int, int] = {}                  # float sum accumulator -> loops open at its definition
    sites: dict[int, list[list]] = {}        # acc -> [[executions, group, source acc or None]]
    for i, x in enumerate(k.insts):
        if x.op == "RANGE":
            open_at.append(i)
            ext[i] = x.arg
        elif x.op == "ENDRANGE":
            open_at.pop()
        elif x.op == "DEFACC" and getattr(x.dtype, "is_float", False):
            at[i], sites[i] = len(open_at), []
        elif x.op == "ACCUM" and x.arg == "ADD" and x.src[0] in at:
            a, v = x.src
            inner = open_at[at[a]:]
            child = k.insts[v].src[0] if k.insts[v].op == "ACCREAD" and k.insts[v].src[0] in at else None
            sites[a].append([math.prod(ext[r] for r in inner), inner[0] if inner else ("once", i), child])
    remaining: dict[tuple[int, int], int] = {}
    fold: dict[int, tuple[int, int]] = {}     # child acc -> (parent acc, site)
    for a, ss in sites.items():
        for n, (_, group, child) in enumerate(ss):
            first = next(m for m, t in enumerate(ss) if t[1] == group)
            remaining[(a, n)] = sum(t[0] for t in ss[first:]) - 1
            if child is not None:
                fold[child] = (a, n)

    def up(a: int) -> int:                   # roundings after a's value leaves it
        if a not in fold:
            return 0
        p, n = fold[a]
        return remaining[(p, n)] + up(p)
    return max((remaining[(a, n)] + up(a) for a, ss in sites.items() for n, t in enumerate(ss) if t[2] is None),
               default=0)


def _full_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= s
    return tuple(reversed(st))


def _zero(dt: DType) -> Any:
    return False if dt is bool_ else (0.0 if dt.is_float else 0)


def lower_kernel(kernel: Kernel, plan: KernelPlan, upcast: tuple[int, int] | None = None) -> LoopKernel:
    """``upcast`` forces the register lanes (last output axis, the axis before); None chooses them."""
    return Lowerer(kernel, plan, upcast).lower()
