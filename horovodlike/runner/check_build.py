"""``--check-build``: what this build has, in horovodrun --check-build's layout."""
import importlib.util
import os
import shutil


def version():
    """horovodlike's version: the installed package's, else the checkout's."""
    try:
        from importlib.metadata import version as installed
        return installed("horovodlike")
    except Exception:  # not installed: running from a checkout
        from horovodlike import __version__
        return __version__


def _found(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_build():
    """What this build has, in horovodrun --check-build's layout."""
    def box(v):
        return "[X]" if v else "[ ]"

    mpirun = shutil.which("mpirun")
    mpi = bool(mpirun) and _found("mpi4py")
    shm = os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK)
    try:
        from horovodlike.common import engine  # noqa: F401  the compiled engine loads
        engine_ok = True
    except Exception:
        engine_ok = False
    lines = [
        f"horovodlike v{version()}:",
        "",
        "Available Frameworks:",
        f"    {box(_found('tensorflow'))} TensorFlow",
        f"    {box(_found('torch'))} PyTorch",
        f"    {box(False)} MXNet",
        "",
        "Available Controllers:",
        f"    {box(mpi)} MPI (mpirun{'' if mpirun else ' not found'}, "
        f"mpi4py{'' if _found('mpi4py') else ' not installed'})",
        f"    {box(engine_ok)} Gloo (horovodlikerun's own rendezvous; what --gloo selects)",
        "",
        "Available Tensor Operations:",
        f"    {box(False)} NCCL",
        f"    {box(False)} DDL",
        f"    {box(False)} CCL",
        f"    {box(False)} MPI",
        f"    {box(engine_ok)} Gloo (horovodlike's engine: TCP ring, recursive doubling)",
        "",
        "horovodlike engine:",
        f"    {box(engine_ok)} compiled engine loads",
        f"    {box(engine_ok and shm)} shared memory on one host (/dev/shm"
        f"{'' if shm else ' not writable'})",
        f"    {box(engine_ok)} hierarchical allreduce / allgather",
        f"    {box(engine_ok)} timeline",
    ]
    return "\n".join(lines)

