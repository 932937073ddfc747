"""horovodrun's whole command line (Horovod 0.28.1), as ``horovodlikerun`` reads it:
the options, and what is checked and resolved once they are parsed.

Every option string of ``horovodrun`` parses here. Each one either does what it does in
Horovod (or the nearest thing this launcher has), or, for features that do not exist in
horovodlike (autotuning, NCCL streams, torus allreduce, jsrun), is accepted and prints
one line saying what is ignored and why. The elastic flags start elastic mode
(runner/elastic_driver.py).

The flow: :func:`add_arguments` declares the options (every default is ``None`` so that
"given on the command line" can be told from "not given"), :func:`finish` applies a
``--config-file`` (config_file.py), checks the combination, resolves the defaults and
prints the notices. Beside this module: job_env.py turns the result into the
environment every rank gets (Horovod's variable names), mpirun.py builds ``--mpi``'s
mpirun command line, check_build.py answers ``--check-build``.
"""

import argparse
import difflib
import os
import shlex
import shutil
import socket
import sys
import warnings

from ..common import launch_contract as contract
from ..common import slurm
from . import config_file
from .check_build import check_build, version

PROG = "horovodlikerun"
SHUTDOWN_GRACE_MARGIN = 5          # --shutdown-grace's default: the peer timeout + this
LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]

# Flags of features horovodlike does not have: dest -> why the value is ignored.
_NCCL = "horovodlike runs collectives on the CPU in its own engine; there is no NCCL"
IGNORED = {
    "torus_allreduce": _NCCL + " (hierarchical allreduce is the nearest: "
                               "--hierarchical-allreduce)",
    "num_nccl_streams": _NCCL,
    "mpi_threads_disable": "the engine never calls MPI (mpi4py is only used for the "
                           "address exchange in hvd.init under mpirun)",
    "use_jsrun": "there is no jsrun (LSF) launcher here; the job runs with horovodlikerun's "
                 "own launcher (under LSF, `jsrun ... python train.py` works directly)",
    "disable_cache": "horovodlikerun keeps no cache of start-up checks, so every run "
                     "already checks afresh",
}
# Flags that only mean something with --mpi.
_MPI_ONLY = {"mpi_args": "--mpi-args", "tcp_flag": "--tcp", "binding_args": "--binding-args"}


class _Const(argparse.Action):
    """store_const with a default of None, so an unset flag stays None."""

    def __init__(self, option_strings, dest, const=True, help=None, deprecated_for=None):
        super().__init__(option_strings, dest, nargs=0, const=const, default=None,
                         help=help)
        self.deprecated_for = deprecated_for

    def __call__(self, parser, namespace, values, option_string=None):
        if self.deprecated_for:
            warnings.warn(f"{option_string} has been replaced by {self.deprecated_for}",
                          DeprecationWarning)
        setattr(namespace, self.dest, self.const)


class _Nics(argparse.Action):
    """--network-interface(s): union of every value, comma lists split (as Horovod)."""

    def __call__(self, parser, namespace, values, option_string=None):
        nics = list(getattr(namespace, self.dest, None) or [])
        for nic in values.split(","):
            nic = nic.strip()
            if nic and nic not in nics:
                nics.append(nic)
        setattr(namespace, self.dest, nics)


