"""eqgrad in one page: lazy tensors -> e-graph -> saturation -> kernel plan -> LLVM on the CPU.

Run with `make demo` (or `python examples/demo.py`). Set DEBUG=4 to also see the LLVM IR.
"""
import time

import numpy as np

import eqgrad
from eqgrad import Tensor

rng = np.random.default_rng(0)
x_np = rng.standard_normal((512, 256)).astype(np.float32)
w_np = rng.standard_normal((256, 64)).astype(np.float32) * 0.1
b_np = rng.standard_normal((64,)).astype(np.float32)

x, w, b = Tensor(x_np), Tensor(w_np), Tensor(b_np)

# A small layer: linear -> gelu-ish (tanh) activation -> softmax. Nothing runs yet: it is a lazy graph.
h = (x @ w + b).tanh()
y = h.softmax(axis=-1)
print(y)

# realize(): the graph is inserted into an egglog e-graph, the rulebooks (movement, algebra, fusion)
# saturate it in a bounded worker process, the greedy extractor picks a kernel plan under the cost
# model, and each kernel is lowered to loops and compiled with LLVM. DEBUG=3 prints the saturation
# report and the chosen plan.
eqgrad.GlobalCounters.reset()
t0 = time.perf_counter()
with eqgrad.Context(DEBUG=3):
    out = y.numpy()
first = time.perf_counter() - t0

# NumPy reference
h_ref = np.tanh(x_np @ w_np + b_np)
e = np.exp(h_ref - h_ref.max(-1, keepdims=True))
ref = e / e.sum(-1, keepdims=True)
print(f"\nmax abs error vs NumPy: {np.abs(out - ref).max():.2e}")
print(f"kernels launched: {eqgrad.GlobalCounters.kernel_count}, first call (saturate + compile + run): {first*1e3:.0f} ms")

# The same program again: the plan is cached by graph structure, so only the kernels run.
times = []
for _ in range(5):
    t0 = time.perf_counter()
    ((x @ w + b).tanh().softmax(axis=-1)).realize()
    times.append(time.perf_counter() - t0)
print(f"cached realize: median {np.median(times)*1e3:.2f} ms")
assert np.allclose(out, ref, rtol=1e-4, atol=1e-5), "demo result differs from NumPy"
print("ok")
