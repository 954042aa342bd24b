"""Scans, sorting, einsum, extra reductions and movement/construction ops composed from the primitives.

``Tensor`` inherits these methods (frontend/tensor.py); they build on Tensor's own methods through
``self`` and ``type(self)`` (this module cannot import tensor.py, which imports it).
"""
from __future__ import annotations


class ShapeOps:
    __slots__ = ()
