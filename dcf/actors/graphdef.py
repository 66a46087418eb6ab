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
    8 callable      its index in the description's callables (py_func's fn, nothing else)
    9 numpy dtype   dtype.str

Only the callables of py_funcs are pickled: all of a description's in one cloudpickle
stream, so that two py_funcs sharing an object (an environment's `reset` and `step`)
share one copy of it on the worker, and each object a session already sent to that worker
(a `ShippedObjects` on both ends) goes as a reference to the worker's copy, so that a
py_func's state outlives the plan that first shipped it (a run fetching something else).
They travel on the authenticated control channel. Decoding rebuilds records only for
dataclasses defined in ``dcf`` modules.
"""

from __future__ import annotations

import contextvars
import dataclasses
import importlib
import io
import pickle
import os
import sys
import sysconfig
import types
from typing import Any

import msgpack
import numpy as np

from dcf import dtypes
from dcf.ops.registry import OPS, Kind
from dcf.plan import PNode

__all__ = ["GraphDefError", "RemoteOp", "ShippedObjects", "decode_parts", "encode_parts"]

_ND, _NPSCALAR, _DTYPE, _TUPLE, _SLICE, _ELLIPSIS, _RECORD, _CALLABLE, _NPDTYPE = range(1, 10)
_PICKLED_ATTRS = frozenset({("PyFunc", "fn"), ("PyFuncStateless", "fn")})
_PY_FUNC_TYPES = frozenset(t for t, _ in _PICKLED_ATTRS)


class GraphDefError(ValueError):
    """A partition cannot be described for a worker, or a description is malformed."""

    stream: int | None = None   # the stream of py_func objects that could not be loaded


class ShippedObjects:
    """The objects that py_func callables brought to one worker for one session.

    On the client: ``sent`` maps id(obj) to (token, obj) for every object pickled so far
    (holding obj keeps the id its own); on the worker: ``objs`` maps a token to the
    worker's copy. A token is (stream, memo index): the memo indices of pickle's writer
    and reader agree, so both ends name each object of a stream alike."""

    __slots__ = ("objs", "sent", "streams")

    def __init__(self) -> None:
        self.sent: dict[int, tuple[tuple[int, int], Any]] = {}
        self.objs: dict[tuple[int, int], Any] = {}
        self.streams = 0

    def forget(self, stream: int) -> None:
        """On the client: the worker could not load `stream`; what it sent goes again."""
        for key in [k for k, (token, _) in self.sent.items() if token[0] == stream]:
            del self.sent[key]


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
        self.callables: list[Any] = []
        self.callable_ops: list[str] = []    # "Type 'name'" of each callable's op
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
            self.callables.append(obj)
            self.callable_ops.append(self.where)
            return msgpack.ExtType(_CALLABLE, self._sub(len(self.callables) - 1))
        raise GraphDefError(
            f"{self.where}: attribute value {obj!r:.80} of type {cls.__name__} cannot be "
            "shipped to a worker")

    def _sub(self, obj: Any) -> bytes:
        return msgpack.Packer(default=self._default, use_bin_type=True,
                              strict_types=True).pack(obj)


def _pickle_callables(fns: list, shipped: ShippedObjects | None) -> tuple[int, bytes]:
    """`fns` in one stream, and the stream's number; what `shipped` says the worker has
    goes by reference."""
    import cloudpickle

    class _Pickler(cloudpickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            hit = sent.get(id(obj))
            return None if hit is None else hit[0]

        def reducer_override(self, obj: Any) -> Any:
            # what fn reaches (the class of an environment object it captured, a helper
            # it calls) may come from a user module too: by value as well
            if reach and isinstance(obj, (type, types.FunctionType)):
                by_value(getattr(obj, "__module__", None))
            return super().reducer_override(obj)

    sent = shipped.sent if shipped is not None else {}
    # Functions and classes of the user's own modules (a test file, a script's helper
    # module) may not be importable on the worker (its sys.path is not the client's):
    # send those by value. Library functions go by reference. Where what fn reaches
    # cannot go by value (a module global holding a lock), only fn's own module does.
    mods: list = []

    def by_value(name: Any) -> None:
        mod = sys.modules.get(name) if isinstance(name, str) else None
        if (mod is not None and mod.__name__ != "__main__" and mod not in mods
                and _is_user_module(mod)
                and str(getattr(mod, "__file__", "")).endswith(".py")  # (not compiled)
                # (one the user registered stays so: not ours to unregister)
                and mod.__name__ not in cloudpickle.list_registry_pickle_by_value()):
            cloudpickle.register_pickle_by_value(mod)
            mods.append(mod)

    for reach in (True, False):
        try:
            for fn in fns:
                by_value(getattr(fn, "__module__", None))
            buf = io.BytesIO()
            pickler = _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
            pickler.dump(fns)
            break
        except Exception:
            if not reach:
                raise
        finally:
            for mod in mods:
                cloudpickle.unregister_pickle_by_value(mod)
            mods.clear()
    stream = 0
    if shipped is not None:
        stream = shipped.streams
        shipped.streams += 1
        for key, (idx, obj) in pickler.memo.copy().items():
            sent[key] = ((stream, idx), obj)
    return stream, buf.getvalue()


def _unpickle_callables(data: bytes, stream: int, shipped: ShippedObjects | None) -> list:
    import cloudpickle  # noqa: F401 - what the stream's reducers import

    objs = shipped.objs if shipped is not None else {}

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            try:
                return objs[tuple(pid)]
            except (KeyError, TypeError):
                raise GraphDefError(
                    f"a py_func refers to object {pid!r} of an earlier description that "
                    "this worker does not have (did that description fail to load?)"
                    ) from None

    up = _Unpickler(io.BytesIO(data))
    fns = up.load()
    if shipped is not None:
        for idx, obj in up.memo.copy().items():
            objs[(stream, idx)] = obj
    return fns


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


def encode_parts(parts: list[dict], shipped: ShippedObjects | None = None) -> bytes:
    """Describe partitions for a worker.

    Each item of `parts` is ``{"device": str, "nodes": [PNode], "feeds": [(PNode, k)],
    "fetches": [(PNode, out, k)], "frame_parents": {frame: (parent, pi)}}``, as the
    partitioner made them. Raises GraphDefError naming the op whose attributes or
    kernel cannot be rebuilt on a worker. `shipped`: what this session already sent to
    the worker (the objects py_funcs captured), updated with what this description sends.
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
    fns, stream = None, 0
    if enc.callables:
        try:
            stream, fns = _pickle_callables(enc.callables, shipped)
        except Exception as e:  # noqa: BLE001 - whatever a closure holds (a lock, a socket)
            for fn, where in zip(enc.callables, enc.callable_ops):   # name the op
                try:
                    _pickle_callables([fn], None)
                except Exception as e1:  # noqa: BLE001
                    raise GraphDefError(f"{where}: cannot describe it for a worker: {e1}"
                                        ) from e1
            raise GraphDefError(f"py_funcs {', '.join(enc.callable_ops)}: cannot describe "
                                f"them for a worker: {e}") from e
    return msgpack.packb({"parts": out, "callables": fns, "stream": stream},
                         use_bin_type=True)


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
        return _CALLABLES.get()[_unpack(data)]
    raise GraphDefError(f"unknown extension type {code}")


def _np_dtype(s: Any) -> np.dtype:
    dt = np.dtype(s)
    if dt.hasobject:
        raise GraphDefError("object dtypes are refused")
    return dt


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False,
                           use_list=True)


