"""Elementwise math composed from the primitives: inverse and hyperbolic trigonometry, erf, rounding, remainders, comparisons of closeness, activations, integer bit shifts.

``Tensor`` inherits these methods (frontend/tensor.py); they build on Tensor's own methods through
``self`` and ``type(self)`` (this module cannot import tensor.py, which imports it).
"""
from __future__ import annotations


class ElementwiseOps:
    __slots__ = ()
