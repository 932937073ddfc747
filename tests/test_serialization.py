"""horovodlike.common.serialization: state trees round-trip, and hostile bytes (as a
peer could send in a sharded optimizer's state exchange) are refused with a ValueError
naming what is wrong, never decoded past the bytes that arrived.

Pure Python on numpy arrays (the format and its checks are framework-free); one case
round-trips torch tensors through the sharded optimizer's codec.
"""
import json
import struct

import numpy as np
import pytest

from horovodlike.common import serialization as S


class NumpyCodec(S.Codec):
    @staticmethod
    def is_tensor(value):
        return isinstance(value, np.ndarray)

    @staticmethod
    def encode(a):
        a = np.ascontiguousarray(a)
        return a.dtype.name, list(a.shape), a.reshape(-1).view(np.uint8)

    @staticmethod
    def decode(dtype, shape, data):
        return np.frombuffer(bytes(data), dtype=dtype).reshape(shape)


def blob(meta, data=b"", m=None, d=None):
    """A blob with `meta` (an object, dumped as JSON, or raw bytes) and the lengths in
    the head (those of meta and data unless given)."""
    raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
    return struct.pack("<qq", len(raw) if m is None else m,
                       len(data) if d is None else d) + raw + data


def test_round_trip():
    tree = {"a": [np.arange(5, dtype=np.float32), (1, "x", None, 2.5, True)],
            3: {"b": np.zeros((0, 3)), "c": np.array([True, False])},
            (1, 2): np.ones((2, 2), dtype=np.complex64), "s": np.int64(7).item()}
    back = S.loads(S.dumps(tree, NumpyCodec), NumpyCodec)
    assert back.keys() == tree.keys()
    np.testing.assert_array_equal(back["a"][0], tree["a"][0])
    assert back["a"][1] == tree["a"][1] and isinstance(back["a"][1], tuple)
    assert back[3]["b"].shape == (0, 3)
    np.testing.assert_array_equal(back[3]["c"], tree[3]["c"])
    np.testing.assert_array_equal(back[(1, 2)], tree[(1, 2)])


def test_round_trip_torch():
    torch = pytest.importorskip("torch")
    from horovodlike.torch.sharded import state
    tree = {"exp_avg": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3),
            "step": torch.tensor(3.0), "e": torch.zeros(0, dtype=torch.int64),
            "flags": torch.tensor([True, False])}
    back = state._unblob(state._blob(tree))
    for k, v in tree.items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v), k


def test_refuses_what_it_cannot_save():
    with pytest.raises(TypeError, match="cannot save a object"):
        S.dumps({"x": object()}, NumpyCodec)
    with pytest.raises(TypeError, match="cannot save a uint64 tensor"):
        S.dumps([np.zeros(2, dtype=np.uint64)], NumpyCodec)


def tensor(spec, data=b""):
    return blob({"t": spec}, data)


HOSTILE = [
    ("truncated head", b"\x01\x02", "truncated optimizer state"),
    ("lengths longer than the blob", blob([1], m=100), "do not match"),
    ("negative length", blob([1], d=-1), "do not match"),
    ("description over the limit", struct.pack("<qq", S.MAX_META_BYTES + 1, 0)
     + b" " * (S.MAX_META_BYTES + 1), "exceeds the limit"),
    ("not JSON", blob(b"{nope"), "Expecting"),
    ("not UTF-8", blob(b"\xff\xfe"), "utf-8"),
    ("nested too deeply", blob(json.loads("[" * 40 + "]" * 40)), "nested too deeply"),
    ("nested past the JSON parser", blob(b"[" * 200000 + b"]" * 200000),
     "nested too deeply"),
    ("unknown dtype", tensor(["object", [1], 0, 8], b"\0" * 8), "bad tensor"),
    ("negative dimension", tensor(["float32", [-1], 0, 4], b"\0" * 4), "bad tensor"),
    ("length not the shape's", tensor(["float32", [2], 0, 4], b"\0" * 8), "bad tensor"),
    ("bytes past the data", tensor(["float32", [2], 4, 8], b"\0" * 8), "bad tensor"),
    ("negative offset", tensor(["float32", [1], -4, 4], b"\0" * 8), "bad tensor"),
    ("offset not an int", tensor(["float32", [1], "0", 4], b"\0" * 4), "bad tensor"),
    ("short tensor entry", tensor(["float32", [1]], b"\0" * 4), "bad tensor"),
    ("dict entry not a pair", blob({"d": [[1, 2, 3]]}), "bad dict entry"),
    ("dict key a list", blob({"d": [[[1], 2]]}), "bad dict key"),
    ("unknown entry", blob({"q": 1}), "bad entry"),
]


@pytest.mark.parametrize("what,data,needle", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_bytes(what, data, needle):
    with pytest.raises(ValueError, match=needle):
        S.loads(data, NumpyCodec)
