"""Indexing by tensors, lists and masks (gather), setitem, scatter and their relatives, composed from the primitives.

``Tensor`` inherits these methods (frontend/tensor.py); they build on Tensor's own methods through
``self`` and ``type(self)`` (this module cannot import tensor.py, which imports it).
"""
from __future__ import annotations


class IndexingOps:
    __slots__ = ()
