"""codec: tensor and control messages round-trip, decode without copying, and reject bad bytes."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dcf.actors.codec import (
    MAX_HEADER_BYTES,
    CodecError,
    decode_control,
    decode_tensor,
    encode_control,
    encode_tensor,
)

DTYPES = [np.bool_, np.float16, np.float32, np.float64, np.int32, np.int64]
SHAPES = [(), (0,), (1,), (5,), (2, 3), (3, 0, 2), (2, 3, 4)]
KEY = (7, "while/Send", b"\x01\x02", 3)


def _wire(frames):
    """What a receiver gets: plain bytes per frame."""
    return [bytes(f) for f in frames]


def _header(frames) -> dict:
    return msgpack.unpackb(frames[0], use_list=False)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_tensor_roundtrip_every_dtype_and_shape(dtype, shape):
    rng = np.random.default_rng(0)
    value = (rng.standard_normal(shape) * 100).astype(dtype)
    key, out, is_dead = decode_tensor(_wire(encode_tensor(KEY, value)))
    assert key == KEY and isinstance(key, tuple) and hash(key) == hash(KEY)
    assert not is_dead
    assert np.asarray(out).dtype == np.dtype(dtype)
    assert np.shape(out) == shape
    np.testing.assert_array_equal(out, value)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_scalar_and_zero_d_decode_to_numpy_scalar(dtype):
    for value in (np.dtype(dtype).type(1), np.array(1, dtype=dtype)):
        _, out, _ = decode_tensor(_wire(encode_tensor(KEY, value)))
        assert isinstance(out, np.generic) and out.dtype == np.dtype(dtype)
        assert out == value


@pytest.mark.timeout(30)
def test_python_scalars_are_sent_as_their_numpy_types():
    assert decode_tensor(_wire(encode_tensor(KEY, 2.5)))[1].dtype == np.float64
    assert decode_tensor(_wire(encode_tensor(KEY, True)))[1].dtype == np.bool_


@pytest.mark.timeout(30)
def test_non_contiguous_array_is_sent_in_c_order():
    value = np.arange(12, dtype=np.float32).reshape(3, 4).T
    _, out, _ = decode_tensor(_wire(encode_tensor(KEY, value)))
    np.testing.assert_array_equal(out, value)


@pytest.mark.timeout(30)
def test_dead_token_is_one_header_frame():
    frames = encode_tensor(KEY, None, is_dead=True)
    assert len(frames) == 1 and _header(frames) == {"k": KEY, "dead": True}
    assert decode_tensor(_wire(frames)) == (KEY, None, True)


@pytest.mark.timeout(30)
def test_nested_tuple_key_roundtrips():
    key = (1, ("frame", 2), b"x")
    assert decode_tensor(_wire(encode_tensor(key, np.int32(1))))[0] == key


@pytest.mark.timeout(30)
def test_encode_does_not_copy_contiguous_array():
    value = np.arange(1000, dtype=np.float64)
    buf = encode_tensor(KEY, value)[1]
    assert isinstance(buf, memoryview) and len(buf) == value.nbytes
    assert np.shares_memory(np.frombuffer(buf, dtype=np.float64), value)


@pytest.mark.timeout(30)
def test_decode_shares_the_received_buffer():
    received = bytearray(encode_tensor(KEY, np.arange(6, dtype=np.int64).reshape(2, 3))[1])
    header = encode_tensor(KEY, np.zeros((2, 3), np.int64))[0]
    _, out, _ = decode_tensor([header, received])
    assert np.shares_memory(out, np.frombuffer(received, dtype=np.uint8))
    received[0] = 42  # the decoded array is a view: it sees writes to the frame
    assert out[0, 0] == 42


@pytest.mark.timeout(30)
def test_decoded_array_from_bytes_is_read_only():
    _, out, _ = decode_tensor(_wire(encode_tensor(KEY, np.ones(3, np.float32))))
    assert not out.flags.writeable


# -- rejection cases, each with its message pinned ------------------------------------------


def _tensor_frames(header: dict, buf: bytes = b"\0" * 8) -> list[bytes]:
    return [msgpack.packb(header), buf]


GOOD = {"k": (1, "e"), "dtype": "<f4", "shape": [2]}


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "frames, match",
    [
        ([], r"1 or 2 frames, got 0"),
        ([b"a", b"b", b"c"], r"1 or 2 frames, got 3"),
        ([b"\xc1"], r"not valid msgpack"),
        ([msgpack.packb([1, 2])], r"must be a msgpack map, got tuple"),
        ([msgpack.packb({1: 2})], r"not valid msgpack"),  # non-string map key
        ([msgpack.packb(GOOD) + b"\x00", b"\0" * 8], r"not valid msgpack: ExtraData"),
        ([msgpack.packb({"k": [1] * MAX_HEADER_BYTES})], r"is \d+ bytes; the limit is 65536"),
        (_tensor_frames({"dtype": "<f4", "shape": [2]}), r"no key 'k'"),
        (_tensor_frames({**GOOD, "k": [1.5]}), r"1.5 is a float"),
        (_tensor_frames({**GOOD, "k": 3}), r"key must be a tuple"),
        (_tensor_frames({**GOOD, "k": ({"a": 1},)}), r"is a dict"),
        (_tensor_frames({**GOOD, "extra": 1}), r"fields are \['dtype', 'extra', 'k', 'shape'\]"),
        (_tensor_frames({**GOOD, "dtype": "|O"}), r"unsupported dtype '\|O'"),
        (_tensor_frames({**GOOD, "dtype": "<u1"}), r"unsupported dtype '<u1'"),
        (_tensor_frames({**GOOD, "dtype": "<c16"}), r"unsupported dtype"),
        (_tensor_frames({**GOOD, "dtype": 4}), r"unsupported dtype 4"),
        (_tensor_frames({**GOOD, "shape": [-1]}), r"non-negative ints, got \(-1,\)"),
        (_tensor_frames({**GOOD, "shape": [True]}), r"non-negative ints"),
        (_tensor_frames({**GOOD, "shape": [2.0]}), r"non-negative ints"),
        (_tensor_frames({**GOOD, "shape": 2}), r"at most 32 non-negative ints"),
        (_tensor_frames({**GOOD, "shape": [1] * 33}), r"at most 32"),
        (_tensor_frames({**GOOD, "shape": [1 << 62, 1 << 62]}), r"too large"),
        (_tensor_frames({**GOOD, "shape": [0, 1 << 62]}, b""), r"too large"),
        (
            _tensor_frames({**GOOD, "shape": [3]}),
            r"buffer has 8 bytes but shape \[3\] of float32 needs 12",
        ),
        ([msgpack.packb(GOOD)], r"a live tensor has 2 frames"),
        ([msgpack.packb({"k": (1,), "dead": True}), b""], r"a dead token has 1 frame"),
        ([msgpack.packb({"k": (1,), "dead": 1})], r"malformed dead-token header"),
        ([msgpack.packb({"k": (1,), "dead": True, "dtype": "<f4"})], r"malformed dead-token"),
        ([msgpack.packb(msgpack.ExtType(3, b"x"))], r"extension type 3 is not allowed"),
        ([msgpack.packb([[[[1]]]] * 1)[:0] + b"\x91" * 2000], r"not valid msgpack"),
        ([12345, b""], r"not a contiguous bytes-like object"),
        (["text", b""], r"not a contiguous bytes-like object"),
    ],
)
def test_decode_tensor_rejects(frames, match):
    with pytest.raises(CodecError, match=match):
        decode_tensor(frames)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "key, value, match",
    [
        ([1, 2], np.float32(1), r"key must be a tuple"),
        ((1.5,), np.float32(1), r"1.5 is a float"),
        ((None,), np.float32(1), r"None is a NoneType"),
        ((1 << 70,), np.float32(1), r"cannot pack message"),
        ((1,), np.array(["a"]), r"dtype <U1 cannot be sent"),
        ((1,), np.array([object()]), r"dtype object cannot be sent"),
        ((1,), np.uint8(3), r"dtype uint8 cannot be sent: supported dtypes are bool, float16"),
        ((1,), [[1], [1, 2]], r"cannot be converted to an array"),
        (("x" * MAX_HEADER_BYTES,), np.float32(1), r"limit is 65536"),
    ],
)
def test_encode_tensor_rejects(key, value, match):
    with pytest.raises(CodecError, match=match):
        encode_tensor(key, value)


@pytest.mark.timeout(30)
def test_codec_error_is_a_value_error():
    assert issubclass(CodecError, ValueError)


# -- control messages -----------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_control_roundtrip_with_and_without_blob():
    msg = {"type": "run", "step": 3, "fetches": [("a", 0)], "opts": {"trace": True, "t": 1.5}}
    out, blob = decode_control(_wire(encode_control(msg)))
    assert out == {
        "type": "run",
        "step": 3,
        "fetches": (("a", 0),),
        "opts": {"trace": True, "t": 1.5},
    }
    assert blob is None
    out, blob = decode_control(_wire(encode_control({"type": "fn"}, blob=b"\x80\x05pickle")))
    assert out == {"type": "fn"} and blob == b"\x80\x05pickle"


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "frames, match",
    [
        ([], r"1 or 2 frames, got 0"),
        ([b"\x80", b"", b""], r"1 or 2 frames, got 3"),
        ([msgpack.packb([1])], r"must be a msgpack map"),
        ([msgpack.packb({"a": {b"k": 1}})], r"keys must be strings, got b'k'"),
        ([msgpack.packb({"a": msgpack.ExtType(1, b"")})], r"extension type 1"),
        ([msgpack.packb({"a": msgpack.Timestamp(1)})], r"type Timestamp is not msgpack data"),
        ([msgpack.packb({"a": "x" * MAX_HEADER_BYTES})], r"the limit is 65536"),
        ([msgpack.packb({"a": 1}), 7], r"not a contiguous bytes-like object"),
    ],
)
def test_decode_control_rejects(frames, match):
    with pytest.raises(CodecError, match=match):
        decode_control(frames)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "msg, blob, match",
    [
        ([1], None, r"a control message is a dict, got list"),
        ({1: 2}, None, r"keys must be strings, got 1"),
        ({"a": np.zeros(2)}, None, r"is not msgpack data; send it in the blob frame"),
        ({"a": object()}, None, r"type object is not msgpack data"),
        ({"a": "x" * MAX_HEADER_BYTES}, None, r"send bulky control payloads as the blob frame"),
        ({"a": 1}, "text", r"blob must be bytes-like, got str"),
    ],
)
def test_encode_control_rejects(msg, blob, match):
    with pytest.raises(CodecError, match=match):
        encode_control(msg, blob)


# -- fuzz: whatever the bytes, a valid decode or CodecError ---------------------------------

_valid_headers = st.builds(
    lambda k, dt, shape: msgpack.packb({"k": k, "dtype": dt, "shape": shape}),
    st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=3), st.binary(max_size=3)), max_size=3),
    st.sampled_from(["<f4", "<f8", "<f2", "|b1", "<i4", "<i8", ">f4", "|O", "<u1", "V8", ""]),
    st.lists(st.integers(-2, 4), max_size=3),
)
_msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)


def _flip(data: bytes, pos: int, byte: int) -> bytes:
    pos %= len(data)
    return data[:pos] + bytes([byte]) + data[pos + 1 :]


_frame = st.one_of(
    st.binary(max_size=64),
    _valid_headers,
    st.builds(_flip, _valid_headers, st.integers(0, 64), st.integers(0, 255)),
    _msgpack_values.map(msgpack.packb),
    st.binary(max_size=16).map(lambda b: msgpack.packb({"k": (1,), "dead": True}) + b),
)


@pytest.mark.timeout(30)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_frame, max_size=4))
def test_fuzz_decode_only_raises_codec_error(frames):
    for decode in (decode_tensor, decode_control):
        try:
            result = decode(frames)
        except CodecError:
            continue
        assert isinstance(result, tuple) and len(result) in (2, 3)
        if decode is decode_tensor:
            key, value, is_dead = result
            hash(key)
            assert (value is None) == is_dead
            if value is not None:
                assert np.asarray(value).dtype.kind in "bfi"


@pytest.mark.timeout(30)
@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(DTYPES),
    st.lists(st.integers(0, 4), max_size=3),
    st.binary(max_size=40),
)
def test_fuzz_well_formed_header_with_random_buffer(dtype, shape, buf):
    header = msgpack.packb({"k": (0,), "dtype": np.dtype(dtype).str, "shape": shape})
    try:
        _, value, _ = decode_tensor([header, buf])
    except CodecError as e:
        assert "buffer has" in str(e)
    else:
        assert np.asarray(value).nbytes == len(buf)


# -- packed bodies (the transport's one-frame messages) -----------------------------------

from dcf.actors.codec import pack_control, pack_tensors, unpack_control, unpack_tensors


@pytest.mark.timeout(30)
def test_packed_tensors_round_trip_with_dead_items_and_a_bulk_frame():
    rkey = (12345678901, "_send/while/add:0->/job:worker/task:1/cpu:0", ("while", 7))
    big = np.arange(100_000, dtype=np.float64)
    items = [(rkey, np.float32(1.5), False), ((1, "d"), None, True),
             (KEY, np.arange(6, dtype=np.int32).reshape(2, 3), False),
             ((2, "s"), np.bool_(True), False), ((3, "b"), big, False)]
    body, bulk = pack_tensors(items, 64 * 1024)
    assert bulk is not None and len(bulk) == big.nbytes   # the last big buffer: no copy
    got = unpack_tensors(body, bytes(bulk))
    assert [k for k, _, _ in got] == [k for k, _, _ in items]
    assert [d for _, _, d in got] == [False, True, False, False, False]
    assert got[0][1] == np.float32(1.5) and type(got[0][1]) is np.float32
    assert got[1][1] is None
    np.testing.assert_array_equal(got[2][1], items[2][1])
    assert got[3][1] == np.bool_(True) and type(got[3][1]) is np.bool_
    np.testing.assert_array_equal(got[4][1], big)
    small_body, no_bulk = pack_tensors(items[:4], 64 * 1024)
    assert no_bulk is None and len(unpack_tensors(small_body)) == 4


@pytest.mark.timeout(60)
def test_packed_tensors_reject_every_truncation_and_bad_framing():
    items = [((1, "e", (3,)), np.float32(2), False), ((1, "f", ()), np.ones(3), False)]
    body, _ = pack_tensors(items, 1 << 20)
    boundary = len(pack_tensors(items[:1], 1 << 20)[0])   # items are self-delimiting
    for cut in range(1, len(body)):
        if cut == boundary:
            assert len(unpack_tensors(body[:cut])) == 1
            continue
        with pytest.raises(CodecError):
            unpack_tensors(body[:cut])
    with pytest.raises(CodecError):
        unpack_tensors(body + b"\x00")                # bytes left over
    with pytest.raises(CodecError):
        unpack_tensors(body, b"\x00" * 8)             # a bulk frame nobody claims
    with pytest.raises(CodecError):
        unpack_tensors(b"")                           # no tensors
    header = msgpack.packb([(1, "x"), "|O", ()])      # object dtype
    with pytest.raises(CodecError, match="unsupported dtype"):
        unpack_tensors(len(header).to_bytes(4, "little") + header + b"\x00" * 8)
    header = msgpack.packb([[1.5], "<f4", ()])        # a float in the key
    with pytest.raises(CodecError):
        unpack_tensors(len(header).to_bytes(4, "little") + header + b"\x00" * 4)
    with pytest.raises(CodecError, match="cannot be sent"):
        pack_tensors([((1,), np.uint8(1), False)], 1 << 20)


@pytest.mark.timeout(30)
def test_packed_control_round_trips_with_and_without_blob():
    for blob, bulk_min in ((None, 10), (b"", 10), (b"abc", 10), (b"x" * 100, 10)):
        body, bulk = pack_control({"type": "run", "step": 3}, blob, bulk_min)
        assert (bulk is not None) == (blob is not None and len(blob) >= bulk_min)
        assert unpack_control(body, bulk) == ({"type": "run", "step": 3}, blob)
    body, bulk = pack_control({"type": "x"}, b"y" * 50, 10)
    with pytest.raises(CodecError):
        unpack_control(body)                          # flag says bulk, none came
    with pytest.raises(CodecError):
        unpack_control(body[:3])


@pytest.mark.parametrize("order", ["<", ">"])
def test_packed_scalars_decode_bit_for_bit_in_either_byte_order(order):
    # scalars are read without an intermediate array; values, types and bits (NaN
    # payloads too) must be what numpy reads from the same bytes
    nan32 = np.frombuffer(b"\x01\x00\xa0\x7f", "<f4")[0]   # a signalling NaN, payload 1
    values = [np.float16(-1.5), np.float16(6e-8), np.float32(3.25), np.float32(1e-45),
              np.float32("inf"), nan32, np.float64(-0.0), np.float64("nan"),
              np.int32(-2**31), np.int64(2**62), np.bool_(True), np.bool_(False)]
    items = []
    for k, v in enumerate(values):
        arr = np.array(v)
        items.append(((k, "e", ()), arr.astype(arr.dtype.newbyteorder(order)), False))
    body, bulk = pack_tensors(items, 1 << 20)
    out = unpack_tensors(body, bulk)
    for (key, got, dead), v in zip(out, values):
        assert not dead and type(got) is type(v) and got.dtype == v.dtype, (key, got)
        assert np.array(got).tobytes() == np.array(v).tobytes(), (key, got, v)


def test_a_truncated_scalar_item_is_refused():
    body, _ = pack_tensors([((1, "e", ()), np.float64(2.0), False)], 1 << 20)
    for cut in range(1, 8):
        with pytest.raises(CodecError):
            unpack_tensors(body[:-cut])


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_one_packed_scalar_is_its_header_and_its_bytes(dtype):
    # the one-scalar fast path writes what the format says, byte for byte
    key = (3, "while/Add_1:0->/job:worker/task:0/cpu:0", ("while", 41))
    v = np.array(1, dtype=dtype)[()]
    body, bulk = pack_tensors([(key, v, False)], 1 << 20)
    header = msgpack.packb([[3, key[1], ["while", 41]], np.dtype(dtype).str, []])
    assert bulk is None
    assert body == len(header).to_bytes(4, "little") + header + v.tobytes()
    (k, got, dead), = unpack_tensors(body)
    assert k == key and not dead and type(got) is type(v) and got == v


def test_one_packed_scalar_with_a_bad_or_nested_key():
    with pytest.raises(CodecError):   # a float in the tag: not a key
        pack_tensors([((1, "e", (1.5,)), np.float32(1), False)], 1 << 20)
    with pytest.raises(CodecError):
        pack_tensors([((1, "e", [2]), np.float32(1), False)], 1 << 20)
    nested = (1, "e", ("f", (2, "g")))   # nested tuples are keys too
    (k, got, _), = unpack_tensors(pack_tensors([(nested, np.int64(5), False)], 1 << 20)[0])
    assert k == nested and got == 5
    for bad in ([1, "e", [1.5]], [1, "e", [None]], [1, "e", [[1.5]]]):
        header = msgpack.packb([bad, "<f4", []])
        with pytest.raises(CodecError):
            unpack_tensors(len(header).to_bytes(4, "little") + header + b"\x00" * 4)


def test_one_packed_nan_scalar_keeps_its_bits():
    nan32 = np.frombuffer(b"\x01\x00\xa0\x7f", "<f4")[0]   # a signalling NaN, payload 1
    for v in (nan32, np.float64("nan"), np.float16("nan")):
        (_, got, _), = unpack_tensors(pack_tensors([((1, "e", (0,)), v, False)], 1 << 20)[0])
        assert type(got) is type(v) and got.tobytes() == v.tobytes()
