"""Program of tests/test_logging.py, run by
test_shown_by_default_and_silenced_through_the_logger: pins the engine thread under the
HOROVOD_THREAD_AFFINITY it is given, with no logging configured ("loud", argv[1]) or with
the "horovodlike" logger set to ERROR ("quiet")."""
import logging
import sys

from horovodlike.common.affinity import engine_thread_affinity


def main():
    if sys.argv[1] == "quiet":
        logging.getLogger("horovodlike").setLevel(40)
    with engine_thread_affinity(0, 1):
        pass


if __name__ == "__main__":
    main()
