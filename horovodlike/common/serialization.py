"""A tree of state (dicts, lists, tuples, JSON scalars and tensors) as bytes, and back,
for data that crosses ranks and must not be unpickled: peers' data is not code.

Framework-free: a binding passes a codec that turns its tensors into (dtype name, shape,
raw bytes) and back; the format and every check on what arrives live here. (Python
objects that may be code travel with objects.py's pickles instead, only between the
ranks of one job.)

Format: a 16-byte head of two little-endian int64 (m, d), m bytes of UTF-8 JSON, d bytes
of tensor data. In the JSON a tensor is {"t": [dtype, shape, offset, nbytes]} (its bytes
at data[offset:offset + nbytes]), a dict {"d": [[key, value], ...]}, a tuple
{"u": [...]}, a list a JSON list, anything else a JSON scalar.

Cost: every tensor's bytes are copied twice on the way out (into the data part, then
into the blob) and once on the way in; the JSON is proportional to the number of
entries, not their size.
"""
import json
import math
import struct

# The dtypes a tree may carry, by name, with their sizes in bytes.
DTYPE_SIZES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "complex64": 8,
               "complex128": 16, "uint8": 1, "int8": 1, "int16": 2, "int32": 4,
               "int64": 8, "bool": 1}
MAX_META_BYTES = 64 << 20       # the most JSON a peer may send in one blob
MAX_DEPTH = 32                  # nesting allowed in that JSON
_HEAD = struct.Struct("<qq")


class Codec:
    """What a binding supplies: its tensor type, and its tensors as bytes and back."""

    @staticmethod
    def is_tensor(value):
        raise NotImplementedError

    @staticmethod
    def encode(tensor):
        """(dtype name, shape as a list of ints, the bytes as a buffer)."""
        raise NotImplementedError

    @staticmethod
    def decode(dtype, shape, data):
        """A new tensor (owning its memory) from `data`, a memoryview of its bytes."""
        raise NotImplementedError


def dumps(tree, codec):
    """The tree as one bytes object (head, JSON, tensor data)."""
    chunks, size = [], 0

    def enc(v):
        nonlocal size
        if codec.is_tensor(v):
            dtype, shape, raw = codec.encode(v)
            if dtype not in DTYPE_SIZES:
                raise TypeError(f"cannot save a {dtype} tensor in optimizer state")
            raw = memoryview(raw).cast("B")
            chunks.append(raw)
            size += raw.nbytes
            return {"t": [dtype, list(shape), size - raw.nbytes, raw.nbytes]}
        if isinstance(v, dict):
            return {"d": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, tuple):
            return {"u": [enc(x) for x in v]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        raise TypeError(f"cannot save a {type(v).__name__} in optimizer state")

    meta = json.dumps(enc(tree)).encode()
    return b"".join([_HEAD.pack(len(meta), size), meta, *chunks])


def loads(blob, codec):
    """Inverse of dumps, checking every length, offset, dtype and depth against what
    arrived (a ValueError names what is wrong). `blob`: any bytes-like object."""
    blob = memoryview(blob).cast("B")
    if blob.nbytes < _HEAD.size:
        raise ValueError("truncated optimizer state")
    m, d = _HEAD.unpack(blob[:_HEAD.size])
    if m < 0 or d < 0 or _HEAD.size + m + d != blob.nbytes:
        raise ValueError(f"optimizer state lengths {m} + {d} do not match the "
                         f"{blob.nbytes - _HEAD.size} bytes received")
    if m > MAX_META_BYTES:
        raise ValueError(f"optimizer state description of {m} bytes exceeds the limit of "
                         f"{MAX_META_BYTES}")
    data = blob[_HEAD.size + m:]
    try:
        tree = json.loads(bytes(blob[_HEAD.size:_HEAD.size + m]).decode())
    except RecursionError:
        raise ValueError("optimizer state nested too deeply") from None

    def dec(v, depth):
        if depth > MAX_DEPTH:
            raise ValueError("optimizer state nested too deeply")
        if isinstance(v, list):
            return [dec(x, depth + 1) for x in v]
        if not isinstance(v, dict):
            return v
        if "t" in v:
            return _tensor(v["t"], data, codec)
        if "u" in v and isinstance(v["u"], list):
            return tuple(dec(x, depth + 1) for x in v["u"])
        if "d" in v and isinstance(v["d"], list):
            out = {}
            for pair in v["d"]:
                if not (isinstance(pair, list) and len(pair) == 2):
                    raise ValueError(f"bad dict entry in optimizer state: {pair!r:.80}")
                key = dec(pair[0], depth + 1)
                if isinstance(key, (list, dict)):
                    raise ValueError(f"bad dict key in optimizer state: {key!r:.80}")
                out[key] = dec(pair[1], depth + 1)
            return out
        raise ValueError(f"bad entry in optimizer state: {v!r:.80}")

    return dec(tree, 0)


def _is_count(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _tensor(spec, data, codec):
    ok = isinstance(spec, list) and len(spec) == 4
    if ok:
        dtype, shape, off, n = spec
        ok = dtype in DTYPE_SIZES and isinstance(shape, list) and \
            all(_is_count(s) for s in shape) and _is_count(off) and _is_count(n)
    if not ok:
        raise ValueError(f"bad tensor in optimizer state: {spec!r:.120}")
    if n != math.prod(shape) * DTYPE_SIZES[dtype] or off + n > data.nbytes:
        raise ValueError(f"bad tensor in optimizer state: {spec!r} with {data.nbytes} "
                         f"bytes received")
    return codec.decode(dtype, shape, data[off:off + n])
