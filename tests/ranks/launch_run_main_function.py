"""Program of tests/test_launch_run.py, run by test_function_defined_in_the_script_being_run:
hvd.run() of a function defined in this script (so in __main__, which the ranks do not
import), using a global of the script."""
import horovodlike as hvd
import numpy as np

SCALE = 10


def train(epochs):
    hvd.init()
    w = hvd.allreduce(np.array([float(hvd.rank())]), op=hvd.Sum)
    return [hvd.rank(), float(w[0]) * SCALE * epochs]


def main():
    print("RESULTS", hvd.run(train, args=(3,), num_proc=2, hosts="localhost:2"))


if __name__ == "__main__":
    main()
