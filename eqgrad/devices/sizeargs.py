"""Sizes that keep changing become kernel arguments: a kernel family compiles once for all its sizes.

A plan resized for new sizes (graph/resize.py) lowers its changed kernels again, and each lowers
to the loop IR it had before except for some index constants and loop extents: a KV cache that
grows by one position a step changes a reduction's extent, a stride and a pad offset, and nothing
else. Those kernels form a *family*: loop IR equal instruction for instruction once the values
of the index ``CONST``s and the ``RANGE`` extents are left out (the *skeleton*; the leading
parallel loop's extent is left out of the program already, as ``[lo, hi)`` are arguments).

The first ``CONCRETE_SIZES`` size vectors of a family compile as usual, with their sizes as
literals: a batch size and the last partial batch, say, each get code specialized to their
constants (LLVM turns a division by a constant into a multiply, unrolls a short loop whose trip
count it knows). A family seen with more size vectors than that has sizes that keep changing; the
next new one compiles a *sized* program, where every position whose value differs between the
family's vectors is read at run time from an i64 array argument (``render_llvm(sized=...)``), and
every later size vector that differs only in those positions runs that program with its own
values: it is lowered (to find out that it is a member) but neither rendered nor compiled.

Sound by construction: a member's loop IR is the sized program's loop IR with its values put back
in, instruction for instruction; anything else about it that the sizes change (a lane count, a
simplification that removed an instruction, two constants that CSE merged at one size and not at
another) changes the skeleton, and the kernel compiles as usual.

Reduction extents are arguments from the first compile. A reduction loop's trip count is the size
of the axis it sums, and that is the size that changes most often: a last partial batch or a new
batch size changes only the trip counts of the loops that sum over the batch (the weight gradients,
the loss's mean) -- the MLP step at batch 64 then 29 had six such kernels of the seven that changed,
each differing from its family in that one extent, nothing else. So a kernel's first programs read
the extents of its reduction loops of at least ``SPECULATE_MIN`` iterations at run time
(``Shape.reductions``); the next batch size runs them with its own extents and compiles nothing.
A short reduction loop (a 3x3 window, a loop over lanes) keeps its literal extent, which LLVM
unrolls completely; a long one runs as a loop either way. An instance of a trace (lower/trace.py: a
body whose sizes keep changing) reads exactly its trace's sizes: a long reduction extent the trace
holds fixed is a literal in its program (LLVM splits and vectorizes a loop it knows the count of: a
decode step's dot products over the head dim, 0.39 -> 0.13 ms), and an instance that starts a
family is compiled sized at once. A short loop of any kind keeps its literal
in the sized program too, unless the family has counted through other short extents at that
position (a cache growing from 5 positions, where each new length would compile): softmax over
rows of 15 after rows of 64 and 128 ran 138 us with the row length read at run time, 91 us with it
a literal, as compiled alone (``Families.plan``). Measured in one process, each plan's
kernels sized and not (MLP, ResNet and BERT steps, matmul, softmax, layernorm, attention, conv):
the same run time within 1-2 %, the noise; but such kernels compile 20-70 % slower, as LLVM adds
remainder loops for a trip count it does not know (docs/devices.md). A kernel that writes with
streaming stores compiles as before (a sized program does not use them).

The LLVM device keeps families (devices/cpu.py; ``render_llvm(sized=...)`` reads an ``i64``
array), and so do the C-style devices, OpenCL and CUDA, through ``SizedSources`` below
(``CStyleRenderer.render(k, sized)`` reads a 64-bit buffer), where the work-items' loops are sizes
as well (``launch_split=False``) and the launch form keys the family too.

``EQGRAD_SIZE_ARGS=0`` turns sized programs off (every size compiles its own code).
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from eqgrad import config
from eqgrad.graph.loopir import INDEX, LoopKernel
from eqgrad.graph.plan import lru_entry
from eqgrad.lower.decomp import decompose

CONCRETE_SIZES = 2       # size vectors of a family compiled with literal sizes before a sized program (docs/lowering.md, Constants)
# Reduction loops of at least this many iterations read their extent at run time from the first
# compile on (see above). Below it LLVM unrolls a loop of a small body completely (its default
# threshold admits a few hundred instructions), so a short window's literal extent is worth keeping;
# the value is a property of the code's shape, not of a machine.
SPECULATE_MIN = 16       # docs/lowering.md, Constants
MAX_FAMILIES = 1024      # families remembered (least recently used dropped); each holds weak references only (docs/lowering.md, Constants)


class Skeleton:
    """A loop kernel's instructions without their sizes, hashed once (a family is looked up for
    every kernel of every prepared plan, and a long tuple hashes anew each time)."""
    __slots__ = ("items", "_hash", "__weakref__")

    def __init__(self, items: tuple) -> None:
        self.items, self._hash = items, hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Skeleton) and self._hash == other._hash and self.items == other.items


@dataclass(frozen=True)
class Shape:
    """What the family bookkeeping needs of one (decomposed) loop kernel."""
    skeleton: Skeleton            # the loop IR without its sizes: the family's key
    positions: tuple[int, ...]    # instruction ids whose value is a size
    values: tuple[int, ...]       # those values, in that order
    reductions: tuple[int, ...] = ()   # indices into positions: reduction loops of >= SPECULATE_MIN iterations
    short: tuple[int, ...] = ()        # indices into positions: loops of < SPECULATE_MIN iterations (``plan``)
    traced: tuple[int, ...] = ()       # indices into positions: sizes of a trace's symbols (``plan``)


def _shape(skeleton: Skeleton, positions: tuple[int, ...], values: tuple[int, ...], loops: frozenset[int],
           ranges: frozenset[int], traced: tuple[int, ...] = ()) -> Shape:
    """The Shape of a member with these ``values``, whose reduction loops and loops (all of them)
    are at the indices ``loops`` and ``ranges`` into ``positions``, and whose sizes at ``traced``
    are its trace's symbols (an instance of a trace: lower/trace.py)."""
    return Shape(skeleton, positions, values, tuple(j for j in sorted(loops) if values[j] >= SPECULATE_MIN),
                 tuple(j for j in sorted(ranges) if values[j] < SPECULATE_MIN), traced)


