"""Rank program of tests/test_torch_errors.py, run by
test_bad_input_gives_clear_errors_and_the_engine_goes_on."""
from _torch_common import *  # noqa: F401,F403 (torch, thvd, hvd, np, the check helpers)


def main():
    hvd.init()
    R, P = thvd.rank(), thvd.size()
    from horovodlike.common.exceptions import TensorMismatchError


    def still_works(what):
        t_equal(thvd.allreduce(torch.ones(2), op=thvd.Sum), torch.full((2,), float(P)),
                f"a good allreduce after: {what}")


    ok = torch.ones(4)
    # Not a tensor, or a tensor horovodlike cannot move.
    for fn_name, fn in [("allreduce", lambda t: thvd.allreduce(t)),
                        ("allreduce_", lambda t: thvd.allreduce_(t)),
                        ("allreduce_async", lambda t: thvd.allreduce_async(t)),
                        ("grouped_allreduce", lambda t: thvd.grouped_allreduce([ok, t])),
                        ("allgather", lambda t: thvd.allgather(t)),
                        ("broadcast", lambda t: thvd.broadcast(t, 0)),
                        ("broadcast_", lambda t: thvd.broadcast_(t, 0)),
                        ("alltoall", lambda t: thvd.alltoall(t)),
                        ("reducescatter", lambda t: thvd.reducescatter(t))]:
        check_raises(TypeError, lambda: fn(np.ones(4, np.float32)), "torch.Tensor",
                     what=f"{fn_name}(numpy array)")
        check_raises(TypeError, lambda: fn([1.0, 2.0]), what=f"{fn_name}(list)")
        for bad, needle in [(torch.ones(4, dtype=torch.complex64), "not supported"),
                            (torch.ones(4, device="meta"), "CPU"),
                            (torch.ones(4).to_sparse(), "sparse")]:
            e = check_raises(TypeError, lambda: fn(bad), needle, what=f"{fn_name}({bad.dtype} "
                                                                     f"{bad.device} {bad.layout})")
            check(isinstance(e, ValueError), f"{fn_name}: unsupported tensors are also ValueError")
    if hasattr(torch, "uint16"):
        check_raises(ValueError, lambda: thvd.allreduce(torch.ones(2, dtype=torch.uint16)),
                     "uint16", what="uint16 is not supported")
    still_works("argument errors")

    # Argument values.
    check_raises(NotImplementedError, lambda: thvd.allreduce(ok, op=thvd.Adasum), "Adasum",
                 what="Adasum")
    check_raises(ValueError, lambda: thvd.allreduce(ok, op=99), "unknown", what="unknown op")
    check_raises(TypeError, lambda: thvd.allreduce(ok, prescale_factor="x"), "prescale",
                 what="prescale not a number")
    check_raises(TypeError, lambda: thvd.broadcast(ok, root_rank="0"), "root_rank",
                 what="root_rank not an int")
    check_raises(ValueError, lambda: thvd.broadcast(ok, root_rank=P), what="root_rank too big")
    check_raises(ValueError, lambda: thvd.allgather(torch.tensor(1.0)), "dimension",
                 what="allgather of a scalar")
    check_raises(ValueError, lambda: thvd.allreduce(torch.ones(2, dtype=torch.bool)), "bool",
                 what="Average of bool")
    check_raises(ValueError, lambda: thvd.grouped_allreduce([]), "at least one",
                 what="grouped_allreduce([])")
    check_raises(TypeError, lambda: thvd.grouped_allreduce(ok), "list", what="grouped of a tensor")
    check_raises(ValueError, lambda: thvd.synchronize(123456789), "handle",
                 what="synchronize(unknown handle)")
    check_raises(ValueError, lambda: thvd.poll(-987654), "handle", what="poll(unknown group)")
    check_raises(TypeError, lambda: thvd.allreduce(ok, process_set="all"), "ProcessSet",
                 what="process_set not a ProcessSet")
    check_raises(ValueError, lambda: thvd.allreduce(ok, process_set=thvd.ProcessSet([0])),
                 "registered", what="unregistered process set")
    still_works("value errors")

    # The same name twice while the first is in flight: refused, the first still completes.
    # (An op is in flight until every rank has submitted it: rank 0 submits only once the
    # others have tried the duplicate, so theirs is sure to be still pending.)
    if R == 0:
        wait_for(*[f"dup-tried.{r}" for r in range(1, P)])
    h = thvd.allreduce_async(torch.ones(3), op=thvd.Sum, name="dup")
    if R != 0:
        check_raises(ValueError, lambda: thvd.allreduce_async(torch.ones(3), name="dup"), "dup",
                     what="a name reused while in flight")
        arrive(f"dup-tried.{R}")
    t_equal(thvd.synchronize(h), torch.full((3,), float(P)), "the first 'dup' completes")
    t_equal(thvd.allreduce(torch.ones(3), op=thvd.Sum, name="dup"), torch.full((3,), float(P)),
            "the name is free again after synchronize")

    # Ranks that disagree: every rank gets TensorMismatchError, then the engine goes on.
    if P > 1:
        check_raises(TensorMismatchError, lambda: thvd.allreduce(torch.ones(2 + R), name="shape"),
                     "shape", what="allreduce shapes differ")
        still_works("a shape mismatch")
        x = torch.ones(2, dtype=torch.float32 if R == 0 else torch.float64)
        check_raises(TensorMismatchError, lambda: thvd.allreduce(x, name="dtype"), "dtype",
                     what="allreduce dtypes differ")
        check_raises(TensorMismatchError, lambda: thvd.broadcast(torch.ones(2), R, name="root"),
                     what="broadcast roots differ")
        check_raises(TensorMismatchError,
                     lambda: thvd.allgather(torch.ones(1, 1 + R), name="ag_tail"),
                     what="allgather trailing dimensions differ")
        check_raises(TensorMismatchError,
                     lambda: thvd.allreduce(torch.ones(2), op=thvd.Sum if R else thvd.Max,
                                            name="op"), what="allreduce ops differ")
        check_raises(RuntimeError, lambda: thvd.grouped_allreduce([torch.ones(1), torch.ones(1 + R)],
                                                                  name="grp"),
                     what="grouped_allreduce member mismatch")
        still_works("mismatches")

    # alltoall / reducescatter arguments.
    check_raises(ValueError, lambda: thvd.alltoall(torch.ones(3), splits=[3] * (P + 1)), "split",
                 what="alltoall: wrong number of splits")
    check_raises(ValueError, lambda: thvd.alltoall(torch.ones(3), splits=[1] * P if P != 3
                                                   else [2, 2, 2]), "add up",
                 what="alltoall: splits do not add up")
    check_raises(ValueError, lambda: thvd.reducescatter(ok, op=thvd.Min), "Sum",
                 what="reducescatter Min")

    # Timeline calls exist (implemented or a clear NotImplementedError).
    try:
        thvd.stop_timeline()
    except NotImplementedError as e:
        check("timeline" in str(e), "stop_timeline message", str(e))
    except Exception as e:
        pass

    # Autograd through an op that fails leaves nothing half done.
    x = torch.ones(2, requires_grad=True)
    check_raises(TypeError, lambda: thvd.allreduce(x, op=thvd.Sum, prescale_factor=None),
                 what="autograd allreduce with a bad argument")
    still_works("everything")
    finish()


if __name__ == "__main__":
    main()