class _CheckBuild(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print(check_build())
        parser.exit(0)


class _Version(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print(version())
        parser.exit(0)


def _pair(group, on, off, dest, on_help, off_help=argparse.SUPPRESS, on_const=True):
    """An --x / --no-x pair that cannot be given together."""
    mx = group.add_mutually_exclusive_group()
    mx.add_argument(*on, dest=dest, action=_Const, const=on_const, help=on_help)
    mx.add_argument(*off, dest=dest, action=_Const, const=not on_const, help=off_help)
    return mx


def add_arguments(p):
    """Declare every horovodrun option on parser p (which has allow_abbrev=False)."""
    p.add_argument("-v", "--version", action=_Version, nargs=0,
                   help="print the version and exit")
    p.add_argument("-np", "--num-proc", dest="num_proc", type=int,
                   help="total number of ranks")
    p.add_argument("-cb", "--check-build", action=_CheckBuild, nargs=0,
                   help="show what this build has (frameworks, launchers, data paths) "
                        "and exit")
    p.add_argument("--disable-cache", dest="disable_cache", action=_Const,
                   help="accepted; there is no cache of start-up checks")
    p.add_argument("--start-timeout", dest="start_timeout", type=int,
                   help="seconds ranks wait for each other at startup (default: "
                        "$HOROVOD_START_TIMEOUT, else %d)" % contract.DEFAULT_START_TIMEOUT)
    p.add_argument("--shutdown-grace", dest="shutdown_grace", type=float,
                   help="once a rank has finished, seconds a rank still running may be "
                        "stopped or silent (no output, no CPU time) before it is killed "
                        "and named (default: the peer timeout + %d)" % SHUTDOWN_GRACE_MARGIN)
    p.add_argument("--network-interfaces", dest="nics", action=_Nics,
                   help="network interface(s) the ranks bind and talk on, comma "
                        "separated; only the first is used (as in Horovod's Gloo mode)")
    p.add_argument("--network-interface", dest="nics", action=_Nics,
                   help="a network interface to use; may be repeated")
    p.add_argument("--output-filename", dest="output_filename",
                   help="also write each rank's output to "
                        "<dir>/rank.<rank>/stdout and .../stderr")
    p.add_argument("--verbose", dest="verbose", action=_Const,
                   help="print the rank placement and the commands run")
    p.add_argument("--config-file", dest="config_file",
                   help="YAML file of Horovod's parameters; flags on the command line win")

    g = p.add_argument_group("SSH arguments")
    g.add_argument("-p", "--ssh-port", dest="ssh_port", type=int,
                   help="ssh port on every host")
    g.add_argument("-i", "--ssh-identity-file", dest="ssh_identity_file",
                   help="private key ssh uses to reach the hosts")

    g = p.add_argument_group("tuneable parameter arguments")
    g.add_argument("--fusion-threshold-mb", dest="fusion_threshold_mb", type=float,
                   help="fusion buffer size in MB; 0 disables fusion (default: 128)")
    g.add_argument("--cycle-time-ms", dest="cycle_time_ms", type=float,
                   help="delay between fusion cycles in ms (default: 1)")
    g.add_argument("--cache-capacity", dest="cache_capacity", type=int,
                   help="response cache entries (default: 1024)")
    _pair(g, ["--hierarchical-allreduce"], ["--no-hierarchical-allreduce"],
          "hierarchical_allreduce", "allreduce within each host by shared memory, then "
          "across hosts, then within each host", "never use hierarchical allreduce")
    _pair(g, ["--hierarchical-allgather"], ["--no-hierarchical-allgather"],
          "hierarchical_allgather", "allgather within each host, then across hosts",
          "never use hierarchical allgather")
    _pair(g, ["--torus-allreduce"], ["--no-torus-allreduce"], "torus_allreduce",
          "accepted and ignored: NCCL's torus allreduce does not exist here")

    g = p.add_argument_group("autotune arguments (the search: docs/moving-from-horovod.md)")
    _pair(g, ["--autotune"], ["--no-autotune"], "autotune",
          "search the fusion threshold, cycle time, bucket cap and allreduce algorithm "
          "while the job trains, and keep the best")
    g.add_argument("--autotune-log-file", dest="autotune_log_file",
                   help="rank 0 writes one CSV row per sample here")
    g.add_argument("--autotune-warmup-samples", dest="autotune_warmup_samples", type=int,
                   help="samples not scored at the start (default 3)")
    g.add_argument("--autotune-steps-per-sample", dest="autotune_steps_per_sample",
                   type=int, help="training steps per sample (default 10)")
    g.add_argument("--autotune-bayes-opt-max-samples",
                   dest="autotune_bayes_opt_max_samples", type=int,
                   help="samples of the Bayesian search (default 20)")
    g.add_argument("--autotune-gaussian-process-noise",
                   dest="autotune_gaussian_process_noise", type=float,
                   help="the Gaussian process's noise on normalised scores (default 0.8)")

    add_elastic_args(p.add_argument_group("elastic arguments"))

    g = p.add_argument_group("timeline arguments")
    g.add_argument("--timeline-filename", dest="timeline_filename",
                   help="write a Chrome-trace timeline (every rank writes its own file "
                        "beside this path)")
    _pair(g, ["--timeline-mark-cycles"], ["--no-timeline-mark-cycles"],
          "timeline_mark_cycles", "mark fusion cycles on the timeline")

    g = p.add_argument_group("stall check arguments")
    _pair(g, ["--no-stall-check"], ["--stall-check"], "no_stall_check",
          "disable the stall check", "enable the stall check (the default)")
    g.add_argument("--stall-check-warning-time-seconds",
                   dest="stall_check_warning_time_seconds", type=int,
                   help="seconds until a stall warning (default: 60)")
    g.add_argument("--stall-check-shutdown-time-seconds",
                   dest="stall_check_shutdown_time_seconds", type=int,
                   help="seconds until a stalled job is shut down (default: 0, never)")

    g = p.add_argument_group("library arguments")
    _pair(g, ["--mpi-threads-disable"], ["--no-mpi-threads-disable"],
          "mpi_threads_disable", "accepted and ignored: the engine never calls MPI")
    g.add_argument("--mpi-args", dest="mpi_args",
                   help='extra mpirun arguments with --mpi, e.g. --mpi-args="--map-by '
                        'ppr:2:node"')
    g.add_argument("--tcp", dest="tcp_flag", action=_Const,
                   help="with --mpi, MPI uses only TCP; NCCL_IB_DISABLE=1 either way")
    g.add_argument("--binding-args", dest="binding_args",
                   help="mpirun process binding arguments with --mpi (default: "
                        "-bind-to none -map-by slot)")
    g.add_argument("--num-nccl-streams", dest="num_nccl_streams", type=int,
                   help="accepted and ignored: no NCCL")
    g.add_argument("--thread-affinity", dest="thread_affinity",
                   help="core id(s) for each rank's background engine thread: a comma "
                        "list with one id per local rank, or one id N (local rank i gets "
                        "core N+i)")
    g.add_argument("--gloo-timeout-seconds", dest="gloo_timeout_seconds", type=int,
                   help="seconds a collective waits for a silent peer before failing "
                        "(default: %d)" % contract.DEFAULT_PEER_TIMEOUT)

    g = p.add_argument_group("logging arguments")
    g.add_argument("--log-level", dest="log_level", type=str.upper, choices=LOG_LEVELS,
                   help="minimum level the engine logs to stderr (default: WARNING)")
    mx = g.add_mutually_exclusive_group()
    mx.add_argument("--log-with-timestamp", dest="log_with_timestamp", action=_Const,
                    help="timestamp the engine's log lines")
    mx.add_argument("--log-without-timestamp", dest="log_with_timestamp", action=_Const,
                    const=False, help="do not timestamp the engine's log lines (default)")
    mx.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp",
                    dest="prefix_output_with_timestamp", action=_Const,
                    help="timestamp every line of every rank's output")
    mx.add_argument("--log-hide-timestamp", dest="log_with_timestamp", action=_Const,
                    const=False, deprecated_for="--log-without-timestamp",
                    help=argparse.SUPPRESS)
    mx.add_argument("--no-log-hide-timestamp", dest="log_with_timestamp", action=_Const,
                    deprecated_for="--log-with-timestamp", help=argparse.SUPPRESS)

    g = p.add_argument_group("host arguments").add_mutually_exclusive_group()
    g.add_argument("-H", "--hosts", dest="hosts",
                   help="host1:slots,host2:slots (default: localhost:NP)")
    g.add_argument("-hostfile", "--hostfile", dest="hostfile",
                   help="file with one '<hostname> slots=<n>' line per host")

    g = p.add_argument_group("controller arguments").add_mutually_exclusive_group()
    g.add_argument("--gloo", dest="use_gloo", action=_Const,
                   help="horovodlikerun's own launcher and rendezvous (the default)")
    g.add_argument("--mpi", dest="use_mpi", action=_Const,
                   help="start the ranks with mpirun (Open MPI, MPICH or Intel MPI)")
    g.add_argument("--jsrun", dest="use_jsrun", action=_Const,
                   help="accepted; runs with horovodlikerun's own launcher")


def option_strings(parser):
    """Every option string the parser accepts (for tests and the docs' table)."""
    return sorted(s for a in parser._actions for s in a.option_strings)


def unrecognized(parser, unknown):
    """argparse's "unrecognized arguments" message, with the closest flag we take for
    each mistyped one ("--verbos (did you mean --verbose?)")."""
    known = option_strings(parser)
    parts = []
    for arg in unknown:
        flag = arg.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.7) \
            if flag.startswith("-") else []
        parts.append(f"{arg} (did you mean {close[0]}?)" if close else arg)
    return "unrecognized arguments: " + " ".join(parts)


