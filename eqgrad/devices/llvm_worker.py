"""How LLVM IR becomes object code -- one function for both processes -- and the compile worker.

``compile_object`` is the whole pipeline: parse, verify, O3 for the target machine (loop and SLP
vectorization, unrolling), non-temporal stores where asked, codegen. ``LLVMCompiler`` (llvm.py)
runs it in this process; the compile worker runs the same function in a second one, so a plan's
new kernels compile two at a time (compilepool.py has the parent side and why).

This file is also the worker's *script* (``python -S .../eqgrad/devices/llvm_worker.py R W PATH``,
PATH the parent's ``sys.path`` as JSON, which finds llvmlite without the site module): it
imports nothing of eqgrad and nothing beyond the standard library until llvmlite, so the worker is
ready in ~0.15 s, where importing eqgrad takes ~0.5 s. Its protocol, on two pipes of
``multiprocessing.connection`` messages: the parent sends ``(id, (cpu, features), (src, name,
symbol, nontemporal))``, the worker answers ``(id, True, (object code, non-temporal stores))`` or
``(id, False, "what went wrong")``; ``None`` or the end of the pipe ends it.
"""
from __future__ import annotations

import sys

if __name__ == "__main__" and sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    del sys.path[0]        # a script's folder goes first on sys.path: eqgrad/devices must not shadow anything

import re
from typing import Any

# A <N x float> store at a multiple of N from a 64-byte aligned base is 4N-byte aligned (the vector
# width is the target's: 16 lanes with AVX-512, 8 with AVX2, 4 with SSE); llvm.py's streaming_store
# says when the runtime guarantees that.
_ACCUMULATOR = re.compile(r"^  %a\d+ = alloca ", re.M)      # llvm.py's DEFACC
_VEC_STORE = re.compile(r"(store <(4|8|16) x (?:float|i32)> %[\w.]+, ptr %[\w.]+), align 4(?=\n)")


def target_machine(llvm: Any, cpu: str, features: str) -> Any:
    """A new target machine (an llvmlite engine takes ownership of the one it is created with, so
    engines must never share one)."""
    return llvm.Target.from_default_triple().create_target_machine(opt=3, cpu=cpu, features=features,
                                                                   codemodel="jitdefault")


def free_pass_manager(mpm: Any) -> None:
    """Free an O3 module pass manager. In llvmlite 0.50 ``ModulePassManager`` finds ``_dispose`` on
    ``ObjectRef`` (a no-op) before ``NewPassManager``'s, so a dropped one is never freed: ~70 KB per
    compile (2,000 compiles of a small kernel: +142 MB RSS; +4 MB when freed here). A llvmlite
    whose class frees itself is left to do so."""
    from llvmlite.binding import ffi, newpassmanagers
    if type(mpm)._dispose is not ffi.ObjectRef._dispose:
        mpm.close()
        return
    newpassmanagers.NewPassManager._dispose(mpm)
    mpm.detach()


def optimize(llvm: Any, tm: Any, mod: Any, slp: bool = True, vectorize: bool = True) -> Any:
    """Run the O3 pipeline for ``tm``'s target on a parsed module (in place); returns it."""
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = vectorize
    pto.slp_vectorization = slp
    pto.loop_unrolling = vectorize
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    try:
        mpm.run(mod, pb)
    finally:
        free_pass_manager(mpm)
    return mod


def wants_slp(src: str) -> bool:
    """Does this kernel need LLVM's SLP vectorizer? Not an elementwise one -- loops without an
    accumulator (``%aN = alloca``) or lanes, which the loop vectorizer vectorizes whole: there SLP
    searched the vectorized body for more, 35 % of the LLVM time of a 2,000-op chain's largest
    kernel (0.30 of 0.90 s). A lane kernel keeps it (it packs the lanes the renderer could not
    emit as vectors, ``llvm._Lanes``), and so does a reduction: without it, the row-fused layer
    norm with weight and bias ran 15-25 % slower (bench_core, 2 runs each)."""
    return '"llvm.loop.vectorize.width", i32 1' in src or _ACCUMULATOR.search(src) is not None


def is_tiny(src: str) -> bool:
    """Does the renderer mark this kernel tiny (llvm.py ``TINY_ITERATIONS``: its loops run so few
    iterations in all that vectorizing and unrolling them only cost compile time)?"""
    return src[:src.find("\n")].endswith(" (tiny)")


def compile_object(llvm: Any, tm: Any, src: str, name: str, symbol: str, nontemporal: bool = False) -> tuple[bytes, int]:
    """Optimize (O3, for ``tm``'s target; a tiny kernel without vectorizers and unrolling,
    ``is_tiny``) and compile ``src`` with its function ``name`` renamed
    ``symbol``; returns (the object code, how many vector stores were made non-temporal)."""
    mod = llvm.parse_assembly(src.replace(f"@{name}(", f"@{symbol}("))
    mod.verify()
    tiny = is_tiny(src)
    optimize(llvm, tm, mod, slp=wants_slp(src) and not tiny, vectorize=not tiny)
    hits = 0
    if nontemporal:
        text = str(mod)
        md = 1 + max((int(m) for m in re.findall(r"!(\d+)", text)), default=0)
        text, hits = _VEC_STORE.subn(lambda m: f"{m[1]}, align {4 * int(m[2])}, !nontemporal !{md}", text)
        if hits:
            mod = llvm.parse_assembly(text + f"\n!{md} = !{{i32 1}}\n")
            mod.verify()
    return tm.emit_object(mod), hits


def main() -> None:
    """The worker process (run as a script by compilepool.py with its two pipe fds)."""
    from multiprocessing.connection import Connection
    if len(sys.argv) > 3:      # started with -S: the parent's sys.path finds llvmlite
        import json
        sys.path += [p for p in json.loads(sys.argv[3]) if p not in sys.path]
    import llvmlite.binding as llvm
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    conn_in = Connection(int(sys.argv[1]), writable=False)
    conn_out = Connection(int(sys.argv[2]), readable=False)
    machines: dict[tuple[str, str], Any] = {}
    try:
        conn_out.send(("ready", True, None))
    except OSError:           # the parent is gone already (a forked child that exited): nothing to serve
        return
    while True:
        try:
            req = conn_in.recv()
        except (EOFError, OSError):
            return
        if req is None:
            return
        rid, target, job = req
        try:
            tm = machines.get(target) or machines.setdefault(target, target_machine(llvm, *target))
            conn_out.send((rid, True, compile_object(llvm, tm, *job)))
        except Exception as e:            # reported: the parent compiles this kernel itself
            conn_out.send((rid, False, f"{type(e).__name__}: {e}"))


if __name__ == "__main__":
    main()
