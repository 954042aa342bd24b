"""Fresh host memory for large buffers: anonymous mappings advised to use transparent huge pages.

A 2 MiB page instead of 512 small ones means one page fault where there were 512 (a first touch
costs ~1.4 us per 4 KiB page on these VMs) and one TLB entry where there were 512, which matters
for kernels that stride through a large operand (a matmul's B, 8 KiB apart per step at n = 2048).
Linux only, and only where the kernel allows it (``/sys/kernel/mm/transparent_hugepage/enabled``
is ``always`` or ``madvise``); elsewhere, or below ``HUGE_MIN`` bytes, plain ``np.empty``.
"""
from __future__ import annotations

import functools
import mmap
import os
import sys

import numpy as np

HUGE_MIN = 4 << 20          # bytes: smaller buffers would waste most of a 2 MiB page (docs/lowering.md, Constants)
ALIGN = 64                  # bytes: every host buffer starts on a cache line (host_empty; docs/lowering.md, Constants)


def _thp_available() -> bool:
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


THP = _thp_available()


@functools.cache
def host_memory_bytes() -> int:
    """Physical memory plus swap, in bytes (Linux; elsewhere physical memory, or no bound): no host
    buffer larger than this can ever be backed, so one is refused before the allocator tries."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return sys.maxsize
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("SwapTotal:"):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return total


def host_empty(nbytes: int) -> np.ndarray:
    """An uninitialized flat uint8 array of ``nbytes``; from ``HUGE_MIN`` bytes on, a page-aligned
    anonymous mapping (the LLVM device's streaming stores rely on 64-byte alignment, llvm.py),
    huge-page backed where possible. The array keeps its mapping alive; the mapping is unmapped
    when the array is collected.

    Its pages are faulted in here (one byte written per page), not by the first kernel that writes
    it: the device times a kernel's first runs to choose between one thread and the split
    (devices/cpu.py ``launch``), and each of a new plan's first runs writes fresh buffers (the
    results of the runs before are still held). At ~1.4 us a page, a softmax over (32, 12, 15, 15)
    timed 256-304 us on one thread against 186-200 split, and ran split at 148 us where one thread
    runs it in 99; with the pages faulted here, one thread timed 121-165 us and was chosen."""
    a = _unmapped(nbytes)
    a[::mmap.PAGESIZE] = 0
    return a


def _aligned_empty(nbytes: int) -> np.ndarray:
    """``np.empty(nbytes, uint8)`` starting on a cache line (``ALIGN`` bytes). Made through a
    memoryview, so the array is the base of every view of it (a slice of ``raw`` would pass its
    views' references on to ``raw``, and the pool, which counts the references to the array it
    holds, would hand out memory a view still reads)."""
    raw = np.empty(nbytes + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return np.frombuffer(memoryview(raw)[skip:skip + nbytes], np.uint8)


def _unmapped(nbytes: int) -> np.ndarray:
    """``host_empty``'s array before its pages are touched."""
    if nbytes >= HUGE_MIN and hasattr(mmap, "MAP_ANONYMOUS"):
        try:
            m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, ValueError):
            return _aligned_empty(nbytes)
        if THP:
            try:
                m.madvise(mmap.MADV_HUGEPAGE)
            except OSError:
                pass
        return np.frombuffer(m, np.uint8)
    return _aligned_empty(nbytes)
