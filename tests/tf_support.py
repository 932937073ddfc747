"""What the TensorFlow test files share: skip them all when TensorFlow is missing, and
the environment that keeps each rank quiet and on one thread (2 cores, many ranks)."""
import importlib.util

import pytest

if importlib.util.find_spec("tensorflow") is None:      # found, not imported: ranks do
    pytest.skip("tensorflow is not installed", allow_module_level=True)

TF_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1",
          "TF_ENABLE_ONEDNN_OPTS": "0", "OMP_NUM_THREADS": "1",
          "TF_NUM_INTEROP_THREADS": "2", "TF_NUM_INTRAOP_THREADS": "1"}
