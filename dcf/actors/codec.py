"""Wire format of data-plane messages: pure encode/decode, bytes in and out, no sockets.

A tensor travels as pyzmq's "serialsocket" layout, a small msgpack header and the raw
buffer::

    frame 0  msgpack {"k": key, "dtype": "<f4", "shape": [2, 3]}   (or {"k": key, "dead": True})
    frame 1  the C-contiguous bytes of the array                   (absent for a dead token)

A control message is one msgpack map, optionally followed by one opaque blob frame (for
payloads msgpack cannot carry, such as a cloudpickled callable)::

    frame 0  msgpack {"type": "run", ...}
    frame 1  blob bytes                                             (optional)

The transport packs either into one wire body (`pack_tensors` / `pack_control`): small
messages then travel as a single ZeroMQ frame, several tensors for one peer share one
message, and only a buffer of at least ``bulk_min`` bytes goes in a frame of its own
(without a copy)::

    tensors  item*            item: u32 header length, msgpack [key, dtype, shape] or
                              [key] (dead), then the raw buffer (the last item's buffer
                              may be the separate bulk frame instead)
    control  flag u8, u32 map length, msgpack map, then the blob: none (flag 0), the rest
             of the body (flag 1) or the bulk frame (flag 2)

Decoding never trusts its input: whatever the bytes, it returns a valid message or raises
`CodecError` — never another exception type — so a transport can drop bad frames with one
``except``. Only msgpack is used; nothing here can execute code (no pickle).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_NDIM",
    "MAX_TENSOR_BYTES",
    "SUPPORTED_DTYPES",
    "CodecError",
    "Key",
    "decode_control",
    "decode_tensor",
    "encode_control",
    "encode_tensor",
    "pack_control",
    "pack_tensors",
    "unpack_control",
    "unpack_tensors",
]

MAX_HEADER_BYTES = 64 * 1024
# Sanity bound only: the transport enforces the real per-message limit.
MAX_TENSOR_BYTES = 1 << 40
MAX_NDIM = 32
# Control messages nest a little (lists of keys, dicts of attrs); nothing legitimate goes deep.
_MAX_DEPTH = 32

# Only these dtypes may cross the wire: never object (arbitrary Python objects), never
# structured or string dtypes whose layout a peer could abuse.
SUPPORTED_DTYPES: tuple[np.dtype, ...] = tuple(
    np.dtype(t) for t in (np.bool_, np.float16, np.float32, np.float64, np.int32, np.int64)
)
# Both byte orders, so a big-endian peer interoperates; "|b1" has no order and appears once.
_DTYPES: dict[str, np.dtype] = {
    d.str: d for t in SUPPORTED_DTYPES for d in (t, t.newbyteorder(">"), t.newbyteorder("<"))
}
_SUPPORTED_NAMES = ", ".join(d.name for d in SUPPORTED_DTYPES)
# Received arrays in the other byte order are swapped into this host's (name -> native
# dtype): a big-endian ">f4" must arrive as a float32 that equals np.float32 (a TensorArray,
# a queue or a caller's dtype check refuses ">f4"), as its scalars already do.
_FOREIGN_ORDER: dict[str, np.dtype] = {
    name: d.newbyteorder("=") for name, d in _DTYPES.items() if not d.isnative
}

Key = tuple  # tuple of int | str | bytes | nested tuples of those


class CodecError(ValueError):
    """A message could not be encoded, or received frames are not a valid message."""


# -- tensors ---------------------------------------------------------------------------------


def encode_tensor(key: Key, value: Any, *, is_dead: bool = False) -> list[bytes | memoryview]:
    """Encode one tensor (or a dead token) for `key` as a list of frames.

    ``[msgpack header, raw buffer]`` for a live value, ``[msgpack header]`` for a dead one.
    A C-contiguous array is not copied: frame 1 is a flat byte view of its memory, so the
    caller must not mutate the array until the frames are sent. Non-contiguous arrays are
    copied once. Numpy scalars and 0-d arrays are sent as shape ``[]``.

    Args:
        key: a tuple of ints, strings, bytes (or nested tuples of those); it comes back as a
            tuple so it hashes.
        value: a numpy array or scalar of a supported dtype (bool, float16, float32,
            float64, int32, int64); ignored when `is_dead`.
        is_dead: send a dead token instead of a value.

    Raises:
        CodecError: the key is not a tuple of ints/strings/bytes, the dtype is not
            supported, or the header exceeds `MAX_HEADER_BYTES`.
    """
    _check_key(key)
    if is_dead:
        return [_pack({"k": key, "dead": True})]
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged lists and the like
        raise CodecError(f"value cannot be converted to an array: {e}") from e
    dtype = _DTYPES.get(arr.dtype.str)
    if dtype is None:
        raise CodecError(
            f"dtype {arr.dtype} cannot be sent: supported dtypes are {_SUPPORTED_NAMES}"
        )
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)  # the one copy, only for strided views
    header = _pack({"k": key, "dtype": dtype.str, "shape": list(arr.shape)})
    # Flat uint8 view: len(frame) == nbytes for every dtype and shape (0-d and empty included).
    return [header, arr.reshape(-1).view(np.uint8).data]


def decode_tensor(frames: Sequence[Any]) -> tuple[Key, np.ndarray | np.generic | None, bool]:
    """Decode frames from `encode_tensor` into ``(key, value, is_dead)``.

    ``value`` is None for a dead token. A live value is an ``np.frombuffer`` view of the
    received buffer (zero copy): it is read-only when the frame was ``bytes`` and keeps the
    frame alive (one sent in the other byte order arrives in this host's: a copy). Treat
    it as immutable either way; copy before writing into it. A 0-d value decodes to a
    numpy scalar of its dtype (``arr[()]``).

    Args:
        frames: the message's frames, each bytes-like (bytes, memoryview, ``zmq.Frame``).

    Raises:
        CodecError: anything about the frames is malformed (frame count, header size,
            msgpack, fields, key, dtype, shape, or buffer length).
    """
    if not 1 <= len(frames) <= 2:
        raise CodecError(f"a tensor message has 1 or 2 frames, got {len(frames)}")
    header = _unpack_map(frames[0], "tensor header")
    key = header.get("k")
    if key is None:
        raise CodecError("tensor header has no key 'k'")
    _check_key(key)
    if "dead" in header:
        if header.keys() != {"k", "dead"} or header["dead"] is not True:
            raise CodecError(f"malformed dead-token header fields {sorted(header)}")
        if len(frames) != 1:
            raise CodecError(f"a dead token has 1 frame, got {len(frames)}")
        return key, None, True
    if header.keys() != {"k", "dtype", "shape"}:
        raise CodecError(
            f"tensor header fields are {sorted(map(str, header))}, expected ['dtype', 'k', 'shape']"
        )
    if len(frames) != 2:
        raise CodecError(f"a live tensor has 2 frames (header, buffer), got {len(frames)}")
    dtype_str = header["dtype"]
    dtype = _DTYPES.get(dtype_str) if isinstance(dtype_str, str) else None
    if dtype is None:
        raise CodecError(
            f"unsupported dtype {dtype_str!r}: supported dtypes are {_SUPPORTED_NAMES}"
        )
    shape = _check_shape(header["shape"], dtype)
    buf = _as_bytes_view(frames[1])
    expected = math.prod(shape) * dtype.itemsize
    if len(buf) != expected:
        raise CodecError(
            f"buffer has {len(buf)} bytes but shape {list(shape)} of {dtype.name} needs {expected}"
        )
    arr = _native(np.frombuffer(buf, dtype=dtype), dtype_str).reshape(shape)
    return key, (arr[()] if not shape else arr), False


# -- control messages ------------------------------------------------------------------------


def encode_control(msg: dict[str, Any], blob: bytes | None = None) -> list[bytes]:
    """Encode a control message (a msgpack-able dict with string keys) and an optional blob.

    Keep `msg` small (at most `MAX_HEADER_BYTES` packed); put bulky or non-msgpack
    payloads (a cloudpickled callable, a serialized plan) in `blob`, which is opaque here.

    Raises:
        CodecError: `msg` is not a dict with string keys, holds a value msgpack cannot pack
            or that would not survive decoding, packs larger than `MAX_HEADER_BYTES`, or
            `blob` is not bytes-like.
    """
    if not isinstance(msg, dict):
        raise CodecError(f"a control message is a dict, got {type(msg).__name__}")
    _check_plain(msg, 0)
    frames = [_pack(msg)]
    if blob is not None:
        try:
            frames.append(bytes(memoryview(blob)))
        except TypeError as e:
            raise CodecError(f"blob must be bytes-like, got {type(blob).__name__}") from e
    return frames


def decode_control(frames: Sequence[Any]) -> tuple[dict[str, Any], bytes | None]:
    """Decode frames from `encode_control` into ``(msg, blob_or_None)``.

    Arrays inside `msg` come back as tuples (so keys inside messages hash).

    Raises:
        CodecError: wrong frame count, oversized or malformed header, non-string keys,
            or values other than None/bool/int/float/str/bytes/tuple/dict.
    """
    if not 1 <= len(frames) <= 2:
        raise CodecError(f"a control message has 1 or 2 frames, got {len(frames)}")
    msg = _unpack_map(frames[0], "control message")
    _check_plain(msg, 0)
    blob = bytes(_as_bytes_view(frames[1])) if len(frames) == 2 else None
    return msg, blob


# -- packed bodies (one wire frame per message) -----------------------------------------------

_U32 = struct.Struct("<I")
_packb = msgpack.packb
_unpackb = msgpack.unpackb
# numpy scalar type -> its dtype string (native byte order), for the packing fast path
_SCALARS: dict[type, str] = {t.type: t.str for t in SUPPORTED_DTYPES}
_CTRL = struct.Struct("<BI")
_U32_MAX = 0xFFFFFFFF
# dtype string -> (struct reader, numpy scalar type): a received scalar is read without
# making an array first (either byte order; float16 through struct's "e")
_STRUCT_CODES = {("b", 1): "?", ("f", 2): "e", ("f", 4): "f", ("f", 8): "d",
                 ("i", 4): "i", ("i", 8): "q"}
_SCALAR_READ: dict[str, tuple[Any, type]] = {
    name: (struct.Struct((">" if name[0] == ">" else "<")
                         + _STRUCT_CODES[(d.kind, d.itemsize)]).unpack_from, d.type)
    for name, d in _DTYPES.items()
}


def pack_tensors(items: Sequence[tuple[Key, Any, bool]], bulk_min: int
                 ) -> tuple[bytes, memoryview | None]:
    """Pack ``(key, value, is_dead)`` items into one body; return (body, bulk).

    ``bulk`` is the last item's buffer, left out of the body (no copy) when it has at
    least `bulk_min` bytes; otherwise None. Validation is `encode_tensor`'s.

    Raises:
        CodecError: as `encode_tensor`; or no items.
    """
    if len(items) == 1:
        # fast path: one live numpy scalar with a (step, edge, flat tag) key, e.g. a
        # loop's per-iteration value (the same bytes as the general path below)
        key, value, is_dead = items[0]
        scalar = _SCALARS.get(type(value))
        if scalar is not None and not is_dead and type(key) is tuple and len(key) == 3 \
                and type(key[0]) is int and type(key[1]) is str and type(key[2]) is tuple:
            for p in key[2]:
                if type(p) not in _KEY_ATOMS:
                    break
            else:
                try:
                    header = _packb([key, scalar, ()])
                except OverflowError:   # an int beyond 64 bits in the key
                    header = b""
                # (else a key too long for the receiver, or unpackable: refused below)
                if 0 < len(header) <= MAX_HEADER_BYTES:
                    return b"".join((_U32.pack(len(header)), header, value.tobytes())), None
    elif not items:
        raise CodecError("no tensors to pack")
    parts: list[Any] = []
    bulk = None
    last = len(items) - 1
    for i, (key, value, is_dead) in enumerate(items):
        _check_key(key)
        if is_dead:
            header = _pack_header([key])
            parts += (_U32.pack(len(header)), header)
            continue
        scalar = _SCALARS.get(type(value))
        if scalar is not None:  # fast path: a numpy scalar of a supported dtype
            header = _pack_header([key, scalar, ()])
            parts += (_U32.pack(len(header)), header, value.tobytes())
            continue
        arr = value if type(value) is np.ndarray else _as_array(value)
        dtype = _DTYPES.get(arr.dtype.str)
        if dtype is None:
            raise CodecError(
                f"dtype {arr.dtype} cannot be sent: supported dtypes are {_SUPPORTED_NAMES}"
            )
        header = _pack_header([key, dtype.str, arr.shape])
        parts += (_U32.pack(len(header)), header)
        if i == last and arr.nbytes >= bulk_min:
            if not arr.flags.c_contiguous:
                arr = np.ascontiguousarray(arr)
            bulk = arr.reshape(-1).view(np.uint8).data
        else:
            parts.append(arr.tobytes())
    return b"".join(parts), bulk


def unpack_tensors(body: Any, bulk: Any = None) -> list[tuple[Key, Any, bool]]:
    """Decode a `pack_tensors` body (and its bulk frame) into ``(key, value | None,
    is_dead)`` items, all or nothing. Values are read-only views of the message (zero
    copy; a copy in this host's byte order for one sent in the other); 0-d values are
    numpy scalars.

    Raises:
        CodecError: anything is malformed (lengths, msgpack, key, dtype, shape, or bytes
            left over); nothing is returned then.
    """
    view = body if type(body) is memoryview and body.format == "B" and body.ndim == 1 \
        else _as_bytes_view(body)   # (the transport passes a byte view already)
    end = len(view)
    if bulk is not None:
        bulk = _as_bytes_view(bulk)
    out = []
    pos = 0
    while pos < end:
        if end - pos < 4:
            raise CodecError("truncated tensor item")
        (n,) = _U32.unpack_from(view, pos)
        pos += 4
        if n > MAX_HEADER_BYTES or n > end - pos:
            raise CodecError(f"tensor header length {n} is out of bounds")
        try:
            # (raw=False, strict_map_key=True and timestamp=0 are msgpack's defaults)
            header = _unpackb(view[pos:pos + n], use_list=False, ext_hook=_reject_ext)
        except Exception as e:  # msgpack raises assorted types on corrupt input
            raise CodecError(f"tensor header is not valid msgpack: {type(e).__name__}: {e}"
                             ) from e
        pos += n
        if type(header) is not tuple:
            raise CodecError(f"a tensor header is a msgpack array, got {type(header).__name__}")
        if len(header) == 1:
            key = header[0]
            _check_key(key)
            out.append((key, None, True))
            continue
        if len(header) != 3:
            raise CodecError(f"a tensor header is [key, dtype, shape] or [key], got "
                             f"{len(header)} fields")
        key, dtype_str, shape = header
        # _check_key's fast path inline (one call less per item): a (step, edge, flat
        # tag) key passes here; anything else gets the full check
        if type(key) is tuple and len(key) == 3 and type(key[0]) is int \
                and type(key[1]) is str and type(key[2]) is tuple:
            for p in key[2]:
                if type(p) not in _KEY_ATOMS:
                    _check_key(key)
                    break
        else:
            _check_key(key)
        dtype = _DTYPES.get(dtype_str) if type(dtype_str) is str else None
        if dtype is None:
            raise CodecError(
                f"unsupported dtype {dtype_str!r}: supported dtypes are {_SUPPORTED_NAMES}"
            )
        if shape == () and type(shape) is tuple:
            size = dtype.itemsize   # a scalar
            if pos + size <= end and not (pos + size == end and bulk is not None):
                read, scalar_type = _SCALAR_READ[dtype_str]
                x = read(view, pos)[0]
                if x == x:   # (a NaN goes through numpy: its bits stay as sent)
                    pos += size
                    out.append((key, scalar_type(x), False))
                    continue
        else:
            shape = _check_shape(shape, dtype)
            size = math.prod(shape) * dtype.itemsize
        if pos == end and bulk is not None:
            buf, bulk = bulk, None
            if len(buf) != size:
                raise CodecError(f"bulk frame has {len(buf)} bytes but shape {list(shape)} "
                                 f"of {dtype.name} needs {size}")
        else:
            if size > end - pos:
                raise CodecError(f"shape {list(shape)} of {dtype.name} needs {size} bytes; "
                                 f"{end - pos} are left")
            buf = view[pos:pos + size]
            pos += size
        arr = np.frombuffer(buf, dtype=dtype)
        if dtype_str in _FOREIGN_ORDER:
            arr = _native(arr, dtype_str)
        out.append((key, arr[0] if not shape else arr.reshape(shape), False))
    if bulk is not None:
        raise CodecError("a bulk frame that no tensor item claims")
    if not out:
        raise CodecError("a tensor message without tensors")
    return out


def pack_control(msg: dict[str, Any], blob: bytes | None, bulk_min: int
                 ) -> tuple[bytes, memoryview | None]:
    """Pack a control message and its optional blob into (body, bulk); validation is
    `encode_control`'s. A blob of at least `bulk_min` bytes is the separate bulk frame."""
    frames = encode_control(msg, blob)
    packed = frames[0]
    if len(frames) == 1:
        return _CTRL.pack(0, len(packed)) + packed, None
    if len(frames[1]) >= bulk_min:
        return _CTRL.pack(2, len(packed)) + packed, memoryview(frames[1])
    return b"".join((_CTRL.pack(1, len(packed)), packed, frames[1])), None


def unpack_control(body: Any, bulk: Any = None) -> tuple[dict[str, Any], bytes | None]:
    """Decode a `pack_control` body (and bulk frame) into ``(msg, blob | None)``.

    Raises:
        CodecError: as `decode_control`, or the framing is malformed.
    """
    view = _as_bytes_view(body)
    if len(view) < _CTRL.size:
        raise CodecError("truncated control message")
    flag, n = _CTRL.unpack_from(view, 0)
    start = _CTRL.size
    if n > len(view) - start:
        raise CodecError(f"control map length {n} is out of bounds")
    rest = view[start + n:]
    if flag == 0 and not rest and bulk is None:
        frames: list[Any] = [view[start:start + n]]
    elif flag == 1 and bulk is None:
        frames = [view[start:start + n], rest]
    elif flag == 2 and not rest and bulk is not None:
        frames = [view[start:start + n], bulk]
    else:
        raise CodecError("malformed control message framing")
    return decode_control(frames)


def _native(arr: np.ndarray, dtype_str: str) -> np.ndarray:
    """`arr` in this host's byte order: itself, or a swapped copy (bits kept, NaNs too)."""
    native = _FOREIGN_ORDER.get(dtype_str)
    return arr if native is None else arr.byteswap().view(native)


def _as_array(value: Any) -> np.ndarray:
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged lists and the like
        raise CodecError(f"value cannot be converted to an array: {e}") from e


def _pack_header(obj: list) -> bytes:
    try:
        data = msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError(f"cannot pack message: {e}") from e
    if len(data) > MAX_HEADER_BYTES:
        raise CodecError(f"header is {len(data)} bytes; the limit is {MAX_HEADER_BYTES}")
    return data


def _unpack_seq(buf: Any) -> tuple:
    try:
        obj = msgpack.unpackb(buf, use_list=False, raw=False, strict_map_key=True,
                              ext_hook=_reject_ext, timestamp=0)
    except CodecError:
        raise
    except Exception as e:  # msgpack raises assorted types on corrupt input
        raise CodecError(f"tensor header is not valid msgpack: {type(e).__name__}: {e}") from e
    if type(obj) is not tuple:
        raise CodecError(f"a tensor header is a msgpack array, got {type(obj).__name__}")
    return obj


# -- helpers ---------------------------------------------------------------------------------


def _pack(obj: dict[str, Any]) -> bytes:
    try:
        data = msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError(f"cannot pack message: {e}") from e
    if len(data) > MAX_HEADER_BYTES:
        raise CodecError(
            f"header is {len(data)} bytes; the limit is {MAX_HEADER_BYTES} "
            "(send bulky control payloads as the blob frame)"
        )
    return data


def _as_bytes_view(frame: Any) -> memoryview:
    """A flat, byte-indexed view of any buffer-protocol object, without copying."""
    try:
        view = memoryview(frame)
        return view if view.format == "B" and view.ndim == 1 else view.cast("B")
    except (TypeError, ValueError) as e:  # not a buffer, or a strided one
        raise CodecError(f"frame is not a contiguous bytes-like object: {e}") from e


def _reject_ext(code: int, data: bytes) -> Any:
    raise CodecError(f"msgpack extension type {code} is not allowed")


def _unpack_map(frame: Any, what: str) -> dict[str, Any]:
    buf = _as_bytes_view(frame)
    if len(buf) > MAX_HEADER_BYTES:
        raise CodecError(f"{what} is {len(buf)} bytes; the limit is {MAX_HEADER_BYTES}")
    try:
        obj = msgpack.unpackb(
            buf,
            use_list=False,
            raw=False,
            strict_map_key=True,
            ext_hook=_reject_ext,
            timestamp=0,
        )
    except CodecError:
        raise
    except Exception as e:  # msgpack raises assorted types on corrupt input; all mean "bad"
        raise CodecError(f"{what} is not valid msgpack: {type(e).__name__}: {e}") from e
    if not isinstance(obj, dict):
        raise CodecError(f"{what} must be a msgpack map, got {type(obj).__name__}")
    for k in obj:
        if not isinstance(k, str):
            raise CodecError(f"{what} keys must be strings, got {k!r}")
    return obj


_KEY_ATOMS = (int, str, bytes)


def _check_key(key: Any, depth: int = 0) -> None:
    # The key must hash and compare equal after a round trip, so lists (which come back as
    # tuples), floats (NaN != NaN) and None are refused on both sides.
    if type(key) is tuple and len(key) == 3 and type(key[0]) is int \
            and type(key[1]) is str and type(key[2]) is tuple:
        # fast path: a rendezvous key (step, edge, flat tag)
        for p in key[2]:
            if type(p) not in _KEY_ATOMS:
                break
        else:
            return
    if type(key) is not tuple or depth > _MAX_DEPTH:
        raise CodecError(f"key must be a tuple of ints, strings or bytes, got {key!r:.200}")
    for part in key:
        if isinstance(part, tuple):
            _check_key(part, depth + 1)
        elif not isinstance(part, (int, str, bytes)):
            raise CodecError(
                f"key must be a tuple of ints, strings or bytes; {part!r:.100} is a "
                f"{type(part).__name__}"
            )


def _check_shape(shape: Any, dtype: np.dtype) -> tuple[int, ...]:
    if shape == () and type(shape) is tuple:
        return shape  # a scalar
    if type(shape) is not tuple or len(shape) > MAX_NDIM:
        raise CodecError(
            f"shape must be a list of at most {MAX_NDIM} non-negative ints, got {shape!r:.200}"
        )
    for d in shape:
        if type(d) is not int or d < 0:  # type() is int: refuses bools too
            raise CodecError(f"shape must be a list of non-negative ints, got {shape!r:.200}")
    # max(d, 1): an empty array with a huge other dimension is still refused, because numpy
    # cannot represent it either.
    if math.prod(max(d, 1) for d in shape) * dtype.itemsize > MAX_TENSOR_BYTES:
        raise CodecError(f"shape {list(shape)} is too large (limit {MAX_TENSOR_BYTES} bytes)")
    return shape


def _check_plain(obj: Any, depth: int) -> None:
    """Allow only values that msgpack round-trips: the data model of a control message."""
    if depth > _MAX_DEPTH:
        raise CodecError(f"control message nests deeper than {_MAX_DEPTH} levels")
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return
    if isinstance(obj, (tuple, list)):
        for item in obj:
            _check_plain(item, depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str):
                raise CodecError(f"control message keys must be strings, got {k!r:.100}")
            _check_plain(v, depth + 1)
    else:
        raise CodecError(
            f"control message value {obj!r:.100} of type {type(obj).__name__} is not "
            "msgpack data; send it in the blob frame"
        )
