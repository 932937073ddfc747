"""Suite-wide settings.

scripts/test.sh runs the suite on several pytest-xdist workers, so tests run side by side:
a test may not assume the machine, /dev/shm (see harness.leaked_segments) or a port to
itself.
"""
import os
import resource
import time

import pytest


# HOROVODLIKE_TEST_CPU_REPORT=FILE appends "seconds-of-wall seconds-of-cpu test-id" per
# test: the CPU its processes used (children reaped during the test: launchers and their
# ranks). A test whose wall time far exceeds its CPU time waits on a timeout; one whose
# CPU time is near its wall time is what two workers contend for.
_CPU_REPORT = os.environ.get("HOROVODLIKE_TEST_CPU_REPORT")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not _CPU_REPORT:
        yield
        return
    t0, c0 = time.monotonic(), _cpu_seconds()
    yield
    wall, cpu = time.monotonic() - t0, _cpu_seconds() - c0
    with open(_CPU_REPORT, "a") as f:
        f.write(f"{wall:.2f} {cpu:.2f} {item.nodeid}\n")


def _cpu_seconds():
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
