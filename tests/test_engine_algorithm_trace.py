"""The algorithm of a response is chosen once, run, and traced under the name chosen:
on two (made-up) nodes of two ranks, the global allreduce and allgather run
hierarchically and are traced as "hierarchical" (an allgather was once traced as
"tcp"), broadcast and alltoall go over TCP as a chain and pairwise, and a set made of
one node's ranks uses shared memory. A Horovod job that turns the hierarchy off
(HOROVOD_HIERARCHICAL_ALLREDUCE=0 / _ALLGATHER=0, as horovodrun's
--no-hierarchical-allreduce sets) gets the flat TCP ring instead."""
import json

import pytest

from harness import rank_program, run_ranks

SCRIPT = rank_program("engine_algorithm_trace_script")


HIER = {"allreduce.ar": "hierarchical", "allgather.ag": "hierarchical",
        "broadcast.bc": "tcp_chain", "alltoall.a2a": "tcp_pairwise",
        "reducescatter.rs": "hierarchical"}
FLAT = {**HIER, "allreduce.ar": "tcp_ring", "allgather.ag": "tcp_ring",
        "reducescatter.rs": "tcp_ring"}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("env,want", [
    ({}, HIER),
    ({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0", "HOROVOD_HIERARCHICAL_ALLGATHER": "0"}, FLAT),
    # our own knob wins over Horovod's
    ({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0", "HOROVOD_HIERARCHICAL_ALLGATHER": "false",
      "HOROVODLIKE_ALLREDUCE_ALGORITHM": "hier", "HOROVODLIKE_ALLGATHER_ALGORITHM": "auto"},
     HIER),
], ids=["default", "horovod-flat", "ours-wins"])
def test_traced_algorithm_is_the_one_chosen(tmp_path, env, want):
    base = tmp_path / "tl.json"
    res = run_ranks(SCRIPT, 4, env={"HOROVOD_TIMELINE": str(base), **env}, timeout=150,
                    launcher_args=["-H", "a:2,b:2", "--ssh-command", "sh -c {command}"])
    res.assert_ok(sentinel="OK")
    with open(tmp_path / "tl.rank0.json") as f:
        events = json.load(f)["traceEvents"]
    algs = {}
    for ev in events:
        a = ev.get("args") or {}
        if "algorithm" in a:
            for t in a["tensors"]:
                algs[t] = a["algorithm"]
    for name, alg in want.items():
        got = [v for k, v in algs.items() if k.endswith(name.split(".", 1)[1])]
        assert got == [alg], f"{name}: traced {got}, chose {alg}; all: {algs}"
    local = [v for k, v in algs.items() if "local" in k]
    assert local == ["shm"], algs