def split_sizes(lk: LoopKernel, launch_split: bool = True) -> Shape:
    """The loop kernel's skeleton and its sizes: every index ``CONST`` and every ``RANGE`` but the
    split one where the program takes its extent as ``[lo, hi)`` already (``launch_split``: the
    CPU's programs; a GPU-style program's parallel loops are its work-items, and their extents are
    sizes like any other)."""
    return _split_sizes(lk, launch_split)[0]


def _split_sizes(lk: LoopKernel, launch_split: bool = True) -> tuple[Shape, frozenset[int], frozenset[int]]:
    """``split_sizes`` and the indices into its positions of the reduction loops and of all the
    loops (whatever their extent)."""
    split = lk.parallel_ranges()[0] if lk.parallel and launch_split else None
    items: list[Any] = []
    positions, values = [], []
    open_ranges: list[int] = []             # RANGEs open at this instruction, outermost first
    reduce: set[int] = set()                # RANGEs inside which an accumulator declared outside them grows
    for i, x in enumerate(lk.insts):
        if x.op == "RANGE":
            open_ranges.append(i)
        elif x.op == "ENDRANGE":
            open_ranges.pop()
        elif x.op == "ACCUM":
            reduce.update(r for r in open_ranges if r > x.src[0])
        if i == split:                      # its extent is the launch's, not the program's
            items.append((x.op, x.dtype, x.src))
        elif (x.op == "CONST" and x.dtype == INDEX) or x.op == "RANGE":
            positions.append(i)
            values.append(int(x.arg))
            items.append((x.op, x.dtype, x.src))
        else:
            items.append(x)
    params = tuple((d.name, w) for _, d, w in lk.params)
    loops = frozenset(j for j, i in enumerate(positions) if i in reduce)
    ranges = frozenset(j for j, i in enumerate(positions) if lk.insts[i].op == "RANGE")
    return _shape(Skeleton((tuple(items), params, lk.parallel, lk.loop_vectorize, lk.vector_lanes, lk.row_loops)),
                  tuple(positions), tuple(values), loops, ranges), loops, ranges


