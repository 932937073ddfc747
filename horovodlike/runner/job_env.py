"""The environment every rank gets from horovodlikerun's flags, by Horovod's variable
names (Horovod's config_parser.set_env_from_args) plus the ones horovodlike's engine
and bootstrap read, and which of the launcher's own variables travel to remote ranks."""
from ..common import jobkey
from ..common import launch_contract as contract


def _fmt(x):
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _bit(v):
    return "1" if v else "0"


def job_env(args):
    """{name: value} of the variables every rank gets from the parsed flags `args`
    (see the module's doc); a flag not given sets nothing."""
    env = {contract.START_TIMEOUT: str(args.start_timeout),
           contract.HOROVOD_START_TIMEOUT: str(args.start_timeout)}
    values = [
        ("HOROVOD_FUSION_THRESHOLD", args.fusion_threshold_mb,
         lambda v: str(int(float(v) * 1048576))),
        ("HOROVOD_CYCLE_TIME", args.cycle_time_ms, _fmt),
        ("HOROVOD_CACHE_CAPACITY", args.cache_capacity, str),
        ("HOROVOD_AUTOTUNE", args.autotune, _bit),
        ("HOROVOD_AUTOTUNE_LOG", args.autotune_log_file, str),
        ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", args.autotune_warmup_samples, str),
        ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", args.autotune_steps_per_sample, str),
        ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", args.autotune_bayes_opt_max_samples, str),
        ("HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", args.autotune_gaussian_process_noise, str),
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
        (contract.PEER_TIMEOUT, args.gloo_timeout_seconds, str),
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
        env[contract.IFACE] = args.nics[0]
    return env

# Variables that describe the launcher's own shell session; exporting them to
# a remote shell would be wrong or would break it.
_NOT_EXPORTED = {"OLDPWD", "PWD", "HOSTNAME", "SHLVL", "_", "SSH_CLIENT",
                 "SSH_CONNECTION", "SSH_TTY", "SSH_AUTH_SOCK", jobkey.ENV}


def exportable(name):
    """Whether the launcher passes variable `name` on to ranks it starts by ssh or mpirun."""
    return (name.isidentifier() and name.isascii()
            and not name.startswith("BASH_FUNC_") and name not in _NOT_EXPORTED)
