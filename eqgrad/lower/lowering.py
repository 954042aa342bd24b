"""Kernel (a body of KNodes) -> loop IR: the emitter that follows a schedule of named passes.

``lower_kernel`` first runs the passes (``passes.PASSES``: lanes, tiling, hoist, blocked sums,
parallel; docs/lowering.md), which decide everything about the kernel's loops into a
``passes.Schedule`` without emitting anything, then ``Lowerer.emit_kernel`` writes the loop IR:

1. output loops: one per output axis (size-1 axes get index 0; lane axes are split into a loop
   over blocks and the lanes; a tiled axis gets its tile loop first and its inner loop last),
   with the hoisted reductions rendered right after the loop the schedule names;
2. the body, evaluated per output element (per lane) by a recursive index function. Movement ops
   transform the symbolic index (``symbolic.Lin``, ``indexing.move_index``) instead of moving
   data -- reshape through linearize/delinearize with bound-aware simplification, permute by
   reordering, expand by zeroing, shrink by offsetting, flip by mirroring, pad by offsetting plus a
   validity mask that clamps the load and selects 0. A reduction opens its own loops at the point
   of use with one accumulator per lane (in levels when the schedule blocks it). Values are
   memoized per (node, index, mask) within the loop scope that computed them;
3. the store of each output element at its contiguous index.

With ``EQGRAD_VERIFY=1`` (on in the test suite) the loop IR after every pass -- the schedule of
the passes up to it -- is emitted and checked by ``loopir.verify``; ``DEBUG>=5`` prints which
passes applied to each kernel.
"""
from __future__ import annotations

import sys

from dataclasses import replace
from typing import Any

from eqgrad import config
from eqgrad.dtype import DType, bool_
from eqgrad.graph.caps import ROW_STASH_MAX
from eqgrad.graph.loopir import INDEX, NONNEG, LInst, LoopIRError, LoopKernel, verify
from eqgrad.graph.plan import GROUP, Kernel, KernelPlan, KNode
from eqgrad.lower.collapse import collapse, merge_axes, merge_reduced
from eqgrad.lower.indexing import (MOVES, REDUCES, dry_sources, flat_index, hoistable, move_index, reduce_map,
                                   row_array_size, row_output, stash_layout, stash_read, strides_of)
from eqgrad.lower.passes import CACHE_LINE, LowerOptions, Schedule, describe_steps, run_passes, tiled_blocks
from eqgrad.lower.sums import SUM_BLOCK, SUM_RADIX, sum_depth, sum_error_terms, sum_pieces
from eqgrad.lower import symbolic
from eqgrad.lower.symbolic import Div, Lin, Mod, Var, substitute_free
from eqgrad.ops import RETYPES, numel, reduce_identity

# tests and tools import these from here
__all__ = ["Lowerer", "lower_kernel", "strides_of", "sum_depth", "sum_error_terms", "sum_pieces",
           "SUM_BLOCK", "SUM_RADIX"]


