"""ShardedDistributedOptimizer's state dicts (a mixin of the optimizer): this rank's
shard with the layout it was cut by (state_dict), the whole state gathered from a
partition group into a plain torch optimizer's (consolidated_state_dict), loading any of
these into any layout (load_state_dict: a shard saved with another shard size or world
size is resharded through the consolidated form), and broadcast_optimizer_state.

State crosses ranks as blobs of horovodlike.common.serialization (never pickled); a
consolidation gathers one blob per member of the partition group at the root (an
alltoall in which only the root receives), a broadcast sends one blob per replica group.
"""
import torch

from horovodlike.common import basics, serialization

from .. import _collectives as C
from .layout import dtype_name

FORMAT = "horovodlike.ShardedDistributedOptimizer/1"


# ------------------------------------------------------------------ state transport

class _TorchCodec(serialization.Codec):
    """torch tensors for serialization: their bytes, and new CPU tensors from bytes."""
    DTYPES = {name: getattr(torch, name) for name in serialization.DTYPE_SIZES}

    @staticmethod
    def is_tensor(value):
        return isinstance(value, torch.Tensor)

    @staticmethod
    def encode(tensor):
        t = tensor.detach().cpu().contiguous().reshape(-1)
        raw = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        return dtype_name(t.dtype), list(tensor.shape), raw.numpy()

    @classmethod
    def decode(cls, dtype, shape, data):
        if not data.nbytes:
            return torch.empty(shape, dtype=cls.DTYPES[dtype])
        raw = torch.frombuffer(data, dtype=torch.uint8).clone()
        return raw.view(cls.DTYPES[dtype]).reshape(shape)


def _blob(tree):
    """`tree` as a uint8 tensor, for the engine's collectives."""
    return torch.frombuffer(bytearray(serialization.dumps(tree, _TorchCodec)),
                            dtype=torch.uint8)


def _unblob(blob):
    return serialization.loads(blob.numpy(), _TorchCodec)


def _gather_blobs(blob, root, ps, index, name):
    """Every member's blob at the set member `root` (an index into the set), by
    alltoall; [blob per member] there, None elsewhere."""
    n = ps.size()
    splits = [blob.numel() if j == root else 0 for j in range(n)]
    out, received = C.synchronize(C.alltoall_async(blob, splits=splits, name=name,
                                                   process_set=ps))
    if index != root:
        return None
    return list(torch.split(out, received.tolist()))


def _broadcast_blob(blob, root_rank, ps, name):
    size = torch.tensor([blob.numel() if blob is not None else 0], dtype=torch.int64)
    C.synchronize(C.broadcast_async_(size, root_rank, name=f"{name}.sz", process_set=ps))
    buf = blob if blob is not None else torch.empty(int(size[0]), dtype=torch.uint8)
    C.synchronize(C.broadcast_async_(buf, root_rank, name=f"{name}.t", process_set=ps))
    return buf