def missing_python(command, argv):
    """The hint for `horovodlikerun -np 2 train.py`: a Python file given as the command,
    which is not an executable (None when the command is one, or is not such a file)."""
    prog = command[0]
    if not prog.endswith(".py") or shutil.which(prog) is not None:
        return None
    if not os.path.isfile(prog):
        return None
    before = list(argv[:len(argv) - len(command)])
    if before[-1:] == ["--"]:
        before = before[:-1]
    fixed = shlex.join([PROG, *before, "python", *command])
    return (f"{prog} is a Python script, not an executable: run it with python, as in "
            f"`{fixed}`")


# ------------------------------------------------------------------ after parsing

def finish(parser, args, say=None):
    """Apply the config file, check the combination, resolve defaults, print notices.

    parser.error() (exit 2) for anything wrong; notices go through say(line).
    """
    say = say or (lambda line: print(f"{PROG}: {line}", file=sys.stderr))
    if args.config_file:
        try:
            config_file.apply(parser, args, config_file.load(args.config_file))
        except (OSError, ValueError) as exc:
            parser.error(f"--config-file {args.config_file}: {exc}")
    if args.num_proc is None:
        parser.error("-np/--num-proc is required")
    if args.num_proc < 1:
        parser.error("-np must be at least 1")
    try:
        validate(args)
        if args.hostfile:
            try:
                args.hosts = parse_hostfile(args.hostfile)
            except OSError as exc:
                raise ValueError(f"--hostfile {args.hostfile}: {exc.strerror}") from None
        if not args.hosts and not getattr(args, "host_discovery_script", None):
            args.hosts = slurm_hosts(say)
        args.hosts = args.hosts or f"localhost:{args.num_proc}"
        args.start_timeout = resolve_start_timeout(args.start_timeout)
        args.shutdown_grace = resolve_shutdown_grace(args)
        args.thread_affinity = parse_affinity(args.thread_affinity)
    except (OSError, ValueError) as exc:
        parser.error(str(exc))
    if args.output_filename and not args.use_mpi:   # mpirun makes its own layout
        from .rank_output import RankOutput
        try:
            RankOutput.from_args(args).prepare()
        except OSError as exc:
            parser.error(f"--output-filename: {exc}")
    for dest, why in IGNORED.items():
        if getattr(args, dest, None) not in (None, False):
            say(f"{_flag(parser, dest)} ignored: {why}")
    if not args.use_mpi:
        for dest, flag in _MPI_ONLY.items():
            if getattr(args, dest, None):
                say(f"{flag} ignored: it only applies with --mpi"
                    + (" (the engine itself talks TCP, and shared memory within a host)"
                       if dest == "tcp_flag" else ""))
    if args.ssh_port is not None or args.ssh_identity_file:
        try:
            args.ssh_command = ssh_command(args.ssh_command, args.ssh_port,
                                           args.ssh_identity_file)
        except ValueError as exc:
            parser.error(str(exc))
    return args


