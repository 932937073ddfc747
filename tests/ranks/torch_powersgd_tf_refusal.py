"""Rank program of tests/test_torch_powersgd.py, run by
test_tensorflow_bf16_compressor_and_powersgd_refusal."""
from _common import *  # noqa: F401,F403 (numpy as np, horovodlike as hvd, the check helpers)
import tensorflow as tf
import horovodlike.tensorflow as tfhvd
from horovodlike.tensorflow.compression import PowerSGD as TFPowerSGD
from horovodlike.torch import PowerSGD


def main():
    tfhvd.init()
    for what, fn in [("torch PowerSGD in tf allreduce",
                      lambda: tfhvd.allreduce(tf.ones(2), compression=PowerSGD())),
                     ("tensorflow PowerSGD", lambda: TFPowerSGD(rank=2))]:
        try:
            fn()
        except NotImplementedError as e:
            check("horovodlike.tensorflow" in str(e), what, str(e))
        else:
            fail(what, "no NotImplementedError")
    finish()


if __name__ == "__main__":
    main()