class Sized:
    """A sized program bound to one member's values: called like the program itself."""
    __slots__ = ("program", "sizes", "_addr", "nontemporal", "__weakref__")

    def __init__(self, program: Any, sizes: list[int]) -> None:
        self.program = program
        self.sizes = np.array(sizes or [0], dtype=np.int64)     # kept alive with the binding
        self._addr = self.sizes.ctypes.data
        self.nontemporal = False

    def __call__(self, *ptrs: int, lo: int, hi: int) -> None:
        self.program(*ptrs, self._addr, lo=lo, hi=hi)

    def native(self, ptrs: list[int] | tuple[int, ...]) -> tuple[int, list[int]]:
        """(the program's function address, its pointer arguments): ``LLVMProgram.native``."""
        return self.program.native([*ptrs, self._addr])


class _Family:
    __slots__ = ("concrete", "sized", "seen")

    def __init__(self) -> None:
        self.concrete: OrderedDict[tuple[int, ...], Any] = OrderedDict()   # values -> weakref to its program
        # its sized programs, newest first: (weakref to the program, the indices into Shape.positions
        # that it reads, the (index, value) pairs of the sizes compiled into it)
        self.sized: list[tuple[Any, tuple[int, ...], tuple[tuple[int, int], ...]]] = []
        self.seen: OrderedDict[tuple[int, ...], None] = OrderedDict()     # size vectors compiled, oldest first