class Lowerer:
    """Emits one kernel's loop IR. ``lower()`` runs the passes and emits their schedule;
    ``emit_kernel(schedule)`` emits any schedule (a pass switched off, or one inspected alone).
    One instance emits once."""

    def __init__(self, kernel: Kernel, plan: KernelPlan, upcast: tuple[int, int] | None = None,
                 options: LowerOptions | None = None):
        self.kernel = kernel
        self.plan = plan
        # upcast: (lanes on the last output axis, lanes on the one before), forced; None: the lanes pass decides
        self.options = options if options is not None else LowerOptions(upcast=upcast)
        if upcast is not None and self.options.upcast != upcast:
            raise ValueError(f"Lowerer: upcast {upcast} and options.upcast {self.options.upcast} disagree")
        # the outputs first (parameter 0, then a GROUP's other roots'), then the inputs
        self.param_of: dict[int, int] = {}
        self.params: list[tuple[str, DType, bool]] = []
        for b in kernel.outs:
            self.param_of[b] = len(self.params)
            self.params.append((f"b{b}", plan.buffers[b][1], True))
        for b in kernel.inputs:
            self.param_of[b] = len(self.params)
            self.params.append((f"b{b}", plan.buffers[b][1], False))
        # the PARAM instructions first: parameter i is instruction i, as LOAD and STORE name it
        self.insts: list[LInst] = [LInst("PARAM", d, (), i) for i, (_, d, _) in enumerate(self.params)]
        # scoped CSE: what is emitted (instructions, rendered nodes) by key, in one dict, and the
        # keys each open loop added, dropped when it closes -- a key lives in one scope only (it is
        # found before it could be added again), so this is a stack of dicts looked up with one
        # hash instead of one per open loop
        self.memo: dict[Any, Any] = {}
        self.scope_keys: list[list[Any]] = [[]]
        self.vars: dict[str, int] = {}
        self.n_ranges = 0
        self.has_reduce: dict[int, bool] = reduce_map(kernel.ast)
        self.sched = Schedule()
        self._blocked: set[int] = set()
        # the stash pass's value: stored where a hoisted reduction's loop renders it at _stash_idx,
        # loaded where the loop over the row's outputs renders it at _main_idx (once one was stored)
        self._stash_in: KNode | None = None
        self._stash_idx: tuple | None = None
        self._stashed = False
        self._main_idx: tuple | None = None
        # the row stash pass's values (passes.RowStash): id(value) -> its local array while the row
        # is being reduced; the hoisted reduction being rendered and the loop variables it opened
        self._rows: dict[int, _RowArray] = {}
        self._hoisting: KNode | None = None
        self._hoist_vars: set[str] = set()
        self._row_ranges: set[int] = set()     # RANGEs opened by hoisted reductions (LoopKernel.row_loops)
        self._nested = 0                       # reductions whose loops are open here

    # ------------------------------------------------------------------ emission with scoped CSE
    def emit(self, op: str, dtype: Any, src: tuple[int, ...] = (), arg: Any = None, cse: bool = True) -> int:
        if cse:
            # a traced size (lower/trace.py) is keyed by its expression, not its value: two sizes
            # equal at the values being traced (a decode step's cache length 11 and a lane offset
            # that folds to 11) compared equal here, and the guard that comparison records pinned
            # the trace to that one length -- a new lowering and compile at every step
            k_arg = ("traced size", arg.e) if symbolic._tracing[0] and isinstance(arg, symbolic.SYMBOLS) else arg
            key = ("i", op, dtype, src, k_arg)
            hit = self.memo.get(key)
            if hit is not None:
                return hit
        self.insts.append(LInst(op, dtype, src, arg))
        i = len(self.insts) - 1
        if cse:
            self.memo[key] = i
            self.scope_keys[-1].append(key)
        return i

    def const(self, v: Any, dtype: Any) -> int:
        return self.emit("CONST", dtype, (), v)

    def open_range(self, extent: int) -> Lin:
        name = f"r{self.n_ranges}"
        self.n_ranges += 1
        if self._hoisting is not None:
            self._hoist_vars.add(name)
            self._row_ranges.add(len(self.insts))           # the RANGE about to be emitted
        elif self._nested > 1:
            self._row_ranges.add(len(self.insts))           # a reduction's loop inside another's
        rid = self.emit("RANGE", INDEX, (), extent, cse=False)
        self.vars[name] = rid
        self.scope_keys.append([])
        return Lin.var(name, extent)

    def close_range(self, lin: Lin) -> None:
        name = lin.terms[0][0].name
        memo = self.memo
        for key in self.scope_keys.pop():
            del memo[key]
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
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if n is self.sched.stash and valid is None:
            v = self._stashed_value(n, idx, lambda: self._render(n, idx, valid))
        elif id(n) in self._rows and valid is None:
            v = self._row_values(n, (idx,), lambda: (self._render(n, idx, valid),))[0]
        else:
            v = self._render(n, idx, valid)
        self.memo[key] = v
        self.scope_keys[-1].append(key)
        return v

    def _render(self, n: KNode, idx: tuple[Lin, ...], valid: int | None) -> int:
        op = n.op
        if op == "CONST":
            return self.const(n.arg, n.dtype)
        if op == "BUF":
            fi = self.index(flat_index(idx, n.shape))
            if valid is not None:
                fi = self.emit("WHERE", INDEX, (valid, fi, self.const(0, INDEX)))
            return self.emit("LOAD", n.dtype, (self.param_of[n.arg], fi))
        if op in REDUCES:
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
        if op in MOVES:
            return self.render(n.src[0], self.move_index(n, idx), valid)
        srcs = tuple(self.render(s, idx, valid) for s in n.src)
        return self.emit(op, n.arg if op in RETYPES else n.dtype, srcs, None)

    def move_index(self, n: KNode, idx: tuple[Lin, ...]) -> tuple[Lin, ...]:
        return move_index(n, idx)

    def _stashed_value(self, n: KNode, idx: tuple[Lin, ...], compute) -> int:
        """The stash pass's value ``n`` at ``idx``: loaded from the output where the row's outputs
        read it after a hoisted loop stored it, stored to the output where that loop computes it."""
        if idx == self._main_idx and self._stashed:
            return self.emit("LOAD", n.dtype, (0, self.index(flat_index(idx, n.shape))), cse=False)
        v = compute()
        if idx == self._stash_idx:
            self.emit("STORE", None, (0, self.index(flat_index(idx, n.shape)), v), cse=False)
            self._stashed = True
        return v

    def _reduce(self, n: KNode, idx: tuple[Lin, ...], valid: int | None) -> int:
        return self._reduce_lanes(n, (idx,), (valid,))[0]

    # ------------------------------------------------------------------ hoisting (row fusion)
    def hoist(self, out_idx: list[Lin | None], nodes: tuple[KNode, ...], axis: int = -1, rows: int = 1) -> None:
        """Render now, in the current loop, the reductions ``nodes`` (the hoist pass's choice for
        this loop), each at the index it is read at from the root, after the reductions it uses.
        ``out_idx`` is None for the output axes still to open. Each row's max/sum/mean/variance is
        then reduced once, in its own loop inside the row loop, before the loop over the row's
        outputs; the main pass finds them memoized under the same key. With ``rows`` lanes on output
        ``axis`` (the lanes pass's row block), the rows ``out_idx[axis] + 0 .. rows - 1`` are reduced
        together, one accumulator each in one loop nest: what they read alike (attention's keys and
        values) is loaded once for all of them."""
        root = self.kernel.ast
        per_row = []
        for u in range(rows):
            at = list(out_idx)
            if rows > 1:
                at[axis] = at[axis] + u
            idx = tuple(i if i is not None else Lin.var(f"_o{d}", s) for d, (i, s) in enumerate(zip(at, root.shape)))
            per_row.append(hoistable(root, idx, self.has_reduce, self._dry_sources))
        chosen = {id(n) for n in nodes}
        for found in zip(*per_row):
            n, ix = found[0]
            if any(m is not n for m, _ in found):
                raise AssertionError("internal: the rows of a row block hoist different reductions")
            if id(n) in chosen:
                # (the stash pass's output value is kept for a single row only)
                self._stash_in = n if rows == 1 and self._covers_the_row(n, ix, out_idx) else None
                self._open_rows(n, ix, rows)
                self._row_dots(n, tuple(i for _, i in found))
                self._hoisting, self._hoist_vars = n, set()
                self.render_lanes(n, tuple(i for _, i in found), (None,) * rows)   # the key the main pass looks up
                self._hoisting, self._stash_in = None, None
                for key, row in list(self._rows.items()):
                    if row.by is n:           # kept from now on, or (never stored) not kept
                        if row.stored:
                            row.done = True
                        else:
                            del self._rows[key]

    # ------------------------------------------------------------------ the row stash
    def _open_rows(self, red: KNode, ix: tuple[Lin, ...], rows: int = 1) -> None:
        """Declare, before hoisted reduction ``red``'s loop, a local array for each row-stash value
        not yet kept that ``red`` computes over its own loop: the array that loop stores it into,
        ``rows`` rows of it for a row block."""
        for x in self.sched.row_stash:
            if id(x) in self._rows:
                continue
            axes = self._stash_layout(red, ix, x)
            if axes is None:
                continue
            extent = numel(tuple(x.shape[d] for d in axes))
            if extent * rows > ROW_STASH_MAX:
                continue
            pitch = row_pitch(row_array_size(extent, rows, self.options.row_arrays_full), rows, x.dtype)
            arr = self.emit("DEFLOCAL", x.dtype, (), pitch * rows, cse=False)
            self._rows[id(x)] = _RowArray(arr, red, axes, pitch)

    def _row_dots(self, red: KNode, ixs: tuple) -> None:
        """The row-dots pass's values (``passes.RowDots``) that hoisted reduction ``red`` (its rows at
        ``ixs``: one index, or a row block's) keeps in row-stash arrays, computed before its loop as
        register blocks: a loop over the kept axis in steps of the lanes' width ``W``, and in it, for
        each group of ``rows_per`` rows, a reduction with one accumulator a (row, element) -- the
        rows' W values of one element are one vector, the operand the rows share one vector load
        and the row's own a broadcast -- stored into the arrays; ``red``'s loop then loads them.
        The scores of attention as one kernel: 64 keys x 4 query rows of q . k a reduction step, not
        one horizontally summed dot product a key and row."""
        if not self.sched.row_dots:
            return
        width = dict(self.sched.lanes)
        big = [d for d, n in enumerate(self.kernel.ast.shape) if n > 1]
        w = width.get(big[-1], 1)
        for x, rows_per in self.sched.row_dots:
            row = self._rows.get(id(x))
            if row is None or row.by is not red or row.stored or len(row.axes) != 1:
                continue
            axis = row.axes[0]
            reads = [stash_read(red, ix, x, self._dry_sources) for ix in ixs]
            if None in reads or x.shape[axis] % w or len(ixs) % rows_per:
                continue
            self._dot_blocks(x, row, reads, w, rows_per)

    def _dot_blocks(self, x: KNode, row: "_RowArray", reads: list[tuple[Lin, ...]], w: int, per: int) -> None:
        """Sum of products ``x`` at the rows ``reads`` (its index at each, the array's axis free),
        computed as register blocks into ``row``'s array: a loop over that axis in steps of ``w``,
        and in it, for each group of ``per`` rows, a reduction with one accumulator a (row, element)
        -- the rows' ``w`` values of one element are one vector, the operand the rows share one
        vector load and the row's own a broadcast. The row-dots pass's values, of a hoisted
        reduction (``_row_dots``) or of the kernel's own (``_root_dots``)."""
        axis, n = row.axes[0], x.shape[row.axes[0]]
        r = self.open_range(n // w) if n > w else Lin.num(0)
        for g in range(0, len(reads), per):
            idxs = tuple(xi[:axis] + (r * w + u,) + xi[axis + 1:] for xi in reads[g:g + per] for u in range(w))
            vals = self._render_lanes(x, idxs, (None,) * len(idxs))
            for j, (idx, v) in enumerate(zip(idxs, vals)):
                self.emit("STORE", None, (row.arr, self.index(row.element(idx, x.shape, g + j // w)), v), cse=False)
        if n > w:
            self.close_range(r)
        row.rows = [row.pattern(xi) for xi in reads]
        row.stored = row.done = True

    def _root_dots(self, lanes: list[tuple[Lin, ...]]) -> None:
        """The row-dots pass's values of the kernel's own reduction (``passes.root_dots``; the root,
        through movement ops, rendered at the output lanes ``lanes``), each computed for the whole
        row -- each row of a row block -- before that reduction's loop as register blocks (a loop over
        the row in steps of ``w`` elements, a reduction with one accumulator an element of a group
        of the block's rows) into a local array, then the values over them that every lane of a row
        reads alike (``passes.root_rows``), a loop over the row each; the reduction's loop then
        loads them (``_row_values``). In a row-fused kernel (hoists, no root dots) the root rows
        alone, once the row's hoisted reductions are known: softmax's p = e / sum, read by p @ v."""
        # (the values are the same in every lane of the last axis where lanes cover it: its first)
        last = max(d for d, n in enumerate(self.kernel.ast.shape) if n > 1)
        top = [l for l in lanes if l[last] is lanes[0][last]] if self.sched.lanes else lanes
        reds = []                          # each root's reduction (a GROUP's several) and its indices
        for red in self.kernel.ast.src if self.kernel.ast.op == GROUP else (self.kernel.ast,):
            ixs = top
            while red.op in MOVES:
                ixs, red = [self.move_index(red, ix) for ix in ixs], red.src[0]
            reds.append((red, list(dict.fromkeys(ixs))))
        # a value's array is the first root's whose reduction reads it along its loop
        array = lambda x: next((r for r in (self._root_array(rd, ix, x) for rd, ix in reds) if r is not None), None)
        for x, w, per in self.sched.root_dots:
            row = array(x)
            if row is None:
                continue
            self._dot_blocks(x, row, row.rows, w, per)
            self._rows[id(x)] = row
        for y in self.sched.root_rows:
            row = array(y)
            if row is None:
                continue
            reads, axis = row.rows, row.axes[0]
            if self.sched.hoist:
                # over a row-fused kernel's hoisted reductions: the block's rows in one loop, rendered
                # together (the hoist rendered those reductions for the block's rows at once: they
                # are found under that key, not computed again)
                self._row_ranges.add(len(self.insts))
                r = self.open_range(y.shape[axis])
                idxs = tuple(yi[:axis] + (r,) + yi[axis + 1:] for yi in reads)
                for slot, (idx, v) in enumerate(zip(idxs, self.render_lanes(y, idxs, (None,) * len(idxs)))):
                    self.emit("STORE", None, (row.arr, self.index(row.element(idx, y.shape, slot)), v), cse=False)
                self.close_range(r)
            else:
                for slot, yi in enumerate(reads):
                    self._row_ranges.add(len(self.insts))    # (a row loop: LLVM's loop vectorizer may widen it)
                    r = self.open_range(y.shape[axis])
                    idx = yi[:axis] + (r,) + yi[axis + 1:]
                    self.emit("STORE", None, (row.arr, self.index(row.element(idx, y.shape, slot)),
                                              self._render(y, idx, None)), cse=False)
                    self.close_range(r)
            row.rows = [row.pattern(yi) for yi in reads]
            row.stored = row.done = True
            self._rows[id(y)] = row

    def _root_array(self, red: KNode, ixs: list[tuple[Lin, ...]], x: KNode) -> "_RowArray | None":
        """A local array for value ``x`` that reduction ``red``, rendered at ``ixs``, reads along its
        loop: one row per distinct index it reads ``x`` at (``rows``: those indices, until stored)."""
        if id(x) in self._rows:
            return None
        found = [stash_layout(red, ix, x, self._dry_sources) for ix in ixs]
        if None in found or len({f[1] for f in found}) != 1 or len(found[0][1]) != 1:
            return None
        reads = list(dict.fromkeys(f[0] for f in found))
        pitch = row_pitch(row_array_size(x.shape[found[0][1][0]], len(reads), self.options.row_arrays_full), len(reads),
                          x.dtype)
        row = _RowArray(self.emit("DEFLOCAL", x.dtype, (), pitch * len(reads), cse=False), red, found[0][1], pitch)
        row.rows = reads
        return row

    def _stash_layout(self, red: KNode, ix: tuple[Lin, ...], x: KNode) -> tuple[int, ...] | None:
        """The axes of ``x`` that hoisted reduction ``red`` (at ``ix``) keeps in a row array
        (``indexing.stash_layout``); None where it cannot."""
        found = stash_layout(red, ix, x, self._dry_sources)
        return found[1] if found is not None else None

    def _row_values(self, n: KNode, idxs: tuple, compute) -> tuple[int, ...]:
        """A row-stash value at the lanes ``idxs`` (one index, or a row block's): loaded from its local
        array once the row's loop that keeps it has stored it (at the same rows), stored there while
        that loop computes it (each row of a block at its own offset), else computed."""
        row = self._rows[id(n)]
        if row.done:
            slots = [row.slot(i) for i in idxs]
            if None not in slots:
                return tuple(self.emit("LOAD", n.dtype, (row.arr, self.index(row.element(i, n.shape, k))), cse=False)
                             for i, k in zip(idxs, slots))
            return compute()
        v = compute()
        if self._hoisting is row.by and all(self._keeps(row, i, n.shape) for i in idxs):
            if row.rows is None:
                row.rows = [row.pattern(i) for i in idxs]
            slots = [row.slot(i) for i in idxs]
            if None not in slots:
                for i, k, x in zip(idxs, slots, v):
                    self.emit("STORE", None, (row.arr, self.index(row.element(i, n.shape, k)), x), cse=False)
                row.stored = True
        return v

    def _keeps(self, row: "_RowArray", idx: tuple[Lin, ...], shape: tuple[int, ...]) -> bool:
        """Whether ``idx``, inside the keeping loop, has that loop's own variables alone on the kept
        axes (each over the whole axis) and none elsewhere."""
        used = set()
        for d, l in enumerate(idx):
            free = substitute_free(l)
            if d in row.axes:
                if len(free) != 1 or not free <= self._hoist_vars or l != Lin.var(next(iter(free)), shape[d]):
                    return False
                used |= free
            elif free & self._hoist_vars:
                return False
        return len(used) == len(row.axes)

    def _covers_the_row(self, n: KNode, ix: tuple[Lin, ...], out_idx: list[Lin | None]) -> bool:
        """Whether reduction ``n``, hoisted at index ``ix``, loops over exactly the output elements
        of the row the output loops have not opened yet (its reduced axes are those, and every other
        axis is an open loop's), so that what it stores at its source's index is read back by this
        row's outputs before they are written."""
        root = self.kernel.ast
        if self.sched.stash is None or n.src[0].shape != root.shape:
            return False
        for d, size in enumerate(root.shape):
            if size <= 1:
                continue
            if d in n.arg:
                if out_idx[d] is not None or ix[d] != Lin.num(0):
                    return False
            elif out_idx[d] is None or ix[d] != out_idx[d]:
                return False
        return True

    def _dry_sources(self, n: KNode, idx: tuple[Lin, ...], tag: str) -> list[tuple[KNode, tuple[Lin, ...]]]:
        return dry_sources(n, idx, tag, self.move_index)

    # ------------------------------------------------------------------ lanes (upcast)
    # A kernel whose output axes are upcast renders several output elements ("lanes") at once.
    # Subtrees without reductions are rendered lane by lane (CSE shares what the lanes have in
    # common); a reduction renders ONE loop nest with one accumulator per lane, so e.g. a matmul
    # tile keeps its lanes' partial sums in registers, and the LLVM renderer emits each group of
    # ``vector_lanes`` consecutive lanes as one vector (devices/llvm.py, _Lanes).
    def render_lanes(self, n: KNode, idxs: tuple, valids: tuple) -> tuple[int, ...]:
        if not self.has_reduce[id(n)]:
            return tuple(self.render(n, i, v) for i, v in zip(idxs, valids))
        if len(idxs) > 1:
            # lanes in groups that read the same element: one reduction per distinct element, not one
            # per lane -- every lane of a row-fused kernel reads its row's value (found under the key
            # the hoist pass rendered it at); a contraction's head-dim lanes read one score q . k
            # per key lane (attention's gradient of v as one kernel). By identity: indices are
            # interned, and == on a traced size would record a guard
            group: dict[tuple, int] = {}
            firsts: list[int] = []
            where: list[int] = []
            for j, (i, v) in enumerate(zip(idxs, valids)):
                g = group.setdefault((tuple(map(id, i)), id(v)), len(firsts))
                if g == len(firsts):
                    firsts.append(j)
                where.append(g)
            if len(firsts) < len(idxs):
                sub = self.render_lanes(n, tuple(idxs[j] for j in firsts), tuple(valids[j] for j in firsts))
                return tuple(sub[g] for g in where)
        key = ("l", id(n), idxs, valids)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if n is self.sched.stash and valids == (None,):
            out = (self._stashed_value(n, idxs[0], lambda: self._render_lanes(n, idxs, valids)[0]),)
        elif id(n) in self._rows and all(v is None for v in valids):
            out = self._row_values(n, idxs, lambda: self._render_lanes(n, idxs, valids))
        else:
            out = self._render_lanes(n, idxs, valids)
        self.memo[key] = out
        self.scope_keys[-1].append(key)
        return out

    def _render_lanes(self, n: KNode, idxs: tuple, valids: tuple) -> tuple[int, ...]:
        op = n.op
        if op in REDUCES:
            return self._reduce_lanes(n, idxs, valids)
        if op == "PAD":
            # each lane's index into the source and its mask, then the source's lanes together: a
            # reduction below (RoPE's rotated half of a projection) stays one loop nest with one
            # accumulator per lane, not a scalar loop per lane
            before, _after = n.arg
            src = n.src[0]
            cidxs = tuple(tuple(i - b for i, b in zip(idx, before)) for idx in idxs)
            masks = tuple(self.and_([self.in_range(ci, s) for ci, s in zip(cidx, src.shape)]) for cidx in cidxs)
            inner = self.render_lanes(src, cidxs, tuple(self.and_([v, m]) for v, m in zip(valids, masks)))
            zero = self.const(_zero(n.dtype), n.dtype)
            return tuple(x if m is None else self.emit("WHERE", n.dtype, (m, x, zero)) for x, m in zip(inner, masks))
        if op in MOVES:
            return self.render_lanes(n.src[0], tuple(self.move_index(n, i) for i in idxs), valids)
        srcs = [self.render_lanes(s, idxs, valids) for s in n.src]
        dt = n.arg if op in RETYPES else n.dtype
        return tuple(self.emit(op, dt, tuple(sv[lane] for sv in srcs), None) for lane in range(len(idxs)))

    # Blocked float sums (docs/semantics.md "Sums", docs/lowering.md "blocked sums"). A float sum that
    # the blocked-sums pass marked is split into levels, each with its own accumulator, so that no
    # accumulator adds more than sum_block (innermost and outermost level) or sum_radix (the levels
    # between) values: the rounding error is then bounded by sum_error_terms(n) * 2**-24 * sum|x|
    # whatever the device does with the innermost loop (LLVM vectorizes it, which only shortens it).
    def _reduce_lanes(self, n: KNode, idxs: tuple, valids: tuple) -> tuple[int, ...]:
        """One loop nest over the reduced axes, one accumulator per lane.

        Float sums the schedule blocks are summed in levels (``_sum_levels``): a single float
        accumulator over n values has an error bound of (n - 1) ulps of the running sum (a
        sequential sum of 1e6 x 0.1f: 2.2e-4 relative; 1e9 ones saturate at 2**24 per accumulator);
        with levels no accumulator adds more than ``sum_block`` values."""
        src = n.src[0]
        accs = tuple(self.emit("DEFACC", n.dtype, (), reduce_identity(n.op, n.dtype), cse=False) for _ in idxs)
        axes = [d for d in n.arg if src.shape[d] > 1]
        sub: dict[int, Lin] = {d: Lin.num(0) for d in n.arg if src.shape[d] <= 1}
        if 0 not in src.shape:              # an empty axis means the identity
            self._nested += 1
            try:
                self._reduce_axes(n, idxs, valids, axes, 0, sub, accs, id(n) in self._blocked)
            finally:
                self._nested -= 1
        return tuple(self.emit("ACCREAD", n.dtype, (acc,), cse=False) for acc in accs)

    def _reduce_axes(self, n: KNode, idxs: tuple, valids: tuple, axes: list[int], k: int,
                     sub: dict[int, Lin], accs: tuple[int, ...], blocked: bool) -> None:
        """Reduce ``axes[k:]`` of ``n``'s source into ``accs`` (one per lane). An axis that, with the
        axes inside it, sums at most ``sum_block`` values is one plain loop; a longer one (blocked
        sums only) is split into levels by ``_sum_levels``."""
        src = n.src[0]
        if k == len(axes):
            cidxs = tuple(tuple(sub.get(d, i) for d, i in enumerate(idx)) for idx in idxs)
            outer = self._stash_idx
            if self._stash_in is n:          # the stash pass's value is stored at this element
                self._stash_idx = cidxs[0]
            vals = self.render_lanes(src, cidxs, valids)
            self._stash_idx = outer
            for acc, v in zip(accs, vals):
                self.emit("ACCUM", None, (acc, v), "ADD" if n.op == "RSUM" else "MAX", cse=False)
            return
        d, e = axes[k], src.shape[axes[k]]
        inner = numel(tuple(src.shape[a] for a in axes[k + 1:]))
        block, radix = self.sched.sum_block, self.sched.sum_radix
        if not blocked or e * inner <= block:
            r = self.open_range(e)
            self._reduce_axes(n, idxs, valids, axes, k + 1, {**sub, d: r}, accs, blocked)
            self.close_range(r)
            return
        # the axes inside sum into the innermost level directly, or (when they are long) into their
        # own accumulator that adds one value per iteration
        first = True
        for offset, extents in sum_pieces(e, block // inner if 2 * inner <= block else block, radix, block):
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
        if 2 * inner > self.sched.sum_block:
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

    # ------------------------------------------------------------------ passes, then emission
    def lower(self) -> LoopKernel:
        """Run the kernel passes and emit their schedule. Under ``EQGRAD_VERIFY`` the loop IR is
        emitted and verified with no pass and after every pass that changed the schedule (a
        change of the parallel loops only reuses the instructions), and the last one is returned.
        (A traced lowering, lower/trace.py, is not: its sizes are symbols; each loop kernel
        instantiated from it is verified instead.)"""
        steps = run_passes(self.kernel, self.options)
        if config.DEBUG.value >= 5:
            print(describe_steps(self.kernel, steps))
        if not config.VERIFY.value or symbolic.tracing_here():
            return self.emit_kernel(steps[-1].schedule if steps else Schedule())
        at = Schedule()
        lk = self.emit_kernel(at)
        verify_emitted(lk, "with no pass")
        for st in steps:
            if st.schedule == at:
                continue
            if replace(st.schedule, parallel=at.parallel) == at:     # the same instructions
                lk = replace(lk, parallel=st.schedule.parallel)
            else:
                lk = self._fresh().emit_kernel(st.schedule)
            at = st.schedule
            verify_emitted(lk, f"after pass {st.name!r}")
        return lk

    def _fresh(self) -> "Lowerer":
        return type(self)(self.kernel, self.plan, options=self.options)

    def emit_kernel(self, s: Schedule) -> LoopKernel:
        """The loop IR of the kernel under schedule ``s``."""
        if len(self.insts) > len(self.params):
            raise RuntimeError("Lowerer.emit_kernel: this Lowerer has already emitted; make a new one")
        self.sched = s
        self._blocked = {id(n) for n in s.blocked}
        root = self.kernel.ast
        up, tile, hoist_at = s.lane_map, s.tile, dict(s.hoist)
        if s.root_block:                  # (a row block steps the rows' loop as lanes would)
            up[max(d for d, n in enumerate(root.shape) if n > 1)] = s.root_block
        blocks = {d: b for d, b in s.blocks if 1 < b < root.shape[d]}
        loops, out_idx, lane_axes = [], [None] * len(root.shape), []
        for d in range(len(root.shape)):
            sz, w = root.shape[d], up.get(d, 1)
            if sz <= 1:
                out_idx[d] = Lin.num(0)
            elif d in blocks:                              # a cache block: its inner loop opens last
                r = self.open_range(sz // blocks[d])
                loops.append(r)
                out_idx[d] = r * blocks[d]
            elif sz // w == 1:
                out_idx[d] = Lin.num(0)
                lane_axes.append(d)
            elif tile is not None and d == tile[0]:
                r = self.open_range(sz // (w * tile[1]))       # the tile loop; its inner loop opens last
                loops.append(r)
                out_idx[d] = r * (w * tile[1])
                lane_axes.append(d)
            else:
                r = self.open_range(sz // w)
                loops.append(r)
                out_idx[d] = r * w
                if w > 1:
                    lane_axes.append(d)
                    if len(loops) in hoist_at:           # a row block (passes.Lanes): w rows at once
                        self.hoist(out_idx, hoist_at[len(loops)], d, w)
                elif len(loops) in hoist_at:
                    self.hoist(out_idx, hoist_at[len(loops)])
        if not loops and 0 in hoist_at:
            self.hoist(out_idx, hoist_at[0])
        local = self._block_tile(root, blocks, out_idx) if tiled_blocks(root.shape, s, self.options) else None
        inner: dict[int, Lin] = {}
        for d in sorted(blocks):
            r = self.open_range(blocks[d])
            loops.append(r)
            inner[d] = r
            out_idx[d] = out_idx[d] + r
        if tile is not None:
            r = self.open_range(tile[1])
            loops.append(r)
            out_idx[tile[0]] = out_idx[tile[0]] + r * up[tile[0]]
        if 0 not in root.shape:
            self._main_idx = tuple(out_idx) if not lane_axes else None
            lanes = [tuple(out_idx)]
            for d in lane_axes:      # lanes: every combination of offsets on the upcast axes
                lanes = [l[:d] + (l[d] + u,) + l[d + 1:] for l in lanes for u in range(up.get(d, root.shape[d]))]
            if s.root_dots or s.root_rows:
                self._root_dots(lanes)
            # a GROUP's roots one after another in the same loops, each to its own output (its
            # parameter: 0 for the first root, then the next)
            for p, r in enumerate(root.src if root.op == GROUP else (root,)):
                if local is not None:     # a cache block's element, from the block's local copy
                    vals = (self.emit("LOAD", r.dtype, (local, self.index(_tile_element(blocks, inner)))),)
                elif s.root_block:        # each row's reduction a loop of its own (LLVM may widen it)
                    vals = tuple(self.render_lanes(r, (lane,), (None,))[0] for lane in lanes)
                else:
                    vals = self.render_lanes(r, tuple(lanes), (None,) * len(lanes))
                if root.op == GROUP and row_output(r) and self.plan.buffers[self.kernel.outs[p]][0] == r.src[0].shape:
                    # a row statistic (merge.py absorb_rows): once a row, in its own shape
                    at = {}
                    for idx, v in zip(lanes, vals):
                        at.setdefault(self.move_index(r, idx), v)
                    for idx, v in at.items():
                        self.emit("STORE", None, (p, self.index(flat_index(idx, r.src[0].shape)), v), cse=False)
                    continue
                for idx, v in zip(lanes, vals):
                    # src[0]: the output's parameter
                    self.emit("STORE", None, (p, self.index(flat_index(idx, root.shape)), v), cse=False)
        for r in reversed(loops):
            self.close_range(r)
        width = up.get(lane_axes[-1], root.shape[lane_axes[-1]]) if lane_axes and not s.dot else 0
        if s.root_dots and not s.lanes:       # (a kernel without lanes: its register blocks' vectors)
            width = max(self.options.lanes_last)
        # a dot block's lanes are scalars whose reduce loop the loop vectorizer widens (passes.DotLanes)
        return LoopKernel(self.kernel.name, self.params, self.insts, loop_vectorize=not s.lanes or s.dot,
                          parallel=s.parallel, vector_lanes=width,
                          row_loops=frozenset(self._row_ranges) if s.lanes else frozenset())

    def _block_tile(self, root: KNode, blocks: dict[int, int], out_idx: list) -> int:
        """A cache block (``passes.CacheBlocks``) copied into a local array first: its source read in
        order along the axis ``a`` where the source is contiguous, each line whole, then the block
        written in order along the last axis from the array. Read straight, the block's rows of the
        source a power of two apart fell in one L1 set, more of them than its ways: a 1024 x 1024
        transpose ran 2.9 ns an element on one thread against 0.66 at 1008 x 1008 (2-vCPU AMD EPYC,
        Zen 4). Returns the array (its elements: ``_tile_element``)."""
        a, last = sorted(blocks)
        arr = self.emit("DEFLOCAL", root.dtype, (), blocks[a] * blocks[last], cse=False)
        at = {last: self.open_range(blocks[last])}
        at[a] = self.open_range(blocks[a])
        idx = list(out_idx)
        idx[a], idx[last] = idx[a] + at[a], idx[last] + at[last]
        v = self.render(root, tuple(idx), None)
        self.emit("STORE", None, (arr, self.index(_tile_element(blocks, at)), v), cse=False)
        self.close_range(at[a])
        self.close_range(at[last])
        return arr


def _tile_element(blocks: dict[int, int], at: dict[int, Lin]) -> Lin:
    """The element of a cache block's local array (``Lowerer._block_tile``) that holds the block's
    element at offsets ``at`` (axis -> offset): ``a``-major within the last axis, ``l * ta + t``."""
    a, last = sorted(blocks)
    return at[last] * blocks[a] + at[a]


def row_pitch(cap: int, rows: int, dtype: DType) -> int:
    """Elements from one slot of a row block's local array to the next: the row's ``cap`` and, for
    more than one row, a cache line more. ``cap`` is a power of two, so a row of 1,024 float32s or
    more is a whole number of pages and the block's rows, read at one element each (the output loop
    of attention as one kernel reads p and dp of its 8 rows at every key), fall in one L1 set and
    alias in the store-to-load check's low address bits; a line apart they do not. Measured on a
    2-vCPU AMD EPYC (Zen 4), the unbounded gradient of q (b1 h4 s1024 d64), its row-fused kernel on
    one thread: 22.9-28.6 ms at the plain pitch, 16.6-19.4 ms a line (or two, three or four lines)
    more."""
    return cap + (max(1, CACHE_LINE // dtype.itemsize) if rows > 1 else 0)


class _RowArray:
    """A row-stash value's local array: the DEFLOCAL, the hoisted reduction whose loop stores it, the
    value's axes that the array holds, and ``cap`` elements from one row to the next (``row_pitch``);
    the rest of an index names its row: ``rows``, the row each slot of the array holds (set by the
    first store; a row block has one slot per row)."""
    __slots__ = ("arr", "by", "axes", "cap", "rows", "stored", "done")

    def __init__(self, arr: int, by: KNode, axes: tuple[int, ...], cap: int) -> None:
        self.arr, self.by, self.axes, self.cap = arr, by, axes, cap
        self.rows: list[tuple] | None = None
        self.stored = self.done = False

    def pattern(self, idx: tuple[Lin, ...]) -> tuple:
        return tuple(None if d in self.axes else l for d, l in enumerate(idx))

    def slot(self, idx: tuple[Lin, ...]) -> int | None:
        """The slot holding the row ``idx`` reads (its axes but the kept ones), or None."""
        p = self.pattern(idx)
        return next((k for k, r in enumerate(self.rows or ()) if r == p), None)

    def element(self, idx: tuple[Lin, ...], shape: tuple[int, ...], slot: int) -> Lin:
        return flat_index(tuple(idx[d] for d in self.axes), tuple(shape[d] for d in self.axes)) + slot * self.cap


def _zero(dt: DType) -> Any:
    return False if dt is bool_ else (0.0 if dt.is_float else 0)


def verify_emitted(lk: LoopKernel, when: str) -> None:
    """``loopir.verify``, naming the kernel and the pass after which its loop IR broke."""
    try:
        verify(lk)
    except LoopIRError as e:
        listing = str(lk).splitlines()
        more = f"\n  ... {len(listing) - 80} more lines" if len(listing) > 80 else ""
        raise LoopIRError(f"kernel {lk.name}, {when}: {e}\n" + "\n".join(listing[:80]) + more) from None


def lower_kernel(kernel: Kernel, plan: KernelPlan, upcast: tuple[int, int] | None = None,
                 options: LowerOptions | None = None) -> LoopKernel:
    """The loop IR of one kernel of ``plan``. ``upcast`` forces the register lanes (last output
    axis, the axis before); None lets the lanes pass choose. ``options`` switches passes off or
    changes their thresholds (``passes.LowerOptions``)."""
    options = options if options is not None else LowerOptions()
    if upcast is not None:
        options = replace(options, upcast=upcast)
    _room_for(kernel.ast)
    with symbolic.lowering():          # (its interned index expressions stay until it is done)
        return Lowerer(merge_reduced(merge_axes(collapse(kernel))), plan, options=options).lower()


FRAMES_PER_LEVEL = 8          # Python frames the emitter's recursive render takes per body level (3-4 seen)


def _room_for(root: KNode) -> None:
    """Raise Python's recursion limit, if needed, for the emitter's recursive walk of a body as deep
    as ``root``'s: a 400-op chain fused into one kernel (DeviceParams.max_nodes raised to 320) hit
    RecursionError at the default 1,000 frames. Python 3.11+ runs Python-to-Python calls without
    growing the C stack, so the limit is safe to raise this far."""
    depth: dict[int, int] = {}
    for n in root.walk():
        depth[id(n)] = 1 + max((depth[id(s)] for s in n.src), default=0)
    need = FRAMES_PER_LEVEL * depth[id(root)] + 200
    if sys.getrecursionlimit() < need:
        sys.setrecursionlimit(need)
