"""Partitions as bytes: what the client ships to a worker once per plan.

A worker rebuilds each partition's PNodes from this description (kernels are looked
up again as ``OPS[type].kernel``) and plans and compiles them exactly as an in-process
session does. The format is msgpack; attribute values that msgpack has no type for
travel as extension types::

    1 ndarray       msgpack [dtype.str, shape, raw bytes]   (no object dtypes)
    2 numpy scalar  msgpack [dtype.str, raw bytes]
    3 DType         its name
    4 tuple         msgpack list of encoded items
    5 slice         msgpack [start, stop, step]
    6 Ellipsis
    7 dcf record    msgpack [module, class name, [field values]]   (dataclasses of dcf.*)
    8 callable      cloudpickle bytes                        (py_func's fn, nothing else)
    9 numpy dtype   dtype.str

Only the callable of a py_func is pickled; it travels on the authenticated control
channel. Decoding rebuilds records only for dataclasses defined in ``dcf`` modules.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import sysconfig
from typing import Any

import msgpack
import numpy as np

from dcf import dtypes
from dcf.ops.registry import OPS, Kind
from dcf.plan import PNode

__all__ = ["GraphDefError", "RemoteOp", "decode_parts", "encode_parts"]

_ND, _NPSCALAR, _DTYPE, _TUPLE, _SLICE, _ELLIPSIS, _RECORD, _CALLABLE, _NPDTYPE = range(1, 10)
_PICKLED_ATTRS = frozenset({("PyFunc", "fn"), ("PyFuncStateless", "fn")})


class GraphDefError(ValueError):
    """A partition cannot be described for a worker, or a description is malformed."""


class RemoteOp:
    """What a worker knows of a graph op: enough for error messages and traces."""

    __slots__ = ("attrs", "device", "frame_ctx", "name", "site", "type")

    def __init__(self, type_: str, name: str, device: str, site: str | None,
                 attrs: dict) -> None:
        self.type = type_
        self.name = name
        self.device = device
        self.site = site
        self.attrs = attrs
        self.frame_ctx = None

    def __repr__(self) -> str:
        return f"<RemoteOp '{self.name}' type={self.type}>"


# ------------------------------------------------------------------- encoding
class _Encoder:
    def __init__(self, where: str) -> None:
        self.where = where           # "Type 'name'" of the op being encoded, for errors
        self.allow_callable = False
        self._packer = msgpack.Packer(default=self._default, use_bin_type=True,
                                      strict_types=True)

    def pack(self, obj: Any) -> bytes:
        try:
            return self._packer.pack(obj)
        except GraphDefError:
            raise
        except (TypeError, ValueError, OverflowError) as e:
            raise GraphDefError(f"{self.where}: cannot describe it for a worker: {e}") from e

    def _default(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise GraphDefError(f"{self.where}: an object array cannot be shipped")
            arr = np.ascontiguousarray(obj)
            return msgpack.ExtType(_ND, self._sub([arr.dtype.str, list(arr.shape),
                                                   arr.tobytes()]))
        if isinstance(obj, np.generic):
            if obj.dtype.hasobject:
                raise GraphDefError(f"{self.where}: an object scalar cannot be shipped")
            return msgpack.ExtType(_NPSCALAR, self._sub([obj.dtype.str, obj.tobytes()]))
        if isinstance(obj, dtypes.DType):
            return msgpack.ExtType(_DTYPE, obj.name.encode())
        if isinstance(obj, np.dtype):
            return msgpack.ExtType(_NPDTYPE, obj.str.encode())
        if isinstance(obj, tuple):
            return msgpack.ExtType(_TUPLE, self._sub(list(obj)))
        if isinstance(obj, list):   # strict_types: list subclasses land here
            return list(obj)
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, dict):
            return dict(obj)
        if isinstance(obj, slice):
            return msgpack.ExtType(_SLICE, self._sub([obj.start, obj.stop, obj.step]))
        if obj is Ellipsis:
            return msgpack.ExtType(_ELLIPSIS, b"")
        cls = type(obj)
        if dataclasses.is_dataclass(obj) and cls.__module__.split(".")[0] == "dcf":
            vals = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
            return msgpack.ExtType(_RECORD, self._sub([cls.__module__, cls.__qualname__, vals]))
        if callable(obj) and self.allow_callable:
            return msgpack.ExtType(_CALLABLE, _pickle_callable(obj))
        raise GraphDefError(
            f"{self.where}: attribute value {obj!r:.80} of type {cls.__name__} cannot be "
            "shipped to a worker")

    def _sub(self, obj: Any) -> bytes:
        return msgpack.Packer(default=self._default, use_bin_type=True,
                              strict_types=True).pack(obj)


def _pickle_callable(fn: Any) -> bytes:
    import cloudpickle

    # Functions of the user's own modules (a test file, a script's helper module) may not
    # be importable on the worker: send those by value. Library functions go by reference.
    mod = sys.modules.get(getattr(fn, "__module__", None) or "")
    by_value = mod is not None and mod.__name__ != "__main__" and _is_user_module(mod)
    if by_value:
        cloudpickle.register_pickle_by_value(mod)
    try:
        return cloudpickle.dumps(fn)
    finally:
        if by_value:
            cloudpickle.unregister_pickle_by_value(mod)


_LIB_DIRS = tuple({os.path.realpath(p) for p in (
    sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
    sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")) if p})
_DCF_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _is_user_module(mod: Any) -> bool:
    path = getattr(mod, "__file__", None)
    if not path:
        return False
    path = os.path.realpath(path)
    if path.startswith(_DCF_DIR + os.sep):
        return False
    return not any(path.startswith(d + os.sep) for d in _LIB_DIRS)


def encode_parts(parts: list[dict]) -> bytes:
    """Describe partitions for a worker.

    Each item of `parts` is ``{"device": str, "nodes": [PNode], "feeds": [(PNode, k)],
    "fetches": [(PNode, out, k)], "frame_parents": {frame: (parent, pi)}}``, as the
    partitioner made them. Raises GraphDefError naming the op whose attributes or
    kernel cannot be rebuilt on a worker.
    """
    enc = _Encoder("graph")
    out = []
    for prt in parts:
        nodes: list[PNode] = prt["nodes"]
        index = {id(p): i for i, p in enumerate(nodes)}
        feed_index = {id(fn): j for j, (fn, _) in enumerate(prt["feeds"])}

        def ref(src: Any, p: PNode, index: dict = index, feed_index: dict = feed_index
                ) -> Any:
            if src is None:
                return None
            node, idx = src
            if id(node) in index:
                return [index[id(node)], idx]
            if id(node) in feed_index:
                return [-1 - feed_index[id(node)], idx]
            raise GraphDefError(f"{p.type} '{p.name}': input {node.name} is in another "
                                "partition (the partitioner should have cut this edge)")

        rows = []
        for p in nodes:
            d = OPS.get(p.type)
            if p.kernel is not None and (d is None or d.kernel is not p.kernel):
                raise GraphDefError(
                    f"{p.type} '{p.name}': its kernel is not the registered kernel of op type "
                    f"{p.type!r}, so a worker cannot rebuild it")
            enc.where = f"{p.type} '{p.name}'"
            attrs = {}
            for k, v in p.attrs.items():
                enc.allow_callable = (p.type, k) in _PICKLED_ATTRS
                attrs[k] = enc.pack(v)
            enc.allow_callable = False
            op = p.op
            rows.append([p.name, p.type, int(p.kind), p.frame,
                         [ref(i, p) for i in p.inputs],
                         [index[id(c)] for c in p.control], attrs, p.n_out, p.device,
                         bool(p.stateful), bool(p.resource), p.kernel is not None,
                         None if op is None else [getattr(op, "site", None), p.device]])
        out.append({
            "device": prt["device"],
            "nodes": rows,
            "feeds": [int(k) for _, k in prt["feeds"]],
            "fetches": [[index[id(p)], int(idx), int(k)] for p, idx, k in prt["fetches"]],
            "frame_parents": {f: [par, int(pi)] for f, (par, pi) in
                              prt["frame_parents"].items()},
        })
    return msgpack.packb(out, use_bin_type=True)


# ------------------------------------------------------------------- decoding
def _ext_hook(code: int, data: bytes) -> Any:
    if code == _ND:
        dt, shape, raw = _unpack(data)
        arr = np.frombuffer(raw, dtype=_np_dtype(dt)).reshape(shape).copy()
        arr.setflags(write=False)
        return arr
    if code == _NPSCALAR:
        dt, raw = _unpack(data)
        return np.frombuffer(raw, dtype=_np_dtype(dt))[0]
    if code == _DTYPE:
        return dtypes.as_dtype(data.decode())
    if code == _NPDTYPE:
        return _np_dtype(data.decode())
    if code == _TUPLE:
        return tuple(_unpack(data))
    if code == _SLICE:
        return slice(*_unpack(data))
    if code == _ELLIPSIS:
        return Ellipsis
    if code == _RECORD:
        module, qualname, vals = _unpack(data)
        if not isinstance(module, str) or module.split(".")[0] != "dcf":
            raise GraphDefError(f"record of module {module!r} refused")
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise GraphDefError(f"{module}.{qualname} is not a dcf record")
        return cls(*vals)
    if code == _CALLABLE:
        import cloudpickle

        return cloudpickle.loads(data)
    raise GraphDefError(f"unknown extension type {code}")


def _np_dtype(s: Any) -> np.dtype:
    dt = np.dtype(s)
    if dt.hasobject:
        raise GraphDefError("object dtypes are refused")
    return dt


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False,
                           use_list=True)


def decode_parts(blob: bytes) -> list[dict]:
    """Rebuild what `encode_parts` described: per partition ``{"device", "nodes",
    "feeds": [(PNode, k)], "fetches": [(PNode, out, k)], "frame_parents"}`` with fresh
    feed PNodes and kernels bound from this process's OPS table."""
    try:
        raw = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
        return [_decode_part(p) for p in raw]
    except GraphDefError:
        raise
    except Exception as e:  # malformed description: say so, never crash the worker
        raise GraphDefError(f"malformed graph description: {type(e).__name__}: {e}") from e


