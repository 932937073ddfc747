"""Rank program of tests/test_api_errors.py, run by
test_unnamed_ops_from_several_threads_pair_by_thread."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import threading


def main():
    hvd.init()
    P = hvd.size()
    OPS = 40
    results = {}


    def work(i):
        results[i] = [hvd.allreduce(np.full(3, float(100 * i + k)), op=hvd.Sum)[0]
                      for k in range(OPS)]


    threads = [threading.Thread(target=work, args=(i,), name=f"worker-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        check_equal(np.array(results[i]), np.array([P * (100.0 * i + k) for k in range(OPS)]),
                    f"unnamed allreduces of thread worker-{i}")
    check_equal(hvd.allreduce(np.ones(2), op=hvd.Sum), np.full(2, float(P)), "main thread")

    # Two live threads of one name cannot be told apart: refused, with a clear error.
    submitted, leave, errors = threading.Event(), threading.Event(), []


    def first():
        hvd.allreduce(np.ones(1), op=hvd.Sum)
        submitted.set()
        leave.wait(60)


    def second():
        try:
            hvd.allreduce(np.ones(1), op=hvd.Sum)
        except ValueError as e:
            errors.append(str(e))


    a = threading.Thread(target=first, name="twin")
    a.start()
    submitted.wait(60)
    b = threading.Thread(target=second, name="twin")
    b.start()
    b.join()
    leave.set()
    a.join()
    check(len(errors) == 1 and "another live thread" in errors[0] and "name=" in errors[0],
          "two live threads of one name are refused", errors)
    finish()


if __name__ == "__main__":
    main()
