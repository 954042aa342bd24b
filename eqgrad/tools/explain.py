"""explain(): the chosen plan in words and pictures.

``eqgrad.explain(t)`` plans the tensors' graph (without running it) and returns an
:class:`Explanation`: each kernel with what it fuses, its bytes, FLOPs and predicted time; the best
rejected alternatives (single moves away from the chosen plan) with their predicted cost and why
they lost; the saturation report and the cost-model parameters. ``to_dot``/``to_svg`` draw the plan
(one cluster per kernel) and ``egraph_dot`` the e-graph around a chosen class (every node of each
class, the chosen ones filled), for people who would rather look than read. SVG needs Graphviz's
``dot`` program (``apt-get install graphviz``); the ``.dot`` text is always written.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eqgrad.dtype import DType
from eqgrad.devices import get_device
from eqgrad.engine import plan_for
from eqgrad.extract import cost_model
from eqgrad.extract.cost import default_cost
from eqgrad.extract.plan import build_plan
from eqgrad.graph.plan import cold_words, shared_memory
from eqgrad.lower.passes import LowerOptions, run_passes
from eqgrad.ops import numel
from eqgrad.rules.provenance import INPUT, rule_of


RENDERED = ("svg", "png", "pdf", "jpg", "gif", "ps", "json")     # formats save() renders through Graphviz


def _scalar_read(n) -> bool:
    """A read of a one-element buffer broadcast to a shape (a runtime parameter, extract/plan.py
    ``param_view``): a leaf for the reader, not ops the kernel fuses."""
    return (n.op == "BUF" and n.shape == ()) or (n.op in ("RESHAPE", "EXPAND") and _scalar_read(n.src[0]))


def provenance_of(cp: Any) -> dict[str, list[tuple[str, str]]]:
    """Kernel name -> (op, the rule that introduced the chosen e-node, or "input") for each node of
    the kernel's body, from a plan compiled under instrumented rules (``plan_for(provenance=True)``;
    rules/provenance.py). Leaves (buffers, constants, parameters) are left out."""
    g, res, plan = cp.egraph, cp.result, cp.plan
    if g is None or res is None or not g.provenance:
        return {}
    bodies: dict[str, list[int]] = {}
    build_plan(g, res.choice, plan.buffers[:plan.n_inputs], bodies=bodies)
    out: dict[str, list[tuple[str, str]]] = {}
    for name, classes in bodies.items():
        nodes = [res.choice[c] for c in classes]
        out[name] = [(n.op, rule_of(g.provenance.get(n, "?"))) for n in nodes
                     if n.op not in ("BUF", "CONST", "PARAM") and not (n.op == "REALIZE" and n is not nodes[0])]
    return out


def same_plan(a: Any, b: Any) -> bool:
    """Do two plans run the same kernels (bodies and output buffers)?"""
    return [(k.ast.render(), k.out) for k in a.kernels] == [(k.ast.render(), k.out) for k in b.kernels]


@dataclass
class Explanation:
    compiled: Any            # engine.CompiledPlan
    device: str
    cost: Any = None         # the extract.CostModel the plan was chosen under (None: the one in effect now)
    # kernel name -> (op, rule or "input") per chosen node (provenance_of); None: not asked for;
    # {} with ``provenance_note`` set: it could not be had (the note says why)
    provenance: dict[str, list[tuple[str, str]]] | None = None
    provenance_note: str = ""

    def device_plan(self) -> Any:
        """What the device does to the plan before it runs it (``Device.rewrite``: the LLVM device's
        reduction splits and BLAS routing), with a line per rewrite."""
        return get_device(self.device).rewrite(self.plan)

    def rules_used(self) -> dict[str, int]:
        """Rule -> how many chosen e-nodes of the plan it introduced (the input's nodes left out)."""
        out: dict[str, int] = {}
        for nodes in (self.provenance or {}).values():
            for _, r in nodes:
                if r != INPUT:
                    out[r] = out.get(r, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def lowering(self, dp: Any = None) -> list[tuple[str, str, str]]:
        """(kernel, pass, what it decided) for the lowering passes that change what a kernel of the
        device's plan computes where: row fusion (``hoist``), a value stored for reuse (``stash``:
        softmax's exp computed once per element), the values a row keeps in local arrays (``row
        stash``: attention's scores, when it is one kernel) and those computed as register blocks
        before the loop that reads them (``row dots``: those scores, and the ones each kernel of
        attention's bounded backward recomputes); docs/lowering.md. ``dp``: the device plan, when
        the caller has it already."""
        options = LowerOptions.for_caps(get_device(self.device).caps)
        out = []
        for k in (dp if dp is not None else self.device_plan()).plan.kernels:
            for st in run_passes(k, options):
                if st.name in ("hoist", "stash", "row stash", "row dots") and st.status == "applied" \
                        and not st.detail.startswith("nothing"):
                    out.append((k.name, st.name, st.detail))
        return out

    @property
    def plan(self):
        return self.compiled.plan

    @property
    def result(self):
        return self.compiled.result

    def kernels(self) -> list[dict]:
        out = []
        for k in self.plan.kernels:
            ops = [n.op for n in k.ast.walk() if n.op not in ("BUF", "CONST") and not _scalar_read(n)]
            out.append(dict(name=k.name, out=k.out, shape=self.plan.buffers[k.out][0], ops=ops,
                            bytes=k.nbytes, flops=k.flops, predicted=k.predicted, body=k.ast.render(),
                            hot=k.stats.hot if k.stats is not None else 0.0, warm=k.warm,
                            strided=k.stats.strided if k.stats is not None else 0.0,
                            provenance=(self.provenance or {}).get(k.name, [])))
        return out

    def __str__(self) -> str:
        cp, res = self.compiled, self.result
        cm = self.cost or cost_model(self.device)
        p = cm.params
        fn = "" if cm.fn is default_cost else \
            f"custom cost function {getattr(cm.fn, '__qualname__', type(cm.fn).__name__)} with "
        how = f"extractor {res.extractor} [{res.status}]" if res else \
            (self.plan.notes[0] if self.plan.notes else "extractor ?")
        lines = [f"plan: {len(self.plan.kernels)} kernel(s), predicted {self.plan.predicted * 1e6:.1f} us on {self.device} "
                 f"({how}; {fn}cost model {p.source}: "
                 f"launch {p.launch * 1e6:.1f} us, "
                 f"{p.bandwidth / 1e9:.1f} GB/s, {p.peak / 1e9:.1f} GFLOP/s"
                 + (f", {cold_words(p.cold, p.stream_bytes)}" if p.cold and p.stream_bytes else "")
                 + (f", {p.row_pass * 1e9:.2f} ns a row-fused kernel's loop over a row" if p.row_pass else "")
                 + (f", reads within {p.cache_bytes / 2 ** 20:g} MiB of reuse from cache at {p.cache_bandwidth / 1e9:.1f} GB/s"
                    if p.cache_bandwidth and p.cache_bytes else "")
                 + (f", strided reads at {p.strided_bandwidth / 1e9:.1f} GB/s" if p.strided_bandwidth else "") + ")",
                 f"saturation: {cp.report.stop_reason}, {cp.report.enodes_before} -> {cp.report.enodes} e-nodes, "
                 f"{cp.report.eclasses} e-classes"]
        held = sum(numel(s) * d.itemsize for s, d in self.plan.buffers[self.plan.n_inputs:])
        bound = res.info.get("peak_bound") if res else None
        io = getattr(cp.run, "buffer_io", None)
        owner = shared_memory(self.plan.buffers, self.plan.n_inputs, self.plan.outputs, io) if io is not None else {}
        at_once = held - sum(numel(self.plan.buffers[b][0]) * self.plan.buffers[b][1].itemsize for b in owner)
        lines.append(f"buffers: {held} bytes of intermediates and outputs, "
                     + (f"{at_once} held at once ({len(owner)} intermediates in the memory of one the launches "
                        "before them had finished with: graph/plan.py shared_memory)" if owner else
                        "all held while the plan runs")
                     + (f" (EQGRAD_PEAK_MEMORY {bound}: {'within' if held <= bound else 'OVER'} it)" if bound else ""))
        for m in (res.info.get("rows_moves", ()) if res else ()):
            lines.append(f"  rows phase: {m}")         # the plan priced as rows are kept, then each move
        for m in (res.info.get("memory_moves", ()) if res else ()):
            lines.append(f"  for the bound: {m}")      # the fastest plan, then each move the bound made
        for k in self.kernels():
            fused = " ".join(dict.fromkeys(k["ops"])) or "(copy)"
            lines.append(f"  {k['name']}: b{k['out']}{list(k['shape'])}  fuses {len(k['ops'])} ops [{fused}]  "
                         f"{k['bytes'] / 1e6:.3g} MB, {k['flops'] / 1e6:.3g} MFLOP, predicted {k['predicted'] * 1e6:.1f} us"
                         + (f" ({(k['predicted'] - k['warm']) * 1e6:.1f} us in plan order: {k['hot'] / 1e6:.3g} MB "
                            "read from cache)" if k["warm"] else "")
                         + (f" ({k['strided'] / 1e6:.3g} MB read strided)" if k["strided"] else ""))
            lines.append(f"      = {k['body'][:160]}{'...' if len(k['body']) > 160 else ''}")
            if k["provenance"]:
                lines.append("      introduced by: " + _by_rule(k["provenance"]))
        if self.provenance is not None:
            used = self.rules_used()
            lines.append("rules in the chosen plan: " + (", ".join(f"{r} ({n} node{'s' * (n != 1)})" for r, n in used.items())
                                                        or "none (every chosen node is the input's)")
                         if not self.provenance_note else f"provenance: {self.provenance_note}")
        dp = self.device_plan()
        lines.append(dp.describe(self.device))
        low = self.lowering(dp)
        if low:
            lines.append("lowering: " + "; ".join(f"{k} {p}: {d}" for k, p, d in low))
        if res and res.alternatives:
            lines.append("best rejected alternatives:")
            legal = [a for a in res.alternatives if a.legal][:4]
            illegal = [a for a in res.alternatives if not a.legal][:3]
            for a in legal + illegal:
                delta = (a.total - res.evaluation.total) * 1e6
                why = f"illegal: {a.why}" if not a.legal else f"predicted {delta:+.1f} us slower"
                lines.append(f"  {a.move}: {a.kernels} kernel(s), {a.total * 1e6:.1f} us -- {why}")
        if res and res.info:
            info = {k: v for k, v in res.info.items() if k != "evaluations"}
            if info:
                lines.append(f"extractor info: {info}")
        return "\n".join(lines)

    # ------------------------------------------------------------------ pictures
    def to_dot(self) -> str:
        out = ["digraph plan {", "  rankdir=BT; node [fontname=Helvetica fontsize=10];"]
        for i in range(self.plan.n_inputs):
            shp, dt = self.plan.buffers[i]
            out.append(f'  b{i} [shape=box style=filled fillcolor="#dddddd" label="input b{i}\\n{list(shp)} {dt.name}"];')
        for k in self.plan.kernels:
            out.append(f'  subgraph cluster_{k.name} {{ label="{k.name}: {k.predicted * 1e6:.1f} us"; color="#4477aa";')
            ids: dict[int, str] = {}
            for j, n in enumerate(k.ast.walk()):
                nid = f"{k.name}_{j}"
                ids[id(n)] = nid
                if n.op == "BUF":
                    continue
                label = n.op if n.op != "CONST" else f"{n.arg}"
                if n.arg is not None and n.op not in ("CONST",):
                    label += f"\\n{n.arg.name if isinstance(n.arg, DType) else n.arg}"
                out.append(f'    {nid} [label="{label}"];')
            out.append("  }")
            for n in k.ast.walk():
                for s in n.src:
                    src = f"b{s.arg}" if s.op == "BUF" else ids[id(s)]
                    out.append(f"  {src} -> {ids[id(n)]};")
            shp, dt = self.plan.buffers[k.out]
            out.append(f'  b{k.out} [shape=box style=filled fillcolor="#ffeeaa" label="b{k.out}\\n{list(shp)} {dt.name}"];')
            out.append(f"  {ids[id(k.ast)]} -> b{k.out};")
        out.append("}")
        return "\n".join(out)

    def egraph_dot(self, around: int | None = None, radius: int = 2) -> str:
        """The e-graph near class ``around`` (default: the first root): every node of each class,
        the chosen node filled, edges to child classes."""
        g = self.compiled.egraph
        if g is None:
            raise ValueError("egraph_dot: this plan has no e-graph of the whole program (stitched from regions: "
                             "engine/regions.py); explain(..., whole=True) plans it whole")
        choice = self.result.choice if self.result else {}
        start = g.roots[0] if around is None else around
        keep, frontier = {start}, {start}
        for _ in range(radius):
            nxt = set()
            for c in frontier:
                for n in g.classes[c]:
                    nxt.update(n.children)
            nxt -= keep
            keep |= nxt
            frontier = nxt
        out = ["digraph egraph {", "  compound=true; node [fontname=Helvetica fontsize=9];"]
        for c in sorted(keep):
            out.append(f'  subgraph cluster_c{c} {{ label="class {c} {list(g.shapes[c])}"; style=dashed;')
            for i, n in enumerate(g.classes[c]):
                fill = ' style=filled fillcolor="#aaddaa"' if choice.get(c) is n else ""
                out.append(f'    c{c}n{i} [label="{n.op}"{fill}];')
            out.append("  }")
        for c in sorted(keep):
            for i, n in enumerate(g.classes[c]):
                for d in n.children:
                    if d in keep:
                        out.append(f'  c{c}n{i} -> c{d}n0 [lhead=cluster_c{d}];')
        out.append("}")
        return "\n".join(out)

    def save(self, path: str | Path, what: str = "plan", **kw: Any) -> Path:
        """Write ``path``: its suffix picks the format -- ``.dot`` (the Graphviz text), or one that
        Graphviz's ``dot`` renders (``.svg .png .pdf .jpg .gif .ps .json``; the .dot is written next
        to it). Returns ``path``. Without Graphviz a rendered format is a RuntimeError that says the
        .dot was written; an unknown suffix is a ValueError naming the formats."""
        path = Path(path)
        fmt = path.suffix.lower().lstrip(".")
        if fmt != "dot" and fmt not in RENDERED:
            raise ValueError(f"save(): unknown format {path.suffix!r}; expected .dot or one of "
                             f"{', '.join('.' + f for f in RENDERED)}")
        dot = self.to_dot() if what == "plan" else self.egraph_dot(**kw)
        dot_path = path.with_suffix(".dot")
        dot_path.write_text(dot)
        if fmt == "dot":
            return dot_path
        exe = shutil.which("dot")
        if exe is None:
            raise RuntimeError(f"wrote {dot_path}; rendering {path.suffix} needs Graphviz's 'dot' "
                               "(apt-get install graphviz)")
        subprocess.run([exe, f"-T{fmt}", str(dot_path), "-o", str(path)], check=True, capture_output=True)
        return path


def _by_rule(nodes: list[tuple[str, str]]) -> str:
    """``input`` nodes and each rule's, with the ops each introduced: "input: 5 (ADD RSUM), fuse-add: 1 (ADD)"."""
    groups: dict[str, list[str]] = {}
    for op, r in nodes:
        groups.setdefault(r, []).append(op)
    return ", ".join(f"{r}: {len(ops)} ({' '.join(dict.fromkeys(ops))})" for r, ops in groups.items())


def explain(*tensors: Any, provenance: bool = True, whole: bool = False) -> Explanation:
    """Plan (without running) the graph of ``tensors`` and explain the plan. ``provenance``: also
    name the rule (or the input) that introduced each chosen e-node -- the graph is planned a second
    time under instrumented rules (rules/provenance.py), which costs about one more compile; when
    that plan differs from the real one (possible only near the e-graph node limit) it is not shown
    and ``provenance_note`` says so. A program of repeated layers is planned by regions
    (engine/regions.py): that stitched plan is the one shown, as realize runs it, without the
    extractor's alternatives and provenance (they are per region); ``whole=True`` plans the program
    whole instead, with both (slower: a 30-layer decoder step 17 s with provenance, 9 s without,
    against 1 s), and realize then runs that plan."""
    lbs = [t.lazydata for t in tensors]
    cp, device = plan_for(lbs, whole=whole)
    ex = Explanation(cp, device, cost_model(device))         # the cost model in effect while planning
    if cp.egraph is None:                                    # stitched from regions (plan_for)
        if provenance:
            ex.provenance, ex.provenance_note = {}, (
                "the plan is stitched from separately planned regions (engine/regions.py); "
                "explain(..., whole=True) plans the program whole, with provenance and alternatives")
        return ex
    if provenance:
        pcp, _ = plan_for(lbs, provenance=True)
        if pcp.report.stop_reason not in ("completed", "node limit") or pcp.egraph is None:
            ex.provenance, ex.provenance_note = {}, f"the instrumented planning stopped: {pcp.report.stop_reason}"
        elif not same_plan(pcp.plan, cp.plan):
            ex.provenance, ex.provenance_note = {}, ("the instrumented planning chose another plan (the recorded "
                                                     "provenance rows count toward the e-graph's node limit)")
        else:
            ex.provenance = provenance_of(pcp)
    return ex