class StateDicts:
    """Methods of ShardedDistributedOptimizer that save, load and move its state. They
    use the optimizer's layout (_params, _pieces), groups (shard_size, shard_rank,
    partition_index, the process sets), the wrapped optimizer (_inner) and the pass
    state (load_state_dict refuses to run while gradients are being reduced)."""

    def _layout(self):
        return {"shard_size": self.shard_size, "set_size": self.replicas * self.shard_size,
                "shard_rank": self.shard_rank, "stage": self.stage,
                "param_shapes": [list(p.shape) for p in self._params],
                "param_names": [self._name(p) for p in self._params],
                "pieces": self._pieces}

    def _groups_out(self):
        out, j = [], 0
        for g in self.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = list(range(j, j + len(g["params"])))
            j += len(g["params"])
            out.append(d)
        return out

    def state_dict(self):
        """This rank's shard of the optimizer state, with the layout it was cut by:
        load it back into the same layout, or pass every member's (of one partition
        group) to load_state_dict() to reshard."""
        inner = self._inner.state_dict()
        return {"format": FORMAT, "layout": self._layout(),
                "state": {i: s for i, s in inner["state"].items() if i < len(self._pieces)},
                "param_groups": self._groups_out()}

    def consolidated_state_dict(self, root_rank=0):
        """A plain torch optimizer state dict (what the wrapped optimizer's state_dict()
        would be, loadable into it) on root_rank (a global rank), gathered from its
        partition group; None on the other ranks. Every rank of the set calls it."""
        ps = self.process_set
        base = list(ps.ranks) if ps.process_set_id != 0 else list(range(basics.size()))
        if root_rank not in base:
            raise ValueError(f"consolidated_state_dict: root rank {root_rank} is not a "
                             f"member of {ps!r}")
        root_partition = base.index(root_rank) // self.shard_size
        if root_partition != self.partition_index:
            return None
        mine = self.state_dict()
        if self.partition_set is None:
            shards = [mine]
        else:
            root = base.index(root_rank) % self.shard_size
            blobs = _gather_blobs(_blob({"layout": mine["layout"], "state": mine["state"]}),
                                  root, self.partition_set, self.shard_rank,
                                  f"{self._uid}.consolidate")
            if blobs is None:
                return None
            shards = [_unblob(x) for x in blobs]
        return {"state": _consolidate(shards, self._params),
                "param_groups": self._groups_out()}

    def load_state_dict(self, state_dict):
        """Load a consolidated (plain torch) state dict, this layout's own state_dict(),
        or a list of the state_dict()s of every member of one partition group saved
        with any shard size or world size (resharded here)."""
        if self._passes or self._launched or self._in_pass:
            raise AssertionError("load_state_dict() while gradients are being reduced; "
                                 "call it before backward or after step()")
        if isinstance(state_dict, (list, tuple)):
            for sd in state_dict:
                _check_sharded(sd)
            groups = state_dict[0]["param_groups"] if state_dict else None
            state_dict = {"state": _consolidate(list(state_dict), self._params),
                          "param_groups": groups}
        elif isinstance(state_dict, dict) and state_dict.get("format") == FORMAT:
            _check_sharded(state_dict)
            if state_dict["layout"]["pieces"] != self._pieces:
                lay = state_dict["layout"]
                raise ValueError(
                    f"this shard was cut for shard_size={lay['shard_size']} of "
                    f"{lay['set_size']} ranks (member {lay['shard_rank']}); this "
                    f"optimizer is member {self.shard_rank} with shard_size="
                    f"{self.shard_size} of {self.replicas * self.shard_size}. To reshard, "
                    f"pass the list of state_dict()s of every member of one partition "
                    f"group, or a consolidated_state_dict()")
            self._load({i: {k: v.clone() if isinstance(v, torch.Tensor) else v
                            for k, v in s.items()} for i, s in state_dict["state"].items()},
                       state_dict["param_groups"])
            return
        if not isinstance(state_dict, dict) or "state" not in state_dict \
                or "param_groups" not in state_dict:
            raise ValueError("load_state_dict expects a torch optimizer state dict, a "
                             "ShardedDistributedOptimizer.state_dict() or a list of them")
        self._load(self._slice(state_dict["state"]), state_dict["param_groups"])

    def _check_groups(self, groups):
        if groups is None:
            return
        if len(groups) != len(self.param_groups) or any(
                len(g["params"]) != len(o["params"]) for g, o in zip(groups,
                                                                     self.param_groups)):
            raise ValueError("loaded state dict has a different number of parameter groups "
                             "or parameters than this optimizer")

    def _load(self, piece_state, groups):
        self._check_groups(groups)
        if groups is not None:
            for outer, g in zip(self.param_groups, groups):
                outer.update({k: v for k, v in g.items() if k != "params"})
        inner_groups = []
        i = 0
        for outer, inner in zip(self.param_groups, self._inner.param_groups):
            d = {k: v for k, v in outer.items() if k != "params"}
            d["params"] = list(range(i, i + len(inner["params"])))
            i += len(inner["params"])
            inner_groups.append(d)
        self._inner.load_state_dict({"state": dict(piece_state), "param_groups": inner_groups})

    def _slice(self, state):
        """This rank's pieces of a consolidated state ({param index: {key: value}})."""
        out = {}
        for i, pc in enumerate(self._pieces):
            have = [(seg, state[seg[0]]) for seg in pc["segments"] if seg[0] in state]
            if not have:
                continue
            piece = {}
            for key in dict.fromkeys(k for _, s in have for k in s):
                sample_seg, sample = next((seg, s[key]) for seg, s in have if key in s)
                p = self._params[sample_seg[0]]
                if _elementwise(key, sample, p.shape):
                    parts = []
                    for j, poff, _, n in pc["segments"]:
                        v = state.get(j, {}).get(key)
                        if v is None:
                            parts.append(torch.zeros(n, dtype=sample.dtype))
                        else:
                            if tuple(v.shape) != tuple(self._params[j].shape):
                                raise ValueError(
                                    f"state {key!r} of parameter {j} "
                                    f"({self._name(self._params[j])}) has shape "
                                    f"{tuple(v.shape)}; the parameter has "
                                    f"{tuple(self._params[j].shape)}")
                            parts.append(v.detach().reshape(-1)[poff:poff + n])
                    piece[key] = torch.cat(parts).clone()
                else:
                    piece[key] = sample.clone() if isinstance(sample, torch.Tensor) \
                        else sample
            out[i] = piece
        return out

    def broadcast_state(self, root_rank):
        """hvd.broadcast_optimizer_state for a sharded optimizer: the hyperparameters of
        root_rank, and every rank's shard from the member of root_rank's partition group
        that holds the same slice (over the replica group)."""
        ps = self.process_set
        base = list(ps.ranks) if ps.process_set_id != 0 else list(range(basics.size()))
        if root_rank not in base:
            raise ValueError(f"broadcast_optimizer_state: root rank {root_rank} is not a "
                             f"member of {ps!r}")
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        is_root = basics.rank() == root_rank
        blob = _broadcast_blob(_blob(hyper) if is_root else None, root_rank, ps,
                               f"{self._uid}.bcast.hyper")
        groups = _unblob(blob)
        state = None
        if self.replica_set is not None:
            src = base[(base.index(root_rank) // self.shard_size) * self.shard_size
                       + self.shard_rank]
            mine = self.state_dict()["state"] if basics.rank() == src else None
            blob = _broadcast_blob(_blob(mine) if mine is not None else None, src,
                                   self.replica_set, f"{self._uid}.bcast.state")
            state = _unblob(blob)
        self._load(state if state is not None else self.state_dict()["state"],
                   [dict(g, params=o["params"]) for g, o in zip(groups, self.param_groups)])


# ------------------------------------------------------------------ helpers

def _check_sharded(sd):
    if not isinstance(sd, dict) or sd.get("format") != FORMAT or "layout" not in sd:
        raise ValueError("expected ShardedDistributedOptimizer.state_dict()s")


def _elementwise(key, value, shape):
    """Whether a state entry holds one value per element of its parameter (or piece)."""
    return isinstance(value, torch.Tensor) and key != "step" \
        and tuple(value.shape) == tuple(shape)


def _consolidate(shards, params):
    """{param index: {key: value}} (a plain optimizer's 'state') from the shard states
    of every member of one partition group, each {'layout': ..., 'state': ...}."""
    if not shards:
        raise ValueError("no shards to load")
    lay0 = shards[0]["layout"]
    shapes = [list(p.shape) for p in params]
    if lay0["param_shapes"] != shapes:
        raise ValueError(f"the shards were saved for parameters of shapes "
                         f"{lay0['param_shapes']}, this optimizer has {shapes}")
    members = sorted(s["layout"]["shard_rank"] for s in shards)
    if members != list(range(lay0["shard_size"])) or any(
            s["layout"]["shard_size"] != lay0["shard_size"] or
            s["layout"]["param_shapes"] != shapes for s in shards):
        raise ValueError(f"need the state of every member 0..{lay0['shard_size'] - 1} of "
                         f"one partition group, saved together; got members {members}")
    state, filled = {}, {}
    for sd in shards:
        for i, pc in enumerate(sd["layout"]["pieces"]):
            ps = sd["state"].get(i)
            if not ps:
                continue
            for key, v in ps.items():
                elem = _elementwise(key, v, (pc["end"] - pc["start"],))
                for j, poff, off, n in pc["segments"]:
                    if not 0 <= j < len(params) or poff < 0 or off < 0 or n <= 0 or \
                            poff + n > params[j].numel():
                        raise ValueError(f"bad segment {[j, poff, off, n]} in a shard")
                    st = state.setdefault(j, {})
                    if not elem:
                        st.setdefault(key, v.clone() if isinstance(v, torch.Tensor) else v)
                        continue
                    if key not in st:
                        st[key] = torch.zeros(params[j].numel(), dtype=v.dtype)
                    st[key][poff:poff + n] = v[off:off + n]
                    filled[(j, key)] = filled.get((j, key), 0) + n
    for (j, key), n in filled.items():
        if n != params[j].numel():
            raise ValueError(f"the shards cover {n} of {params[j].numel()} elements of "
                             f"state {key!r} of parameter {j}")
        state[j][key] = state[j][key].view(params[j].shape)
    return state