def _flag(parser, dest):
    for a in parser._actions:
        if a.dest == dest and a.option_strings:
            return max(a.option_strings, key=len)
    return dest


def validate(args):
    """Horovod's range checks (config_parser.validate_config_args)."""
    for name in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                 "autotune_warmup_samples", "autotune_steps_per_sample",
                 "autotune_bayes_opt_max_samples", "stall_check_warning_time_seconds",
                 "stall_check_shutdown_time_seconds", "num_nccl_streams",
                 "gloo_timeout_seconds", "start_timeout"):
        v = getattr(args, name, None)
        if v is not None and v < 0:
            raise ValueError(f"{name}={v} must be >= 0")
    noise = args.autotune_gaussian_process_noise
    if noise is not None and not 0 <= noise <= 1:
        raise ValueError(f"autotune_gaussian_process_noise={noise} must be in [0, 1]")


def resolve_start_timeout(value):
    """--start-timeout, else HOROVOD_START_TIMEOUT, else the default (as horovodrun)."""
    if value is not None:
        return value
    env = os.environ.get(contract.HOROVOD_START_TIMEOUT)
    if env:
        try:
            return int(env)
        except ValueError:
            raise ValueError(f"{contract.HOROVOD_START_TIMEOUT}={env!r} is not a whole "
                             f"number of seconds") from None
    return contract.DEFAULT_START_TIMEOUT