class Families:
    """The families a device has compiled, by (skeleton, whatever else keys its programs).
    ``native``: the renderer's op table (loop kernels are decomposed for it before comparing);
    ``launch_split``: the programs take their split loop's extent at launch (``split_sizes``)."""

    def __init__(self, native: Any, launch_split: bool = True) -> None:
        self.native = native
        self.launch_split = launch_split
        self._items: OrderedDict[tuple, _Family] = OrderedDict()
        self._lock = threading.Lock()
        # by id of the lowered kernel: (a weak reference to it, it decomposed, its Shape); an entry
        # goes with its kernel (the lowering's memo drops kernels past its bound)
        self._shapes: dict[int, tuple[Any, LoopKernel | None, Shape]] = {}
        # one Skeleton object per distinct skeleton: a member's key is then found by identity, not
        # by comparing its ~200 instructions at each of a prepare's half-dozen lookups (a growing
        # KV cache: 24 comparisons a decode step, ~4 ms); by hash, held weakly
        self._skeletons: dict[int, list[weakref.ref]] = {}
        # by id of a trace's holes (lower/trace.py): (a weak reference to them, the skeleton of
        # every instance -- None when it is not the same for all --, the positions, the reduction
        # loops among them)
        self._by_holes: dict[int, tuple] = {}
        # by id of a trace's holes: (a weak reference to them, where each position's value comes
        # from: ``rebound``)
        self._tables: dict[int, tuple] = {}
        self.rebinds = 0        # members found by ``rebound`` (the device counts those it ran so)

    def shape_of(self, lk: LoopKernel) -> tuple[LoopKernel, Shape]:
        """``lk`` decomposed for the renderer and its Shape, worked out once per loop kernel (the
        lowering keeps a kernel's loop IR by structure, so a repeated kernel is the same object)."""
        hit = self._shapes.get(id(lk))
        if hit is None or hit[0]() is not lk:
            traced = lk.__dict__.get("traced")          # lowered by a trace (lower/trace.py)
            dk, holes = traced[0].decomposed(lk, self.native) if traced is not None else (None, None)
            if dk is None:
                dk = decompose(lk, self.native)
            shape = self._traced_shape(dk, holes) if holes is not None else None
            if shape is None:
                shape = split_sizes(dk, self.launch_split)
                canon = self._canonical(shape.skeleton)
                if canon is not shape.skeleton:
                    shape = replace(shape, skeleton=canon)
            # (decompose returns ``lk`` itself when it has nothing to rewrite: not held strongly)
            hit = (weakref.ref(lk), None if dk is lk else dk, shape)
            self._shapes[id(lk)] = hit
            weakref.finalize(lk, self._shapes.pop, id(lk), None)
        return (lk if hit[1] is None else hit[1]), hit[2]

    def _traced_shape(self, dk: LoopKernel, holes: Any) -> Shape | None:
        """The Shape of a loop kernel instantiated from a trace's ``holes`` (lower/trace.py): when
        every size the trace put in is at one of the Shape's positions, every instance has the same
        skeleton and positions, so they are worked out for the first one and only the values are
        read for the others (a decode step's attention: ~0.1 ms a kernel instead of a walk of its
        instructions and a comparison with its family's). None: work it out as usual."""
        memo = self._by_holes.get(id(holes))
        if memo is not None and memo[0]() is holes:
            _, skeleton, positions, loops, ranges, traced = memo
            if skeleton is None:
                return None
            insts = dk.insts
            return _shape(skeleton, positions, tuple(int(insts[i].arg) for i in positions), loops, ranges, traced)
        shape, loops, ranges = _split_sizes(dk, self.launch_split)
        at = set(shape.positions)
        if dk.parallel and self.launch_split:
            at.add(dk.parallel_ranges()[0])
        fits = all(f == "arg" and i in at for i, f in holes.holes)
        skeleton = self._canonical(shape.skeleton) if fits else None
        put = {i for i, _ in holes.holes}
        traced = tuple(j for j, i in enumerate(shape.positions) if i in put)
        self._by_holes[id(holes)] = (weakref.ref(holes), skeleton, shape.positions, loops, ranges, traced)
        weakref.finalize(holes, self._by_holes.pop, id(holes), None)
        if skeleton is None:
            return None
        return replace(shape, skeleton=skeleton, traced=traced)

    def rebound(self, tr: Any, env: tuple[int, ...]) -> tuple[Shape, int] | None:
        """(the Shape, the split loop's extent) of trace ``tr``'s instance for the symbols' values
        ``env`` (lower/trace.py ``Traces.bind``), read from the trace's holes without instantiating
        its loop IR or decomposing it: what ``shape_of`` gives that instance once an earlier
        instance of the trace has been through it (its skeleton and positions are every
        instance's: ``_traced_shape``). A growing sequence's changed kernels are members of sized
        families whose program only needs these values (a decode step's 5 changed kernels: no
        loop IR made for them). None where it cannot tell: then lower and ``shape_of``."""
        h = tr.decomposed_holes(self.native)
        memo = self._by_holes.get(id(h)) if h is not None else None
        if memo is None or memo[0]() is not h or memo[1] is None:
            return None
        _, skeleton, positions, loops, ranges, traced = memo
        ir = tr.ir
        if type(ir.lk.parallel) is not int:
            return None
        table = self._tables.get(id(h))
        if table is None or table[0]() is not h:
            where = {i: j for j, (i, _) in enumerate(h.holes)}
            insts = h.lk.insts
            # each position's value: the hole's (its index into the holes' values), or the
            # constant every instance has there; and the split loop's extent likewise, from the
            # loop IR's holes (its first parallel RANGE, LoopKernel.parallel_ranges)
            split = len(ir.lk.params)
            at = next((j for j, (i, _) in enumerate(ir.holes) if i == split), -1) if ir.lk.parallel else -1
            extent = 1 if not ir.lk.parallel else ir.lk.insts[split].arg if at < 0 else 0
            table = self._tables[id(h)] = (weakref.ref(h), tuple(
                (where[i], 0) if i in where else (-1, int(insts[i].arg)) for i in positions), (at, extent))
            weakref.finalize(h, self._tables.pop, id(h), None)
        at, extent = table[2]
        try:
            hv, iv = h.values(*env), ir.values(*env)          # (either may raise: so would the instance)
            values = tuple(hv[j] if j >= 0 else c for j, c in table[1])
            n = iv[at] if at >= 0 else extent
        except Exception:                   # (a size that is now 0 in a division): lowered as usual
            return None
        if type(n) is not int:
            return None
        if any(type(v) is not int for v in values):
            return None
        return _shape(skeleton, positions, values, loops, ranges, traced), n

    def _canonical(self, sk: Skeleton) -> Skeleton:
        """The Skeleton object equal to ``sk`` that a live kernel's Shape holds, else ``sk`` itself.
        (No weakref callbacks: one could run inside this lock, from a collection it triggers.)"""
        with self._lock:
            h = hash(sk)
            bucket = [r for r in self._skeletons.get(h, ()) if r() is not None]
            for ref in bucket:
                o = ref()
                if o is not None and o == sk:
                    return o
            bucket.append(weakref.ref(sk))
            self._skeletons[h] = bucket
            if len(self._skeletons) > 2 * MAX_FAMILIES:     # sweep the buckets of dead skeletons
                self._skeletons = {k: b for k, b in self._skeletons.items()
                                   if any(r() is not None for r in b)}
            return sk

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()

    def _family(self, key: tuple) -> _Family:
        return lru_entry(self._items, key, _Family, MAX_FAMILIES)

    def find(self, key: tuple, shape: Shape) -> Any:
        """The live program for these values (a concrete one, or a sized one bound to them), or
        None: then ``plan`` says what to compile."""
        with self._lock:
            fam = self._family(key)
            ref = fam.concrete.get(shape.values)
            prg = ref() if ref is not None else None
            if prg is not None:
                return prg
            fam.sized = [e for e in fam.sized if e[0]() is not None]
            for ref, slots, fixed in fam.sized:
                sized = ref()
                if sized is not None and all(shape.values[j] == v for j, v in fixed):
                    return Sized(sized, [shape.values[j] for j in slots])
            return None

    def plan(self, key: tuple, shape: Shape, speculate: bool = True) -> dict[int, int] | None:
        """None: compile this member with its sizes as literals (and ``add`` it); else the sized
        program to compile, as render_llvm's ``sized`` (instruction id -> slot): the member's long
        reduction extents (if ``speculate``), and, once the family has been compiled for
        CONCRETE_SIZES other size vectors, every size that differs between them -- but a short
        loop's extent (``Shape.short``) where no other vector seen has another short extent there
        (module docstring). An instance of a trace (``Shape.traced``): exactly its trace's sizes,
        but such a short extent."""
        with self._lock:
            fam = self._family(key)
            seen = [v for v in fam.seen if v != shape.values]
            # a short loop keeps its literal extent unless the family counts through short extents
            # there (a sequence growing from 5): see the docstring
            literal = {j for j in shape.short
                       if not any(v[j] != shape.values[j] and v[j] < SPECULATE_MIN for v in seen)}
            if shape.traced:
                # an instance of a trace (lower/trace.py): its body's sizes keep changing, and the
                # trace's symbols say where -- exactly those are arguments, at once (a growing cache
                # crossing a lane multiple is traced again there, and compiled 3 programs, ~55 ms a
                # step, before the new family's was sized), and a long reduction's extent the trace
                # holds fixed stays a literal: a decode step's dot products over the head dim, with
                # the cache's length an argument, ran 0.39 against 0.14 ms with their extent 64 read
                # at run time (LLVM splits and vectorizes a loop of known extent around the rotary
                # halves' select)
                varying = set(shape.traced) - literal
            else:
                varying = set(shape.reductions if speculate else ())
                if len(seen) >= CONCRETE_SIZES:
                    vectors = seen + [shape.values]
                    varying.update(j for j in range(len(shape.values))
                                   if j not in literal and len({v[j] for v in vectors}) > 1)
            return {shape.positions[j]: n for n, j in enumerate(sorted(varying))} if varying else None

    def _saw(self, fam: _Family, values: tuple[int, ...]) -> None:
        fam.seen[values] = None
        fam.seen.move_to_end(values)
        while len(fam.seen) > 2 * CONCRETE_SIZES:
            fam.seen.popitem(last=False)

    def add(self, key: tuple, shape: Shape, program: Any) -> None:
        with self._lock:
            fam = self._family(key)
            fam.concrete[shape.values] = weakref.ref(program)
            while len(fam.concrete) > 2 * CONCRETE_SIZES:
                fam.concrete.popitem(last=False)
            self._saw(fam, shape.values)

    def add_sized(self, key: tuple, shape: Shape, sized: dict[int, int], program: Any) -> Sized:
        """Record the sized program just compiled for ``shape`` and return it bound to its values."""
        slots = tuple(shape.positions.index(i) for i, _ in sorted(sized.items(), key=lambda t: t[1]))
        taken = set(slots)
        fixed = tuple((j, v) for j, v in enumerate(shape.values) if j not in taken)
        with self._lock:
            fam = self._family(key)
            fam.sized.insert(0, (weakref.ref(program), slots, fixed))
            del fam.sized[2 * CONCRETE_SIZES:]
            self._saw(fam, shape.values)
        return Sized(program, [shape.values[j] for j in slots])

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


