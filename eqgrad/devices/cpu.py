"""The LLVM CPU device: plan -> loop IR per kernel -> LLVM IR -> machine code, run through ctypes."""
from __future__ import annotations

import time
from typing import Callable

from .. import config
from ..extract.plan import KernelPlan
from ..lower.lowering import lower_kernel
from . import Buffer, Device
from .llvm import LLVMProgram, render_llvm


class LLVMDevice(Device):
    name = "LLVM"

    def __init__(self) -> None:
        self.programs: dict[str, LLVMProgram] = {}      # compiled once per distinct source

    def program(self, src: str, lk) -> LLVMProgram:
        if src not in self.programs:
            self.programs[src] = LLVMProgram(lk, src)
        return self.programs[src]

    def prepare(self, plan: KernelPlan) -> Callable[[list[Buffer]], None]:
        steps = []
        for k in plan.kernels:
            lk = lower_kernel(k, plan)
            lk.name = "eqk"          # same body, same source: compiled once across plans
            src = render_llvm(lk)
            if config.DEBUG.value >= 5:
                print(f"--- loop IR {k.name}\n{lk}")
            if config.DEBUG.value >= 4:
                print(f"--- LLVM IR {k.name}\n{src}")
            steps.append((k, self.program(src, lk), (k.out, *k.inputs)))

        def run(bufs: list[Buffer]) -> None:
            from ..engine import GlobalCounters, log_kernel
            dbg = config.DEBUG.value
            for k, prg, ids in steps:
                t0 = time.perf_counter() if dbg >= 2 else 0.0
                prg(*[bufs[i].ptr for i in ids])
                GlobalCounters.kernel_count += 1
                if dbg >= 2:
                    log_kernel(k, time.perf_counter() - t0)
        return run