def resolve_shutdown_grace(args):
    """--shutdown-grace, else a few seconds beyond the peer timeout: a rank's engine
    names a silent peer within that timeout, so the launcher acts only on what it does
    not (a rank stopped or hung once its peers have gone)."""
    grace = getattr(args, "shutdown_grace", None)
    if grace is not None:
        if not grace > 0:
            raise ValueError(f"--shutdown-grace must be a positive number of seconds, "
                             f"got {grace}")
        return grace
    peer = getattr(args, "gloo_timeout_seconds", None)
    if peer is None:
        env = os.environ.get(contract.PEER_TIMEOUT)
        try:
            peer = float(env) if env else contract.DEFAULT_PEER_TIMEOUT
        except ValueError:
            raise ValueError(f"{contract.PEER_TIMEOUT}={env!r} is not a number "
                             f"of seconds") from None
    return peer + SHUTDOWN_GRACE_MARGIN


def parse_affinity(value):
    """'3' or '0,2,4' -> list of core ids (None stays None)."""
    if value is None:
        return None
    if isinstance(value, int):
        return [value]
    try:
        cores = [int(c) for c in str(value).split(",") if c.strip()]
    except ValueError:
        raise ValueError(f"--thread-affinity {value!r}: want a core id or a comma "
                         f"separated list of core ids") from None
    if not cores or min(cores) < 0:
        raise ValueError(f"--thread-affinity {value!r}: core ids must be >= 0")
    return cores


def slurm_hosts(say, environ=None):
    """Inside a Slurm allocation (sbatch, salloc) with no -H or --hostfile: its hosts and
    tasks per node (SLURM_JOB_NODELIST, SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE) as
    -H, said on stderr. Horovod's horovodrun reads only LSF's allocation; this is the
    same for Slurm. Ranks on the other hosts start through ssh, as with -H. None
    outside an allocation."""
    env = os.environ if environ is None else environ
    try:
        hosts = slurm.allocation_hosts(env)
    except ValueError as exc:
        raise ValueError(f"cannot read the Slurm allocation: {exc}; give -H "
                         f"host1:slots,host2:slots") from None
    if hosts is None:
        return None
    spec = ",".join(f"{h}:{n}" for h, n in hosts)
    say(f"hosts from the Slurm allocation of job {env.get('SLURM_JOB_ID')} "
        f"(SLURM_JOB_NODELIST={env.get('SLURM_JOB_NODELIST') or env.get('SLURM_NODELIST')}):"
        f" -H {spec}")
    return spec


