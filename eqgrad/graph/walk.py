"""The one graph traversal: nodes reachable from some roots, each once, sources before users.

Iterative (a 10,000-op chain does not hit Python's recursion limit) and by identity (nodes need not
be hashable). Used by the lazy graph (``lazy.toposort``), kernel bodies (``KNode.walk``) and
autograd (``frontend/autograd.py``).

For example ``topological([c], lambda n: n.src)`` for ``c = add(a, b)`` gives ``[a, b, c]``.
"""
from __future__ import annotations

from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def topological(roots: Iterable[T], sources: Callable[[T], Iterable[T]]) -> list[T]:
    """Post-order depth-first walk from ``roots`` in order, visiting each node's ``sources`` left
    to right; every node reached appears once, after all of its sources."""
    order: list[T] = []
    seen: set[int] = set()
    stack: list[tuple[T, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((s, False) for s in reversed(list(sources(node))) if id(s) not in seen)
    return order