def _decode_part(prt: dict) -> dict:
    feeds = [PNode(f"_feed/{k}", "_Feed", Kind.KERNEL, "", n_out=1, attrs={"feed": k})
             for k in prt["feeds"]]
    nodes: list[PNode] = []
    rows = prt["nodes"]
    for (name, type_, kind, frame, _ins, _ctl, attrs, n_out, device, stateful, resource,
         has_kernel, op_info) in rows:
        d = OPS.get(type_)
        kernel = None
        if has_kernel:
            if d is None or d.kernel is None:
                raise GraphDefError(f"{type_} '{name}': op type {type_!r} has no kernel in "
                                    "this worker (is the worker's dcf the client's version?)")
            kernel = d.kernel
        values = {k: _unpack(v) for k, v in attrs.items()}
        p = PNode(name, type_, Kind(kind), frame, attrs=values, n_out=n_out, device=device,
                  stateful=stateful, kernel=kernel, resource=resource)
        if op_info is not None:
            site, op_device = op_info
            p.op = RemoteOp(type_, name, op_device, site, values)  # type: ignore[assignment]
        nodes.append(p)

    def deref(r: Any) -> Any:
        if r is None:
            return None
        i, idx = r
        return (nodes[i], idx) if i >= 0 else (feeds[-1 - i], idx)

    for p, row in zip(nodes, rows):
        p.inputs = [deref(r) for r in row[4]]
        p.control = [nodes[i] for i in row[5]]
    return {
        "device": prt["device"],
        "nodes": nodes,
        "feeds": [(fn, fn.attrs["feed"]) for fn in feeds],
        "fetches": [(nodes[i], idx, k) for i, idx, k in prt["fetches"]],
        "frame_parents": {f: (par, pi) for f, (par, pi) in prt["frame_parents"].items()},
    }