def parse_hostfile(path):
    """Horovod's host file ('<host> slots=<n>' per line) -> 'host:n,...'.

    Blank lines and '#' comments are skipped; a line without slots= means one slot
    (as in Open MPI's host files).
    """
    hosts = []
    with open(path) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            words = line.split()
            slots = "1"
            for w in words[1:]:
                key, sep, val = w.partition("=")
                if sep and key in ("slots", "max_slots", "max-slots"):
                    if key == "slots":
                        slots = val
                elif sep or w:
                    raise ValueError(f"hostfile {path} line {lineno}: {raw.strip()!r} "
                                     f"(want '<hostname> slots=<n>')")
            if not slots.isdigit() or int(slots) < 1:
                raise ValueError(f"hostfile {path} line {lineno}: bad slots in "
                                 f"{raw.strip()!r}")
            hosts.append(f"{words[0]}:{slots}")
    if not hosts:
        raise ValueError(f"hostfile {path} lists no hosts")
    return ",".join(hosts)


def ssh_command(template, port, identity_file):
    """Put ssh's -p and -i into an ssh command template."""
    words = shlex.split(template)
    if not words or os.path.basename(words[0]) != "ssh":
        raise ValueError("--ssh-port/--ssh-identity-file need an ssh command; with a "
                         "custom --ssh-command put the port and key in the template")
    extra = []
    if port is not None:
        extra += ["-p", str(port)]
    if identity_file:
        extra += ["-i", identity_file]
    return " ".join([shlex.quote(words[0])] + [shlex.quote(e) for e in extra]
                    + [w if w in ("{host}", "{command}") else shlex.quote(w)
                       for w in words[1:]])


def check_nics(nics, all_local):
    """The interfaces must exist here when every rank runs here."""
    if not nics or not all_local:
        return
    have = [name for _, name in socket.if_nameindex()]
    missing = [n for n in nics if n not in have]
    if missing:
        raise ValueError(f"network interface {', '.join(missing)} does not exist on this "
                         f"host (it has: {', '.join(have)})")


def add_elastic_args(parser):
    """docs/elastic.md: horovodrun's elastic flags. A flag the parser already has is left as it is."""
    have = getattr(parser, "_option_string_actions", {})

    def add(*names, **kw):
        if not any(n in have for n in names):
            parser.add_argument(*names, **kw)

    add("--min-np", "--min-num-proc", dest="min_num_proc", type=int,
        help="elastic: the fewest processes training may continue with (default: -np)")
    add("--max-np", "--max-num-proc", dest="max_num_proc", type=int,
        help="elastic: the most processes to run (default: -np)")
    add("--slots-per-host", dest="slots", type=int,
        help="elastic: slots of a discovered host that prints no ':slots'")
    add("--host-discovery-script", dest="host_discovery_script",
        help="elastic: an executable that prints one 'host[:slots]' per line; polled "
             "every second")
    add("--elastic-timeout", dest="elastic_timeout", type=int,
        help="elastic: seconds to wait for --min-np slots before failing "
             f"(default: {contract.ELASTIC_TIMEOUT} or {contract.DEFAULT_ELASTIC_TIMEOUT})")
    add("--reset-limit", dest="reset_limit", type=int,
        help="elastic: the most times the job may be re-formed")
    add("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
        metavar=("MIN", "MAX"),
        help="elastic: seconds a failed host stays blacklisted, doubling per failure "
             "from MIN up to MAX (default: for good)")
    return parser