_CALLABLES: contextvars.ContextVar[list] = contextvars.ContextVar("dcf_callables")


def decode_parts(blob: bytes, shipped: ShippedObjects | None = None) -> list[dict]:
    """Rebuild what `encode_parts` described: per partition ``{"device", "nodes",
    "feeds": [(PNode, k)], "fetches": [(PNode, out, k)], "frame_parents"}`` with fresh
    feed PNodes and kernels bound from this process's OPS table. `shipped`: the objects
    the session's earlier descriptions brought (see `encode_parts`)."""
    try:
        raw = msgpack.unpackb(blob, raw=False, strict_map_key=False, use_list=True)
        fns = raw["callables"]
        try:
            fns = [] if fns is None else _unpickle_callables(fns, int(raw["stream"]), shipped)
        except Exception as e:  # noqa: BLE001 - what a closure's unpickling raises
            # (a module this process cannot import, an object that cannot be rebuilt here)
            ops = [f"{row[1]} '{row[0]}' on {row[8]}" for prt in raw["parts"]
                   for row in prt["nodes"]
                   if row[1] in _PY_FUNC_TYPES]
            err = GraphDefError(
                f"{', '.join(ops) or 'py_func'}: its function cannot be rebuilt on the "
                f"worker: {type(e).__name__}: {e}")
            err.stream = int(raw["stream"])   # (the client sends what it held again)
            raise err from e
        token = _CALLABLES.set(fns)
        try:
            return [_decode_part(p) for p in raw["parts"]]
        finally:
            _CALLABLES.reset(token)
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
