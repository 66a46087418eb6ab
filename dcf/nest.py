"""Flatten and re-pack nested structures (tuples, lists, dicts, namedtuples) of leaves."""

from __future__ import annotations

import collections
from typing import Any, Callable, Iterator

from dcf.graph import Tensor


def is_nested(x: Any) -> bool:
    return isinstance(x, (list, tuple, dict))


def _keys(d: dict) -> list:
    """A dict's keys in flatten's order: sorted, or where they do not sort (keys of mixed
    types: {1: a, "b": c}; tensors or Variables, whose `<` would build an op in their graph
    each time) by type and repr -- still independent of insertion order."""
    try:
        if not any(isinstance(k, Tensor) or hasattr(type(k), "_as_tensor") for k in d):
            return sorted(d)
    except TypeError:
        pass
    return sorted(d, key=lambda k: (type(k).__module__, type(k).__qualname__, repr(k)))


def _children(x: Any) -> list:
    if isinstance(x, dict):
        return [x[k] for k in _keys(x)]
    return list(x)


def flatten(x: Any) -> list:
    """Leaves of `x` in a deterministic order (dicts by sorted key)."""
    if not is_nested(x):
        return [x]
    out: list = []
    for c in _children(x):
        out.extend(flatten(c))
    return out


def pack_sequence_as(structure: Any, flat: list) -> Any:
    """Inverse of flatten: fill `structure`'s shape with the leaves in `flat`."""
    it = iter(flat)
    result = _pack(structure, it)
    rest = list(it)
    if rest:
        raise ValueError(f"pack_sequence_as: {len(rest)} leaves left over")
    return result


def _pack(s: Any, it: Iterator) -> Any:
    if not is_nested(s):
        try:
            return next(it)
        except StopIteration:
            raise ValueError("pack_sequence_as: too few leaves") from None
    if isinstance(s, dict):
        vals = {k: _pack(s[k], it) for k in _keys(s)}
        if isinstance(s, collections.defaultdict):     # (its first argument: the factory)
            return type(s)(s.default_factory, ((k, vals[k]) for k in s))
        return type(s)((k, vals[k]) for k in s)
    items = [_pack(c, it) for c in s]
    if isinstance(s, tuple) and hasattr(s, "_fields"):
        return type(s)(*items)
    return type(s)(items)


def map_structure(fn: Callable, *structures: Any) -> Any:
    for s in structures[1:]:
        assert_same_structure(structures[0], s)
    flats = [flatten(s) for s in structures]
    return pack_sequence_as(structures[0], [fn(*xs) for xs in zip(*flats)])


def structure_diff(a: Any, b: Any, path: str = "") -> str | None:
    """Where two structures first differ, as a path, or None if they match.

    Tuples and lists count as the same kind of structure.
    """
    if is_nested(a) != is_nested(b):
        return f"at {path or 'top level'}: {_kind(a)} vs {_kind(b)}"
    if not is_nested(a):
        return None
    if isinstance(a, dict) != isinstance(b, dict):
        return f"at {path or 'top level'}: {_kind(a)} vs {_kind(b)}"
    if isinstance(a, dict):
        if _keys(a) != _keys(b):
            return f"at {path or 'top level'}: keys {_keys(a)} vs {_keys(b)}"
        keys = _keys(a)
        pairs = [(f"{path}[{k!r}]", a[k], b[k]) for k in keys]
    else:
        if len(a) != len(b):
            return f"at {path or 'top level'}: length {len(a)} vs {len(b)}"
        pairs = [(f"{path}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b))]
    for p, x, y in pairs:
        d = structure_diff(x, y, p)
        if d:
            return d
    return None


def _kind(x: Any) -> str:
    if isinstance(x, dict):
        return f"dict with {len(x)} keys"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__} of length {len(x)}"
    return "a single value"


def assert_same_structure(a: Any, b: Any) -> None:
    d = structure_diff(a, b)
    if d:
        raise ValueError(f"structures differ {d}")
