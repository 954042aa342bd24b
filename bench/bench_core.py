#!/usr/bin/env python3
"""Core-op benchmark: eqgrad (LLVM and OpenCL) vs NumPy, PyTorch (eager, CPU) and tinygrad.

Workloads (full size / --quick size):
  elementwise  8-op chain log(exp((a*b + c)*0.5 - a) + |b|) on 16M (1M) float32
  softmax      softmax over the last axis of (4096,1024) ((256,1024)) float32
  layernorm    (x-mean)/sqrt(var+1e-5) over the last axis, same shapes, no affine, composed
  layernorm_affine  each framework's layer norm with weight and bias (1024,), same shapes
  transpose2048  x.T copied to a contiguous array, (2048,2048) ((512,512)) float32: a copy whose reads are 8 KB apart
  matmul64/128/256  square n x n @ n x n (n / 4) float32
  matmul512    512x512 @ 512x512 (128x128) float32
  matmul1024   1024x1024 @ 1024x1024 (256x256) float32
  matmul2048   2048x2048 @ 2048x2048 (512x512) float32
  conv2d       batch 32, 32 -> 64 channels, 32x32, 3x3, padding 1 (batch 2)
  linear480_t / linear512_t  x @ W.T, torch's Linear layout: x (480 | 512, 384), W (1536, 384) (rows / 16, W (96, 384))
  linear480 / linear512      x @ W with W (384, 1536) contiguous (same /16)
  matvec1536 / matvec49152   a decode step's x (1, 576) @ W.T, W (1536 | 49152, 576) (W rows / 16)
  attention_t15 / attention_t128  softmax(q @ k.transpose(-1, -2) / sqrt(32)) @ v with the transpose in the
               graph, batch 32, heads 12, seq 15 | 128, dim 32 (batch 2)
  attention    softmax(q @ k^T / 8) @ v, batch 8, heads 8, seq 256, dim 64 (2, 2, 64, 64)
  attention_t128_sdpa  attention_t128 again, with torch's fused scaled_dot_product_attention
  Training rows (eqgrad with @jit, torch eager; NumPy gives the reference loss, tinygrad is skipped):
  cnn_step     Adam step of conv 3->16 3x3 pad 1, relu, conv 16->32, relu, flatten, Linear(32768, 10),
               cross-entropy; batch 32, 32x32 images (batch 2)
  cnn_pool_step  the same with max_pool2d(2) after the first conv and global average pooling before
               Linear(32, 10)
  ffn_step     Adam step of a transformer FFN: x (480, 384) -> Linear 1536, gelu(tanh) -> Linear 384,
               mean squared error (30 rows)
  layernorm_backward  d/dx of sum(layer_norm(x, w, b) * g), x (4096, 1024) ((256, 1024)), w, b, g
  softmax_backward  d/dx of sum(softmax(x) * g), x and g (4096, 1024) ((256, 1024))
  attention_s1024 / attention_s1024_causal  softmax(q @ k.transpose(-1, -2) / 8 [+ causal mask]) @ v,
               batch 1, heads 4, seq 1024, dim 64 ((1, 2, 128, 64)); the mask an input of 0 and -inf
  attention_s1024_bounded / attention_s1024_causal_bounded  the same with eqgrad under EQGRAD_PEAK_MEMORY of
               the output's bytes (1 MB): one kernel that writes no score matrix (the others as above)
  attention_s1024_backward / attention_s1024_causal_backward  d/dq of sum(attention(q, k, v) * g),
               with the gradients of k and v computed in the same step
  attention_s1024_backward_bounded / attention_s1024_causal_backward_bounded  the same step with eqgrad
               under EQGRAD_PEAK_MEMORY of its three gradients' bytes and a value per query row for each
               of the softmax's three row statistics: six kernels that recompute the scores, no score matrix
  attention_s1024_q_backward_bounded / attention_s1024_causal_q_backward_bounded  d/dq alone (k and v
               constants), eqgrad under EQGRAD_PEAK_MEMORY of its bytes: one kernel, no score matrix
  matmul_chain / matmul_chain_right  (A @ B) @ x and A @ (B @ x), A and B (1024, 1024), x (1024, 1)
               ((256, 256), (256, 1)): the same product in the order written and in the cheap one
  Torch runs on every usable core ("torch") and on one thread ("torch[1 thread]"), and so does
  eqgrad on LLVM ("eqgrad[LLVM, 1 thread]": EQGRAD_THREADS=1 through eqgrad.Context).
  NumPy's and eqgrad's OpenBLAS pick their kernels for the CPU unless OPENBLAS_CORETYPE says
  otherwise; the header prints which set ran. To compare with the kernels chosen for this CPU:
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/bench_core.py

Per workload and framework it reports the median wall time over --reps timed
repetitions (after warm-up), the ratio to the first eqgrad column's median (to
NumPy's when eqgrad is unavailable), the first-call latency (includes compilation for the
lazy frameworks), kernels launched per run (eqgrad and tinygrad), eqgrad's plan as the cost
model sees it (bytes its kernels move, the largest buffer it writes, its predicted time) and
whether the result matches NumPy's.  Inputs are created and realized once, outside the
timed region; for lazy frameworks every repetition rebuilds the lazy graph from
those inputs and forces it.

  python bench/bench_core.py                 # full run, 10 reps
  python bench/bench_core.py --quick         # CI smoke run (sizes /16, 3 reps)
  python bench/bench_core.py --only softmax,matmul512 --json bench/results/core.json
  python bench/bench_core.py --eqgrad-devices LLVM,OPENCL --tinygrad-devices CL   # OpenCL side by side
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field, asdict
from importlib import metadata
from typing import Any, Callable

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# this checkout's eqgrad, where the script runs from one (a worktree of another commit measures that
# commit, not the editable install), else the installed one
if os.path.isfile(os.path.join(REPO_ROOT, "eqgrad", "__init__.py")) or importlib.util.find_spec("eqgrad") is None:
  sys.path.insert(1, REPO_ROOT)


class Skip(Exception):
  """A framework (or a framework/workload pair) cannot run here."""


# ---------------------------------------------------------------------------------------------------------------------
# Workloads: each is written once against a tiny op namespace `F` that every framework adapter provides.

def elementwise_chain(F, a, b, c):
  # 8 ops: *, +, *, -, exp, abs, +, log   (exp argument stays in [-2, 2], log argument > 0)
  return F.log(F.exp((a * b + c) * 0.5 - a) + F.abs(b))

def softmax(F, x): return F.softmax(x)

def layernorm(F, x):
  mean = F.mean(x)
  d = x - mean
  var = F.mean(d * d)                           # biased variance, as layernorm uses
  return d / F.sqrt(var + 1e-5)

def layernorm_affine(F, x, w, b): return F.layer_norm(x, w, b)

def transpose(F, x): return F.swap_copy(x)     # the transpose written out, as a layout change is

def matmul(F, a, b): return a @ b

def linear_t(F, x, w): return x @ w.T          # torch's Linear layout: W (out, in), read transposed

def attention_t(F, q, k, v):
  # k.transpose in the graph, as a model writes it (attention passes K already transposed)
  return F.softmax((q @ F.swap(k)) * (1.0 / np.sqrt(q.shape[-1]))) @ v

def conv2d(F, x, w): return F.conv2d(x, w)      # stride 1, padding 1

def attention(F, q, kt, v):
  # batch 8, heads 8, seq 256, dim 64; K is passed transposed so every framework needs only @
  return F.softmax((q @ kt) * 0.125) @ v

def attention_masked(F, q, k, v, m):
  # an additive mask (0 where a query may attend, -inf where it may not: causal), as models pass it
  return F.softmax((q @ F.swap(k)) * (1.0 / np.sqrt(q.shape[-1])) + m) @ v

def matmul_chain(F, a, b, x): return (a @ b) @ x

def matmul_chain_right(F, a, b, x): return a @ (b @ x)

def causal_mask(arrays: list[np.ndarray]) -> list[np.ndarray]:
  """The workload's inputs with the last one replaced by a causal mask over the queries' length."""
  s = arrays[0].shape[-2]
  return arrays[:-1] + [np.triu(np.full((s, s), -np.inf, np.float32), 1)]

def attention_sdpa(F, q, k, v):
  # torch: its fused attention; everyone else composes it as attention_t
  return F.sdpa(q, k, v) if hasattr(F, "sdpa") else attention_t(F, q, k, v)


# Training steps: every framework builds its model from the same NumPy arrays (the inputs) and
# steps Adam with a learning rate so small (1e-10: each weight moves ~1e-10 a step, the CNN's loss
# ~2e-6) that the loss after all the steps of a run is the first forward's to the check's
# tolerance, so NumPy's forward loss checks every framework; the work of a step is the same at any
# rate. The step is built once per framework (its first call includes building and compiling it).
TRAIN_LR = 1e-10

def _scaled(w: np.ndarray) -> np.ndarray:
  fan_in = int(np.prod(w.shape[1:])) if w.ndim > 1 else 1
  return (w / np.sqrt(fan_in)).astype(np.float32)

def _labels(y: np.ndarray) -> np.ndarray:
  return np.clip(((y + 1.0) * 5.0).astype(np.int64), 0, 9)

def _np_conv(x, w, b):
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))
  return np.tensordot(win, w, axes=((1, 4, 5), (1, 2, 3))).transpose(0, 3, 1, 2) + b.reshape(1, -1, 1, 1)

def _np_xent(logits, lab):
  z = logits - logits.max(-1, keepdims=True)
  return float((np.log(np.exp(z).sum(-1)) - z[np.arange(len(lab)), lab]).mean())

def _np_gelu(x): return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))

def numpy_train(kind: str, a: list[np.ndarray]) -> np.ndarray:
  """The loss of the first forward (the reference of a training row); layernorm_backward: d/dx."""
  a = [np.asarray(v, np.float64) for v in a]
  if kind in ("cnn_step", "cnn_pool_step"):
    x, y, w1, b1, w2, b2, fw, fb = a
    h = np.maximum(_np_conv(x, _scaled(w1), b1), 0)
    if kind == "cnn_pool_step":
      n, c, hh, ww = h.shape
      h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).max((3, 5))
    h = np.maximum(_np_conv(h, _scaled(w2), b2), 0)
    h = h.mean((2, 3)) if kind == "cnn_pool_step" else h.reshape(h.shape[0], -1)
    return np.asarray(_np_xent(h @ _scaled(fw).T + fb, _labels(y)))
  if kind == "ffn_step":
    x, y, w1, b1, w2, b2 = a
    h = _np_gelu(x @ _scaled(w1).T + b1)
    return np.asarray(float(((h @ _scaled(w2).T + b2 - y) ** 2).mean()))
  if kind == "softmax_backward":
    x, g = a
    p = np.exp(x - x.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    return p * (g - (g * p).sum(-1, keepdims=True))
  if kind.startswith("attention"):                 # d/dq of sum(softmax(q k^T / sqrt(d) + m) v * g)
    q, k, v, g = a[:4]
    sc = 1.0 / np.sqrt(q.shape[-1])
    z = q @ np.swapaxes(k, -1, -2) * sc + (a[4] if len(a) > 4 else 0.0)
    p = np.exp(z - z.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    dp = g @ np.swapaxes(v, -1, -2)
    return (p * (dp - (dp * p).sum(-1, keepdims=True))) @ k * sc
  x, w, b, g = a                                  # layernorm_backward
  m = x.mean(-1, keepdims=True); d = x - m; r = 1 / np.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)
  xh, gy = d * r, g * w
  return r * (gy - gy.mean(-1, keepdims=True) - xh * (gy * xh).mean(-1, keepdims=True))

def train_step(kind: str):
  def fn(F, *inputs):
    if F is NumpyFW: return numpy_train(kind, list(inputs))
    return F.train(kind, inputs)()
  fn.__name__ = kind
  return fn


@dataclass(frozen=True)
class Workload:
  name: str
  fn: Callable
  shapes: tuple[tuple[int, ...], ...]          # full-size input shapes
  quick_shapes: tuple[tuple[int, ...], ...]    # --quick input shapes (1/16 of the elements)
  matmul_tol: bool = False                     # atol scaled by the result's magnitude
  flops: Callable | None = None                # shapes -> FLOPs (compute-bound rows: efficiency vs peak FLOP/s)
  train: bool = False                          # a training row: NumPy is only its reference (not timed)
  fix: Callable | None = None                  # inputs -> inputs (a mask that is not random)
  # eqgrad under EQGRAD_PEAK_MEMORY of the output's bytes (its plan holds nothing else: attention
  # that writes no score matrix), or of bound(input shapes) where given; the other frameworks as in
  # the unbounded row
  bounded: bool = False
  bound: Callable | None = None
  # bandwidth-bound rows: efficiency = (input + output bytes) / time vs the measured DRAM bandwidth

def _mm_flops(s): return 2 * np.prod(s[0]) * s[1][-1]
def _conv_flops(s): return 2 * s[0][0] * s[1][0] * s[0][2] * s[0][3] * np.prod(s[1][1:])
def _attn_flops(s): return 2 * 2 * np.prod(s[0]) * s[1][-1]
def _lin_flops(s): return 2 * np.prod(s[0]) * s[1][0]
# attention's three gradients, and one value per query row for each of the softmax's statistics
# (the rows' max, sum and sum(p * dp)): a full backward's buffers without a score matrix
def _attn_grads_bytes(s): return 4 * (3 * np.prod(s[0]) + 3 * np.prod(s[0][:-1]))
def _attn_t_flops(s): return 2 * 2 * np.prod(s[0]) * s[1][-2]
def _chain_flops(s): return 2 * s[0][0] * s[0][1] * s[1][1] + 2 * s[0][0] * s[1][1] * s[2][1]   # (A @ B) @ x
def _chain_right_flops(s): return 2 * s[1][0] * s[1][1] * s[2][1] + 2 * s[0][0] * s[0][1] * s[2][1]   # A @ (B @ x)

N_EW = 16 * 1024 * 1024
WORKLOADS = [
  Workload("elementwise", elementwise_chain, ((N_EW,),) * 3, ((N_EW // 16,),) * 3),
  Workload("softmax", softmax, ((4096, 1024),), ((256, 1024),)),
  Workload("layernorm", layernorm, ((4096, 1024),), ((256, 1024),)),
  Workload("layernorm_affine", layernorm_affine, ((4096, 1024), (1024,), (1024,)), ((256, 1024), (1024,), (1024,))),
  Workload("transpose2048", transpose, ((2048, 2048),), ((512, 512),)),
  Workload("matmul64", matmul, ((64, 64),) * 2, ((16, 16),) * 2, matmul_tol=True, flops=_mm_flops),
  Workload("matmul128", matmul, ((128, 128),) * 2, ((32, 32),) * 2, matmul_tol=True, flops=_mm_flops),
  Workload("matmul256", matmul, ((256, 256),) * 2, ((64, 64),) * 2, matmul_tol=True, flops=_mm_flops),
  Workload("matmul512", matmul, ((512, 512),) * 2, ((128, 128),) * 2, matmul_tol=True, flops=_mm_flops),
  Workload("matmul1024", matmul, ((1024, 1024),) * 2, ((256, 256),) * 2, matmul_tol=True, flops=_mm_flops),
  Workload("matmul2048", matmul, ((2048, 2048),) * 2, ((512, 512),) * 2, matmul_tol=True, flops=_mm_flops),
  Workload("conv2d", conv2d, ((32, 32, 32, 32), (64, 32, 3, 3)), ((2, 32, 32, 32), (64, 32, 3, 3)), matmul_tol=True,
           flops=_conv_flops),
  Workload("linear480_t", linear_t, ((480, 384), (1536, 384)), ((30, 384), (96, 384)), matmul_tol=True,
           flops=_lin_flops),
  Workload("linear480", matmul, ((480, 384), (384, 1536)), ((30, 384), (384, 96)), matmul_tol=True, flops=_mm_flops),
  Workload("linear512_t", linear_t, ((512, 384), (1536, 384)), ((32, 384), (96, 384)), matmul_tol=True,
           flops=_lin_flops),
  Workload("linear512", matmul, ((512, 384), (384, 1536)), ((32, 384), (384, 96)), matmul_tol=True, flops=_mm_flops),
  Workload("matvec1536", linear_t, ((1, 576), (1536, 576)), ((1, 576), (96, 576)), matmul_tol=True, flops=_lin_flops),
  Workload("matvec49152", linear_t, ((1, 576), (49152, 576)), ((1, 576), (3072, 576)), matmul_tol=True,
           flops=_lin_flops),
  Workload("attention_t15", attention_t, ((32, 12, 15, 32),) * 3, ((2, 12, 15, 32),) * 3, matmul_tol=True,
           flops=_attn_t_flops),
  Workload("attention_t128", attention_t, ((32, 12, 128, 32),) * 3, ((2, 12, 128, 32),) * 3, matmul_tol=True,
           flops=_attn_t_flops),
  Workload("attention", attention, ((8, 8, 256, 64), (8, 8, 64, 256), (8, 8, 256, 64)),
           ((2, 2, 64, 64), (2, 2, 64, 64), (2, 2, 64, 64)), matmul_tol=True, flops=_attn_flops),
  Workload("attention_t128_sdpa", attention_sdpa, ((32, 12, 128, 32),) * 3, ((2, 12, 128, 32),) * 3, matmul_tol=True,
           flops=_attn_t_flops),
  Workload("cnn_step", train_step("cnn_step"),
           ((32, 3, 32, 32), (32,), (16, 3, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 32 * 32 * 32), (10,)),
           ((2, 3, 32, 32), (2,), (16, 3, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 32 * 32 * 32), (10,)), train=True),
  Workload("cnn_pool_step", train_step("cnn_pool_step"),
           ((32, 3, 32, 32), (32,), (16, 3, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 32), (10,)),
           ((2, 3, 32, 32), (2,), (16, 3, 3, 3), (16,), (32, 16, 3, 3), (32,), (10, 32), (10,)), train=True),
  Workload("ffn_step", train_step("ffn_step"), ((480, 384), (480, 384), (1536, 384), (1536,), (384, 1536), (384,)),
           ((30, 384), (30, 384), (1536, 384), (1536,), (384, 1536), (384,)), train=True),
  Workload("layernorm_backward", train_step("layernorm_backward"), ((4096, 1024), (1024,), (1024,), (4096, 1024)),
           ((256, 1024), (1024,), (1024,), (256, 1024)), train=True),
  Workload("softmax_backward", train_step("softmax_backward"), ((4096, 1024),) * 2, ((256, 1024),) * 2, train=True),
  Workload("attention_s1024", attention_t, ((1, 4, 1024, 64),) * 3, ((1, 2, 128, 64),) * 3, matmul_tol=True,
           flops=_attn_t_flops),
  Workload("attention_s1024_causal", attention_masked, ((1, 4, 1024, 64),) * 3 + ((1024, 1024),),
           ((1, 2, 128, 64),) * 3 + ((128, 128),), matmul_tol=True, flops=_attn_t_flops, fix=causal_mask),
  Workload("attention_s1024_bounded", attention_t, ((1, 4, 1024, 64),) * 3, ((1, 2, 128, 64),) * 3, matmul_tol=True,
           flops=_attn_t_flops, bounded=True),
  Workload("attention_s1024_causal_bounded", attention_masked, ((1, 4, 1024, 64),) * 3 + ((1024, 1024),),
           ((1, 2, 128, 64),) * 3 + ((128, 128),), matmul_tol=True, flops=_attn_t_flops, fix=causal_mask, bounded=True),
  Workload("attention_s1024_backward", train_step("attention_backward"), ((1, 4, 1024, 64),) * 4,
           ((1, 2, 128, 64),) * 4, matmul_tol=True, train=True),
  Workload("attention_s1024_causal_backward", train_step("attention_causal_backward"),
           ((1, 4, 1024, 64),) * 4 + ((1024, 1024),), ((1, 2, 128, 64),) * 4 + ((128, 128),), matmul_tol=True,
           train=True, fix=causal_mask),
  Workload("attention_s1024_backward_bounded", train_step("attention_backward"), ((1, 4, 1024, 64),) * 4,
           ((1, 2, 128, 64),) * 4, matmul_tol=True, train=True, bounded=True, bound=_attn_grads_bytes),
  Workload("attention_s1024_causal_backward_bounded", train_step("attention_causal_backward"),
           ((1, 4, 1024, 64),) * 4 + ((1024, 1024),), ((1, 2, 128, 64),) * 4 + ((128, 128),), matmul_tol=True,
           train=True, fix=causal_mask, bounded=True, bound=_attn_grads_bytes),
  Workload("attention_s1024_q_backward_bounded", train_step("attention_q_backward"), ((1, 4, 1024, 64),) * 4,
           ((1, 2, 128, 64),) * 4, matmul_tol=True, train=True, bounded=True),
  Workload("attention_s1024_causal_q_backward_bounded", train_step("attention_causal_q_backward"),
           ((1, 4, 1024, 64),) * 4 + ((1024, 1024),), ((1, 2, 128, 64),) * 4 + ((128, 128),), matmul_tol=True,
           train=True, fix=causal_mask, bounded=True),
  Workload("matmul_chain", matmul_chain, ((1024, 1024), (1024, 1024), (1024, 1)), ((256, 256), (256, 256), (256, 1)),
           matmul_tol=True, flops=_chain_flops),
  Workload("matmul_chain_right", matmul_chain_right, ((1024, 1024), (1024, 1024), (1024, 1)),
           ((256, 256), (256, 256), (256, 1)), matmul_tol=True, flops=_chain_right_flops),
]


def make_inputs(w: Workload, quick: bool, seed: int = 0) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  arrays = [rng.uniform(-1.0, 1.0, size=s).astype(np.float32) for s in (w.quick_shapes if quick else w.shapes)]
  return w.fix(arrays) if w.fix else arrays


# ---------------------------------------------------------------------------------------------------------------------
# Framework adapters.  Each provides the op namespace used by the workloads plus:
#   setup()            import / initialise, raise Skip(reason) if unavailable
#   info()             dict of environment info for the header
#   to_input(arr)      realized framework tensor from a numpy array (untimed)
#   force(out)         force the computation of `out` (timed)
#   to_numpy(out)      result as ndarray (untimed, for verification)
#   kernel_count()     running kernel counter, or None

class Framework:
  name = "?"
  def setup(self): pass
  def info(self) -> dict: return {}
  def to_input(self, arr): return arr
  def force(self, out): return out
  def to_numpy(self, out) -> np.ndarray: return np.asarray(out)
  def kernel_count(self) -> int | None: return None
  def plan_stats(self) -> tuple | None: return None   # (bytes moved, largest buffer written, predicted s)
  def enter(self): pass              # before its workload (torch: its thread count)
  def context(self): return contextlib.nullcontext()   # around each timed call (eqgrad: its thread count)
  def bound(self, w, inputs): return contextlib.nullcontext()   # a bounded row's memory bound (eqgrad)


class NumpyFW(Framework):
  name = "numpy"
  exp, log, abs, sqrt = staticmethod(np.exp), staticmethod(np.log), staticmethod(np.abs), staticmethod(np.sqrt)
  @staticmethod
  def mean(x): return x.mean(axis=-1, keepdims=True)
  @staticmethod
  def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)
  @staticmethod
  def layer_norm(x, w, b):
    m = x.mean(axis=-1, keepdims=True)
    d = x - m
    return d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + 1e-5) * w + b
  @staticmethod
  def swap(x): return np.swapaxes(x, -1, -2)
  @staticmethod
  def swap_copy(x): return np.ascontiguousarray(np.swapaxes(x, -1, -2))
  @staticmethod
  def conv2d(x, w):         # im2col by a strided view, then one BLAS contraction
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    win = np.lib.stride_tricks.sliding_window_view(xp, w.shape[2:], axis=(2, 3))   # (n, c, h, w, kh, kw)
    return np.tensordot(win, w, axes=((1, 4, 5), (1, 2, 3))).transpose(0, 3, 1, 2)
  def info(self):
    blas = {}
    try: blas = np.__config__.CONFIG["Build Dependencies"]["blas"]
    except Exception: pass
    kernels = "?"
    try:                  # which kernel set OpenBLAS chose for this CPU (OPENBLAS_CORETYPE overrides it)
      import threadpoolctl
      kernels = ",".join(i.get("architecture") or "?" for i in threadpoolctl.threadpool_info()
                         if i.get("internal_api") == "openblas") or "?"
    except Exception: pass
    return {"version": np.__version__, "blas": f"{blas.get('name', '?')} {blas.get('version', '')}".strip(),
            "openblas_kernels": kernels, "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
            "OPENBLAS_L2_SIZE": os.environ.get("OPENBLAS_L2_SIZE", "(unset)")}


class TorchFW(Framework):
  def __init__(self, threads: int = 0):
    self.threads, self.name = threads, "torch" if not threads else f"torch[{threads} thread{'s' * (threads > 1)}]"
  def setup(self):
    try: import torch
    except Exception as e: raise Skip(f"torch not importable: {e}")
    self.torch = torch
    self.all_threads = torch.get_num_threads()
    self.exp, self.log, self.abs, self.sqrt = torch.exp, torch.log, torch.abs, torch.sqrt
    self._steps = {}
  def enter(self): self.torch.set_num_threads(self.threads or self.all_threads)
  def sdpa(self, q, k, v): return self.torch.nn.functional.scaled_dot_product_attention(q, k, v)
  def train(self, kind, inputs):
    if kind not in self._steps: self._steps[kind] = self._build(kind, [t.numpy() for t in inputs])
    return self._steps[kind]
  def _build(self, kind, a):
    torch, nnf = self.torch, self.torch.nn.functional
    T = lambda v: torch.tensor(v, requires_grad=True)
    if kind == "layernorm_backward":
      x, w, b, g = T(a[0]), torch.tensor(a[1]), torch.tensor(a[2]), torch.tensor(a[3])
      def step():
        x.grad = None
        (nnf.layer_norm(x, x.shape[-1:], w, b) * g).sum().backward()
        return x.grad
      return step
    if kind == "softmax_backward":
      x, g = T(a[0]), torch.tensor(a[1])
      def step():
        x.grad = None
        (torch.softmax(x, dim=-1) * g).sum().backward()
        return x.grad
      return step
    if kind.startswith("attention"):
      q_only = "_q_" in kind                     # d/dq alone: k and v are constants
      q, g = T(a[0]), torch.tensor(a[3])
      k, v = (torch.tensor(x) for x in a[1:3]) if q_only else (T(a[1]), T(a[2]))
      m = torch.tensor(a[4]) if len(a) > 4 else 0.0
      def step():
        q.grad = k.grad = v.grad = None
        (torch.softmax(q @ k.transpose(-1, -2) * (1.0 / np.sqrt(q.shape[-1])) + m, dim=-1) @ v * g).sum().backward()
        return q.grad
      return step
    if kind == "ffn_step":
      x, y = torch.tensor(a[0]), torch.tensor(a[1])
      ps = [T(_scaled(a[2])), T(a[3]), T(_scaled(a[4])), T(a[5])]
      def loss(): return (nnf.linear(nnf.gelu(nnf.linear(x, ps[0], ps[1]), approximate="tanh"), ps[2], ps[3]) - y).square().mean()
    else:
      x, lab = torch.tensor(a[0]), torch.tensor(_labels(a[1]))
      ps = [T(_scaled(a[2])), T(a[3]), T(_scaled(a[4])), T(a[5]), T(_scaled(a[6])), T(a[7])]
      pool = kind == "cnn_pool_step"
      def loss():
        h = torch.relu(nnf.conv2d(x, ps[0], ps[1], padding=1))
        if pool: h = nnf.max_pool2d(h, 2)
        h = torch.relu(nnf.conv2d(h, ps[2], ps[3], padding=1))
        h = h.mean((2, 3)) if pool else h.flatten(1)
        return nnf.cross_entropy(nnf.linear(h, ps[4], ps[5]), lab)
    opt = torch.optim.Adam(ps, lr=TRAIN_LR)
    def step():
      opt.zero_grad()
      out = loss(); out.backward(); opt.step()
      return out.detach()
    return step
  def mean(self, x): return x.mean(dim=-1, keepdim=True)
  def softmax(self, x): return self.torch.softmax(x, dim=-1)
  def layer_norm(self, x, w, b): return self.torch.nn.functional.layer_norm(x, x.shape[-1:], w, b)
  def conv2d(self, x, w): return self.torch.nn.functional.conv2d(x, w, padding=1)
  def swap(self, x): return x.transpose(-1, -2)
  def swap_copy(self, x): return x.transpose(-1, -2).contiguous()
  def info(self): return {"version": self.torch.__version__, "threads": self.threads or self.all_threads}
  def to_input(self, arr): return self.torch.from_numpy(arr)
  def to_numpy(self, out): return out.numpy()


class LazyTensorFW(Framework):
  """Shared op namespace for the method-style lazy frameworks (eqgrad, tinygrad)."""
  @staticmethod
  def exp(x): return x.exp()
  @staticmethod
  def log(x): return x.log()
  @staticmethod
  def abs(x): return x.abs()
  @staticmethod
  def sqrt(x): return x.sqrt()
  @staticmethod
  def mean(x): return x.mean(axis=-1, keepdim=True)
  @staticmethod
  def softmax(x):
    if hasattr(x, "softmax"): return x.softmax(axis=-1)
    e = (x - x.max(axis=-1, keepdim=True)).exp()
    return e / e.sum(axis=-1, keepdim=True)
  @staticmethod
  def conv2d(x, w): return x.conv2d(w, padding=1)
  @staticmethod
  def swap(x): return x.transpose(-1, -2)
  @staticmethod
  def swap_copy(x): return x.transpose(-1, -2).contiguous()
  def to_numpy(self, out): return out.numpy()


class TinygradFW(LazyTensorFW):
  def __init__(self, device: str):
    self.device, self.name = device, f"tinygrad[{device}]"
  def setup(self):
    # tinygrad 0.14.0 selects its default device with DEV=<name> (CPU=1 / CL=1 raise "deprecated" assertions); we
    # instead pass device= explicitly, which lets CPU and CL run side by side in one process.  Its CPU device
    # compiles C with $CC (default "clang"); Debian's PoCL package only brings clang-15, so fall back to that.
    # This must happen before tinygrad reads CC (its getenv is cached).
    if "CC" not in os.environ and not shutil.which("clang") and shutil.which("clang-15"):
      os.environ["CC"] = "clang-15"
    try:
      from tinygrad import Tensor, Device
      from tinygrad.helpers import GlobalCounters
    except Exception as e: raise Skip(f"tinygrad not importable: {e}")
    self.Tensor, self.Device, self.GC = Tensor, Device, GlobalCounters
    try:
      dev = Device[self.device]
      (Tensor([1.0, 2.0], device=self.device) * 2).realize().numpy()   # compile + run something tiny
      dev.synchronize()
    except Exception as e: raise Skip(f"tinygrad device {self.device} unusable: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
    self.dev = dev
  def info(self):
    d = {"version": metadata.version("tinygrad"), "device": self.device,
         "renderer": type(getattr(self.dev, "renderer", None)).__name__}
    if self.device.startswith("CPU"): d["CC"] = os.environ.get("CC", "clang")
    if hasattr(self.dev, "device_name"): d["cl_device"] = f"{self.dev.device_name} ({getattr(self.dev, 'driver_version', '?')})"
    return d
  @staticmethod
  def layer_norm(x, w, b): return x.layernorm(axis=-1, eps=1e-5) * w + b
  def train(self, kind, inputs): raise Skip("training rows are written for eqgrad and torch")
  def to_input(self, arr): return self.Tensor(arr, device=self.device).realize()
  def force(self, out):
    out.realize()
    self.dev.synchronize()
    return out
  def kernel_count(self): return self.GC.kernel_count


class EqgradFW(LazyTensorFW):
  def __init__(self, device: str, threads: int = 0):
    self.device, self.threads = device, threads
    self.name = f"eqgrad[{device}]" if not threads else f"eqgrad[{device}, {threads} thread{'s' * (threads > 1)}]"
  def context(self):
    return self.eqgrad.Context(THREADS=self.threads) if self.threads else contextlib.nullcontext()
  def bound(self, w, inputs):
    if not w.bounded: return contextlib.nullcontext()
    # a training row's output is the gradient of its first input; calling its step here ran it,
    # unbounded, inside the timed call's kernel count (a bounded d/dq showed 5 kernels, 4 + 1)
    if w.bound is not None:
      return self.eqgrad.Context(PEAK_MEMORY=int(w.bound([a.shape for a in inputs])))
    shape = inputs[0].shape if w.train else w.fn(self, *inputs).shape   # (lazy: only its shape is read)
    return self.eqgrad.Context(PEAK_MEMORY=int(np.prod(shape)) * 4)
  def setup(self):
    try:
      import eqgrad
      self.Tensor = eqgrad.Tensor
    except Exception as e: raise Skip(f"eqgrad not usable: {type(e).__name__}: {e}")
    try: self.dev = eqgrad.devices.get_device(self.device)   # realize() returns once the kernels are done
    except eqgrad.DeviceError as e: raise Skip(f"eqgrad device {self.device} unusable: {str(e)[:160]}")
    self.eqgrad = eqgrad
    gc_ = getattr(eqgrad, "GlobalCounters", None)
    self.counters = gc_ if isinstance(getattr(gc_, "kernel_count", None), int) else None
    self.has_realize = hasattr(self.Tensor, "realize")
  def layer_norm(self, x, w, b): return self.eqgrad.nn.functional.layer_norm(x, x.shape[-1:], w, b)
  def conv2d(self, x, w): return self.eqgrad.nn.functional.conv2d(x, w, padding=1)
  def plan_stats(self):
    cp = self.eqgrad.engine.last_plan           # the plan of the last timed run (a @jit step's too)
    if cp is None: return None
    p = cp.plan
    largest = max((int(np.prod(sh)) * dt.itemsize for sh, dt in p.buffers[p.n_inputs:]), default=0)
    return sum(k.nbytes for k in p.kernels), largest, p.predicted
  def train(self, kind, inputs):
    steps = self.__dict__.setdefault("_steps", {})
    if kind not in steps: steps[kind] = self._build(kind, [t.numpy() for t in inputs])
    return steps[kind]
  def _build(self, kind, a):
    eqgrad, T = self.eqgrad, self.Tensor
    F, optim = eqgrad.nn.functional, eqgrad.optim
    P = lambda v: T(v, requires_grad=True, device=self.device)
    if kind == "layernorm_backward":
      x, w, b, g = P(a[0]), T(a[1], device=self.device), T(a[2], device=self.device), T(a[3], device=self.device)
      def step():
        x.grad = None
        (F.layer_norm(x, x.shape[-1:], w, b) * g).sum().backward()
        return x.grad
      return step
    if kind == "softmax_backward":
      x, g = P(a[0]), T(a[1], device=self.device)
      def step():
        x.grad = None
        (x.softmax(-1) * g).sum().backward()
        return x.grad
      return step
    if kind.startswith("attention"):
      q_only = "_q_" in kind                     # d/dq alone: k and v are constants
      q, g = P(a[0]), T(a[3], device=self.device)
      k, v = (T(x, device=self.device) for x in a[1:3]) if q_only else (P(a[1]), P(a[2]))
      m = T(a[4], device=self.device) if len(a) > 4 else 0.0
      def step():
        q.grad = k.grad = v.grad = None
        ((q @ k.transpose(-1, -2) * (1.0 / np.sqrt(q.shape[-1])) + m).softmax(-1) @ v * g).sum().backward()
        eqgrad.realize(*(x.grad for x in ((q,) if q_only else (q, k, v))))   # a training step computes all three
        return q.grad
      return step
    if kind == "ffn_step":
      X, Y = T(a[0], device=self.device), T(a[1], device=self.device)
      ps = [P(_scaled(a[2])), P(a[3]), P(_scaled(a[4])), P(a[5])]
      def loss(X, Y): return (F.linear(F.linear(X, ps[0], ps[1]).gelu("tanh"), ps[2], ps[3]) - Y).square().mean()
    else:
      X, Y = T(a[0], device=self.device), T(_labels(a[1]).astype(np.int32), device=self.device)
      ps = [P(_scaled(a[2])), P(a[3]), P(_scaled(a[4])), P(a[5]), P(_scaled(a[6])), P(a[7])]
      pool = kind == "cnn_pool_step"
      def loss(X, Y):
        h = F.conv2d(X, ps[0], ps[1], padding=1).relu()
        if pool: h = F.max_pool2d(h, 2)
        h = F.conv2d(h, ps[2], ps[3], padding=1).relu()
        h = h.mean((2, 3)) if pool else h.flatten(1)
        return F.cross_entropy(F.linear(h, ps[4], ps[5]), Y)
    opt = optim.Adam(ps, lr=TRAIN_LR)
    @eqgrad.jit
    def jitted(X, Y):
      opt.zero_grad()
      out = loss(X, Y); out.backward(); opt.step(out)
      return out
    return lambda: jitted(X, Y)
  def info(self):
    d = {"version": getattr(self.eqgrad, "__version__", "dev"), "path": os.path.dirname(self.eqgrad.__file__),
         "kernel_count": "yes" if self.counters else "unavailable", "force": "realize()" if self.has_realize else "numpy()"}
    d["device"] = repr(self.dev)
    if self.threads: d["threads"] = self.threads
    if self.device == "LLVM":
      try:
        from eqgrad.devices import blas
        d["blas_kernels"] = blas.blas().corename()
      except Exception as e: d["blas_kernels"] = f"unavailable ({type(e).__name__})"
    return d
  def to_input(self, arr):
    t = self.Tensor(arr, device=self.device)
    if self.has_realize: t.realize()
    return t
  def force(self, out):
    if self.has_realize: out.realize()
    else: out.numpy()
    return out
  def kernel_count(self): return self.counters.kernel_count if self.counters else None


# ---------------------------------------------------------------------------------------------------------------------
# Measurement

@dataclass
class Result:
  workload: str
  framework: str
  status: str = "ok"             # ok | mismatch | skipped | error
  note: str = ""
  median_s: float | None = None
  mad_s: float | None = None     # median absolute deviation, a noise indicator
  times_s: list[float] = field(default_factory=list)
  first_call_s: float | None = None
  kernels_per_run: int | None = None
  max_abs_err: float | None = None
  ratio_vs_baseline: float | None = None
  rate: str = ""                 # GB/s (bandwidth-bound rows) or GFLOP/s (compute-bound rows)
  efficiency: float | None = None   # rate / the machine's measured peak bandwidth or FLOP/s
  # eqgrad: its plan as the cost model sees it (bytes its kernels move, the largest buffer it
  # writes, the predicted seconds), next to the measured time
  plan_bytes: int | None = None
  plan_largest: int | None = None
  predicted_s: float | None = None


def timed(fw: Framework, w: Workload, inputs) -> tuple[float, Any]:
  with fw.context(), fw.bound(w, inputs):
    t0 = time.perf_counter()
    out = fw.force(w.fn(fw, *inputs))
    return time.perf_counter() - t0, out


def measure_peaks(reps: int = 5) -> dict:
  """The machine's float32 matmul FLOP/s and DRAM bandwidth, measured with the fastest library here (PyTorch's
  multithreaded matmul and copy; NumPy when torch is missing), best of `reps`: the denominators of 'efficiency'."""
  best = lambda f: min(timeit_once(f) for _ in range(reps))
  n, m = 2048, 64 * 1024 * 1024
  try:
    import torch
    a, b, x, y = torch.rand(n, n), torch.rand(n, n), torch.empty(m), torch.empty(m)
    x.fill_(1.0); y.fill_(2.0)
    mm, cp, src = (lambda: torch.mm(a, b)), (lambda: y.copy_(x)), "torch"
  except Exception:
    a, b, x, y = np.ones((n, n), np.float32), np.ones((n, n), np.float32), np.ones(m, np.float32), np.zeros(m, np.float32)
    mm, cp, src = (lambda: a @ b), (lambda: np.copyto(y, x)), "numpy"
  mm(); cp()
  return {"gflops": 2 * n ** 3 / best(mm) / 1e9, "gbs": 2 * 4 * m / best(cp) / 1e9, "source": src}

def timeit_once(f) -> float:
  t0 = time.perf_counter(); f(); return time.perf_counter() - t0

IDLE_S = 0.3       # seconds of idle before each framework's workload (bench_one; --idle)


def bench_one(fw: Framework, w: Workload, arrays: list[np.ndarray], ref: np.ndarray, reps: int, warmup: int,
              idle: float = IDLE_S, collect: bool = True) -> Result:
  r = Result(w.name, fw.name)
  if w.train and isinstance(fw, NumpyFW): raise Skip("the reference (forward loss) of a training row")
  fw.enter()
  inputs = [fw.to_input(a) for a in arrays]
  # the previous framework's BLAS threads (NumPy's and SciPy's OpenBLAS, torch's pool) spin for
  # ~0.1 s after their last call and take cores from this one's first calls
  time.sleep(idle)
  r.first_call_s, out = timed(fw, w, inputs)
  for _ in range(warmup): out = None; timed(fw, w, inputs)
  if collect: gc.collect()
  gc.disable()
  try:
    kernels = set()
    for _ in range(reps):
      out = None
      k0 = fw.kernel_count()
      dt, out = timed(fw, w, inputs)
      if k0 is not None: kernels.add(fw.kernel_count() - k0)
      r.times_s.append(dt)
  finally:
    gc.enable()
  r.median_s = statistics.median(r.times_s)
  r.mad_s = statistics.median(abs(t - r.median_s) for t in r.times_s)
  stats = fw.plan_stats()
  if stats is not None: r.plan_bytes, r.plan_largest, r.predicted_s = stats
  if kernels:
    r.kernels_per_run = max(kernels)
    if len(kernels) > 1: r.note = f"kernels per run varied: {sorted(kernels)}"
  got = np.asarray(fw.to_numpy(out), dtype=np.float32)
  atol = 1e-4 * max(1.0, float(np.abs(ref).max())) if w.matmul_tol else 1e-4
  if got.shape != ref.shape:
    r.status, r.note = "mismatch", f"shape {got.shape} != {ref.shape}"
  else:
    r.max_abs_err = float(np.nanmax(np.abs(got.astype(np.float64) - ref))) if got.size else 0.0
    if not np.allclose(got, ref, rtol=1e-3, atol=atol): r.status = "mismatch"
  return r


# ---------------------------------------------------------------------------------------------------------------------
# Reporting

def fmt_time(s: float | None) -> str:
  if s is None: return "-"
  return f"{s * 1e3:.3f} ms" if s < 0.01 else f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"

def fmt_ratio(r: float | None, is_baseline: bool) -> str:
  if is_baseline: return "baseline"
  if r is None: return "-"
  return f"{r:.2f}x slower" if r >= 1 else f"{1 / r:.2f}x faster"

def progress(msg: str):
  if sys.stderr.isatty(): print(f"\r  {msg:<50}", end="" if msg else "\r", file=sys.stderr, flush=True)

def cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"): return line.split(":", 1)[1].strip()
  except OSError: pass
  return platform.processor() or platform.machine()

def print_env(fws: list[Framework], skipped: dict[str, str], args) -> dict:
  ncpu = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  env = {"cpu": cpu_model(), "cores": ncpu, "python": platform.python_version(), "platform": platform.platform(),
         "reps": args.reps, "warmup": args.warmup, "quick": args.quick, "frameworks": {}}
  print(f"CPU: {env['cpu']}  ({ncpu} cores usable, os.cpu_count={os.cpu_count()})")
  print(f"Python {env['python']} on {env['platform']}")
  for fw in fws:
    try: info = fw.info()
    except Exception as e: info = {"info_error": repr(e)}
    env["frameworks"][fw.name] = info
    print(f"  {fw.name:<15} " + ", ".join(f"{k}={v}" for k, v in info.items()))
  for name, why in skipped.items():
    env["frameworks"][name] = {"skipped": why}
    print(f"  {name:<15} SKIPPED: {why}")
  print(f"reps={args.reps} (median reported), warmup={args.warmup}, sizes={'quick (1/16)' if args.quick else 'full'}")
  return env

def print_table(results: list[Result], baseline: str):
  head = ["workload", "framework", "median", "±MAD", f"vs {baseline}", "rate", "of peak", "kernels", "plan: moved, largest, predicted",
          "1st call", "check"]
  rows = []
  for r in results:
    if r.status in ("skipped", "error"):
      rows.append([r.workload, r.framework, r.status.upper(), "", "", "", "", "", "", "", r.note[:60]]); continue
    mad = f"{100 * r.mad_s / r.median_s:.0f}%" if r.median_s else "-"
    check = "ok" if r.status == "ok" else f"MISMATCH (max err {r.max_abs_err:.3g})" if r.max_abs_err is not None else f"MISMATCH {r.note}"
    if r.status == "ok" and r.note: check += f" ({r.note})"
    rows.append([r.workload, r.framework, fmt_time(r.median_s), mad, fmt_ratio(r.ratio_vs_baseline, r.framework == baseline),
                 r.rate, "-" if r.efficiency is None else f"{100 * r.efficiency:.0f}%",
                 "-" if r.kernels_per_run is None else str(r.kernels_per_run),
                 "-" if r.predicted_s is None else f"{r.plan_bytes / 1e6:.1f} MB, {r.plan_largest / 1e6:.1f} MB, {fmt_time(r.predicted_s)}",
                 fmt_time(r.first_call_s), check])
  widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
  line = lambda cells: "  ".join(str(c).ljust(wd) if i < 2 or i == len(cells) - 1 else str(c).rjust(wd)
                                 for i, (c, wd) in enumerate(zip(cells, widths))).rstrip()
  print()
  print(line(head))
  print(line(["-" * wd for wd in widths]))
  prev = None
  for row in rows:
    if prev is not None and row[0] != prev: print()
    print(line(row if row[0] != prev else [""] + row[1:]))
    prev = row[0]


# ---------------------------------------------------------------------------------------------------------------------

def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--reps", type=int, default=None, help="timed repetitions per case (default 10, 3 with --quick)")
  p.add_argument("--warmup", type=int, default=None, help="untimed repetitions after the first call (default 2, 1 with --quick)")
  p.add_argument("--quick", action="store_true", help="1/16 of the elements and 3 reps (CI smoke run)")
  p.add_argument("--idle", type=float, default=IDLE_S, metavar="S",
                 help=f"seconds of idle before each framework's workload, for the previous one's BLAS threads "
                      f"to stop spinning (default {IDLE_S}; 0 in a smoke run whose times are not read)")
  p.add_argument("--no-gc", action="store_true",
                 help="no full garbage collection before each framework's timed runs and after each workload (they "
                      "keep a collection out of the timings; a smoke run whose times are not read skips them: in a "
                      "test worker's large heap each took ~90 ms)")
  p.add_argument("--only", default=None, help="comma-separated workloads: " + ",".join(w.name for w in WORKLOADS))
  p.add_argument("--frameworks", default="eqgrad,numpy,torch,tinygrad",
                 help="comma-separated subset of eqgrad,numpy,torch,tinygrad (default: all)")
  p.add_argument("--tinygrad-devices", default="CPU,CL", help="tinygrad devices, one column each (default CPU,CL)")
  p.add_argument("--eqgrad-devices", default="LLVM,OPENCL",
                 help="eqgrad devices, one column each (default LLVM,OPENCL); the first is the baseline")
  p.add_argument("--no-eqgrad", action="store_true", help="skip the eqgrad column")
  p.add_argument("--no-one-thread", action="store_true", help="skip the eqgrad[LLVM, 1 thread] column")
  p.add_argument("--json", default=None, metavar="PATH", help="write environment and results as JSON")
  p.add_argument("--peak-gflops", type=float, default=None, help="the machine's peak FLOP/s for 'of peak' (default: measured)")
  p.add_argument("--peak-gbs", type=float, default=None, help="the machine's DRAM bandwidth for 'of peak' (default: measured)")
  args = p.parse_args(argv)
  args.reps = args.reps if args.reps is not None else (3 if args.quick else 10)
  args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
  if args.reps < 1: p.error("--reps must be >= 1")
  if args.idle < 0: p.error(f"--idle must be >= 0 seconds, not {args.idle}")

  workloads = WORKLOADS
  if args.only:
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in {w.name for w in WORKLOADS}]
    if unknown: p.error(f"unknown workload(s) {unknown}; choose from {[w.name for w in WORKLOADS]}")
    workloads = [w for w in WORKLOADS if w.name in wanted]

  names = [s.strip() for s in args.frameworks.split(",") if s.strip()]
  candidates: list[Framework] = []
  for n in names:
    if n == "eqgrad" and not args.no_eqgrad:
      devs = [d.strip().upper() for d in args.eqgrad_devices.split(",") if d.strip()]
      candidates += [EqgradFW(d) for d in devs]
      if "LLVM" in devs and not args.no_one_thread: candidates.append(EqgradFW("LLVM", threads=1))
    elif n == "numpy": candidates.append(NumpyFW())
    elif n == "torch": candidates += [TorchFW(), TorchFW(threads=1)]
    elif n == "tinygrad": candidates += [TinygradFW(d.strip()) for d in args.tinygrad_devices.split(",") if d.strip()]
    elif n != "eqgrad": p.error(f"unknown framework {n!r}")

  fws, skipped = [], {}
  for fw in candidates:
    try:
      fw.setup()
      fws.append(fw)
    except Skip as e: skipped[fw.name] = str(e)
  baseline = next((fw.name for fw in fws if isinstance(fw, EqgradFW)), "numpy")

  env = print_env(fws, skipped, args)
  peaks = measure_peaks() if args.peak_gflops is None or args.peak_gbs is None else {"source": "given"}
  if args.peak_gflops is not None: peaks["gflops"] = args.peak_gflops
  if args.peak_gbs is not None: peaks["gbs"] = args.peak_gbs
  env["peaks"] = peaks
  print(f"machine peaks ({peaks['source']}): {peaks['gflops']:.0f} GFLOP/s float32 matmul, {peaks['gbs']:.1f} GB/s copy")
  if baseline == "numpy": print("NOTE: eqgrad column unavailable; ratios are relative to numpy")

  results: list[Result] = []
  for w in workloads:
    arrays = make_inputs(w, args.quick)
    ref = np.asarray(w.fn(NumpyFW, *arrays), dtype=np.float64)
    case = []
    for fw in fws:
      progress(f"running {w.name} / {fw.name}")
      try:
        r = bench_one(fw, w, arrays, ref, args.reps, args.warmup, args.idle, collect=not args.no_gc)
      except Skip as e:
        r = Result(w.name, fw.name, status="skipped", note=str(e))
      except Exception as e:
        r = Result(w.name, fw.name, status="error", note=f"{type(e).__name__}: {e}".splitlines()[0])
        if os.environ.get("BENCH_DEBUG"): traceback.print_exc()
      case.append(r)
    base = next((r for r in case if r.framework == baseline and r.median_s), None)
    shapes = [a.shape for a in arrays]
    for r in case:
      if base and r.median_s: r.ratio_vs_baseline = r.median_s / base.median_s
      if r.median_s and not w.train:
        if w.flops:
          g = w.flops(shapes) / r.median_s / 1e9
          r.rate, r.efficiency = f"{g:.0f} GFLOP/s", g / peaks["gflops"]
        else:
          g = (sum(a.nbytes for a in arrays) + 4 * ref.size) / r.median_s / 1e9
          r.rate, r.efficiency = f"{g:.1f} GB/s", g / peaks["gbs"]
    results += case
    if not args.no_gc: gc.collect()
  progress("")

  print_table(results, baseline)
  bad = [r for r in results if r.status in ("mismatch", "error")]
  if bad: print(f"\n{len(bad)} case(s) failed verification or errored: " + ", ".join(f"{r.workload}/{r.framework}" for r in bad))

  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"env": env, "baseline": baseline, "results": [asdict(r) for r in results]}, f, indent=1)
    print(f"wrote {args.json}")
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())
