"""Rank program of tests/test_tf_horovod_suite.py: runs Horovod's own TensorFlow test file
(argv[1]) under pytest, keeping the tests argv[2] selects (a -k expression)."""
import sys

import pytest


def main():
    suite, subset = sys.argv[1], sys.argv[2]
    rc = pytest.main(["-p", "no:cacheprovider", "-q", "-p", "no:randomly", suite, "-k", subset])
    print("HVDTEST-OK" if rc == 0 else f"Horovod's suite: pytest exit status {rc}", flush=True)
    sys.exit(int(rc))


if __name__ == "__main__":
    main()
