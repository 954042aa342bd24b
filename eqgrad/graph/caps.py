"""What a device lets the lowering do: one capabilities object per device, as data.

The lowering passes (lower/passes.py) read their thresholds from ``LowerOptions``, which a device
derives from its :class:`Capabilities` (``LowerOptions.for_caps``); the lowered-kernel cache is keyed
by them (devices/__init__.py ``lowered_kernel``), so a kernel lowered for one device is never handed to
another with other capabilities; the frontend asks the tensor's device for its lane widths instead of
importing the lowering's constants (nn/functional.py). On the graph floor because the lowering, the
devices and the frontend all read it and none of them may import another's floor sideways
(docs/layout.md).

The CPU values are the ones the passes were measured with (docs/lowering.md names each measurement):
register blocks of up to 16 lanes on the last output axis and 8 on the one before -- 8 x 16 float
accumulators, the 16 vector registers of AVX2 (on AVX-512 they are 8 of its 32) -- and they are the
same on every x86-64 CPU: a width is a choice of the lowering, not a fact of the host, so no test or
kernel depends on the host's vector width (the EQGRAD_CPU=x86-64-v2 test run lowers identically).
GPU devices (an OpenCL GPU, CUDA) get no CPU register blocks: a work-item keeps one output, and a
reduction's parallelism comes from its work-group (``reduce_group`` work-items), which the renderer
fills in. An OpenCL platform on a CPU (PoCL) keeps them: measured on PoCL, 2-core Xeon, matmul 512
2.2-3.6 ms with register blocks, 45-48 ms without (256: 0.7 vs 6.9-9.8 ms).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# the CPU lowering's register-block widths and thresholds (lower/passes.py reads them through
# LowerOptions; docs/lowering.md has the measurement behind each)
LANES_LAST = (16, 8, 4)       # lanes tried on the last output axis, first that divides wins
LANES_PREV = (8, 4, 2)        # lanes tried on the axis before it
LANE_BODY_MAX = 8192          # most body nodes x lanes (the unrolled block must stay compilable; docs/lowering.md, Constants)
TILE_BLOCKS = 8               # register blocks of the outer lane axis per cache tile (docs/lowering.md, Constants)
TILE_MIN_STREAM = 1 << 20     # bytes a block's reduce loop streams from the lane-axis operand (docs/lowering.md, Constants)


@dataclass(frozen=True)
class Capabilities:
    """A device's lowering capabilities (hashable: part of the lowered-kernel cache key).

    ``register_lanes``: the lanes and tiling passes may split output axes into register blocks of
    ``lanes_last`` x ``lanes_prev`` (a CPU, and an OpenCL platform that runs on one); False for a GPU,
    which maps outputs to work-items. ``reduce_group``: work-items that share one reduction (0: none),
    which the C-style renderers use. Equality (and so the cache key) covers the fields the lowering
    reads, not the names: two devices that lower alike share their lowered kernels."""
    device: str = field(compare=False)
    register_lanes: bool = True
    lanes_last: tuple[int, ...] = LANES_LAST
    lanes_prev: tuple[int, ...] = LANES_PREV
    lane_body_max: int = LANE_BODY_MAX
    tile_blocks: int = TILE_BLOCKS
    tile_min_stream: int = TILE_MIN_STREAM
    reduce_group: int = field(default=0, compare=False)

    def lane_room(self, n: int) -> int:
        """How well an axis of ``n`` elements fills this device's register lanes: the largest lane
        width dividing it (1: none, or a device without register lanes)."""
        if not self.register_lanes:
            return 1
        return next((w for w in self.lanes_last if n % w == 0), 1)


CPU = Capabilities("CPU")
