"""Rule statistics over a corpus: representative programs (and the checkout's examples) realized
with a collector attached (``python -m eqgrad rules stats``); the counting lives in
``eqgrad.rules.stats``."""
from __future__ import annotations

import contextlib
import runpy
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from eqgrad.engine import realize
from eqgrad.frontend.tensor import Tensor
from eqgrad.rules.stats import RuleStats, collect


# ------------------------------------------------------------------ the corpus

def corpus() -> dict[str, Callable[[], object]]:
    """Representative programs: each returns the tensors to realize."""
    rng = np.random.default_rng(0)

    def t(*shape, dtype=np.float32):
        return Tensor((rng.standard_normal(shape) * 2).astype(dtype))

    x, w, b = t(16, 32), t(32, 8), t(8)
    q, k, v = t(2, 4, 8, 16), t(2, 4, 8, 16), t(2, 4, 8, 16)
    xi = Tensor(rng.integers(-9, 9, (6, 5)).astype(np.int32))

    def attention():
        s = (q @ k.transpose(-1, -2)) * (1 / 4)
        return s.softmax(-1) @ v

    def conv():     # a 3x3 convolution as pad + shifted slices + multiply-add
        img, ker = t(1, 8, 8), t(3, 3)
        p = img.pad(((0, 0), (1, 1), (1, 1)))
        return sum(p[:, i:i + 8, j:j + 8] * ker[i, j] for i in range(3) for j in range(3))

    return {
        "elementwise": lambda: ((x * 2 + 1).exp() - x.abs().sqrt()).relu(),
        "softmax": lambda: x.softmax(-1),
        "log_softmax": lambda: x.log_softmax(0),
        "layernorm": lambda: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True, correction=0) + 1e-5).sqrt(),
        "mlp": lambda: ((x @ w + b).relu() @ w.T).sum(),
        "attention": attention,
        "conv3x3": conv,
        "movement": lambda: x.reshape(4, 4, 32).permute(2, 0, 1).flip(0)[::2, 1:3].reshape(16, 2, 4).T + 1,
        "cat_stack": lambda: Tensor.stack([x, x * 2], 0).cat(x.unsqueeze(0), dim=0).sum(0),
        "argmax": lambda: x.argmax(1),
        "integers": lambda: ((xi * 3 + 1) // 2 % 5).maximum(xi),
        "where_clip": lambda: (x > 0).where(x.clip(-1, 1), x * 0.1),
        "reductions": lambda: x.amax(0) - x.amin(0) + x.std(0) * x.sum(0),
        "constants": lambda: x * 1.0 + 0.0 - 0.0 + (-(-x)) * Tensor.ones(16, 32),
    }


def run_corpus(include_examples: bool = True, progress: Callable[[str], None] | None = None,
               examples: Path | None = None) -> RuleStats:
    """Realize the corpus, then (``include_examples``) run every script of ``examples`` (default: the
    checkout's examples/), collecting rule statistics."""
    with collect() as st:
        for name, fn in corpus().items():
            out = fn()
            outs = out if isinstance(out, (list, tuple)) else [out]
            realize([o.lazydata for o in outs if isinstance(o, Tensor)])
            if progress:
                progress(name)
        if include_examples:
            ex_dir = examples or Path(__file__).resolve().parents[2] / "examples"   # a checkout's (not in the wheel)
            for ex in sorted(ex_dir.glob("*.py")) if ex_dir.is_dir() else []:
                # NOTE: each example runs as a script with its own argv (it used to see `rules stats`'s
                # arguments, and the first one that parses them stopped the whole command); one that
                # cannot run here (an optional extra missing) is skipped and says why
                argv = sys.argv
                sys.argv = [str(ex)]
                try:
                    with contextlib.redirect_stdout(None):
                        runpy.run_path(str(ex), run_name="__main__")
                except (Exception, SystemExit) as e:
                    st.skipped[ex.name] = f"{type(e).__name__}: {e}".strip()
                finally:
                    sys.argv = argv
                if progress:
                    progress(ex.name)
    return st