class _Source:
    """A source a C-style device's family holds (weakly; ``SizedSources`` keeps it)."""
    __slots__ = ("src", "__weakref__")

    def __init__(self, src: str) -> None:
        self.src = src


class SizedSources:
    """Which source runs each kernel on a C-style device (OpenCL, CUDA: ``CStyleRenderer``): the
    families above, with the work-items' loops as sizes (``launch_split=False``: their extents
    appear in a kernel's bounds check and in the division of a linear id) and the launch form
    (grid, group, flat: ``CStyleRenderer.launch``, which depends on sizes) in the family's key. A
    sized source reads its sizes from a last argument ``sz`` (``CStyleRenderer.render(k, sized)``)
    that the device fills with the member's values."""

    def __init__(self, renderer: Any, language: str) -> None:
        self.renderer, self.language = renderer, language
        self.families = Families(renderer.code_for_op, launch_split=False)
        self._sources: dict[str, _Source] = {}       # every source built, held for the families

    def source(self, device: Any, k: Any, plan: Any) -> tuple[LoopKernel, str, np.ndarray | None, Any]:
        """Kernel ``k``'s loop IR (decomposed for the renderer), the source of the program that
        runs it, the sizes that program reads at run time (None: its sizes are literals), and what
        records a new program in its family once it is built (None: nothing to record; a source
        that fails to build joins no family)."""
        r = self.renderer
        if not config.SIZE_ARGS.value:
            return (*device.render_kernel(k, plan, r.render, self.language), None, None)
        if self.families.native is not r.code_for_op:       # (the renderer's table was replaced)
            self.families = Families(r.code_for_op, launch_split=False)
        lk = device.lowered_kernel(k, plan)
        dk, shape = self.families.shape_of(lk)
        # the source depends on the renderer's settings and, through its launch form (a "group"
        # launch is one whose reduction a work-group shares), on sizes
        key = (shape.skeleton, r.launch(dk).mode, r.reduce_group, r.group_size, r.max_grid)
        hit = self.families.find(key, shape)
        sized = self.families.plan(key, shape) if hit is None else None
        if hit is None:
            src = r.render(dk) if sized is None else r.render(dk, sized)
        else:
            src = hit.program.src if isinstance(hit, Sized) else hit.src
        if config.DEBUG.value >= 5:
            print(f"--- loop IR {k.name}\n{dk}")
        if config.DEBUG.value >= 4:
            n = len(hit.sizes) if isinstance(hit, Sized) else len(sized or ())
            print(f"--- {self.language} {k.name}{f' (sized: {n} sizes are arguments)' if n else ''}\n{src}")
        if hit is not None:
            return dk, src, (hit.sizes if isinstance(hit, Sized) else None), None
        prg = self._sources.get(src) or _Source(src)

        def built() -> None:
            self._sources[src] = prg
            if sized is None:
                self.families.add(key, shape, prg)
            else:
                self.families.add_sized(key, shape, sized, prg)
        if sized is None:
            return dk, src, None, built
        order = sorted(sized, key=sized.get)            # positions by slot
        return dk, src, np.array([shape.values[shape.positions.index(i)] for i in order], np.int64), built
