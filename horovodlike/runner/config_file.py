"""``--config-file``: horovodrun's YAML file of parameters.

The file is read with PyYAML's ``safe_load`` (plain data only, never an object), as
Horovod reads it, so it means what YAML 1.1 says it means: ``yes``/``no``/``on``/``off``
are booleans, ``010`` is octal (8), ``0x10`` is 16, ``1:30`` is 90, and ``1e3`` is a
string (which a number's key still reads as 1000, as its flag would). Its sections and
keys are Horovod's (config_parser.py):

    controller: gloo | mpi
    params:          fusion_threshold_mb, cycle_time_ms, cache_capacity,
                     hierarchical_allreduce, hierarchical_allgather, torus_allreduce
    autotune:        enabled, log_file, warmup_samples, steps_per_sample,
                     bayes_opt_max_samples, gaussian_process_noise
    timeline:        filename, mark_cycles
    stall_check:     enabled, warning_time_seconds, shutdown_time_seconds
    library_options: mpi_threads_disable, num_nccl_streams, thread_affinity,
                     gloo_timeout_seconds
    logging:         level, with_timestamp

Each value is checked as the flag it stands for would check it (the flag's type and
choices), so a value of the wrong kind is refused with the section and key named,
never passed on as something else. A flag given on the command line wins over the file.
"""
import argparse

# Horovod's YAML sections -> (key in the section, the flag's dest).
SECTIONS = {
    "params": [(k, k) for k in ("fusion_threshold_mb", "cycle_time_ms", "cache_capacity",
                                "hierarchical_allreduce", "hierarchical_allgather",
                                "torus_allreduce")],
    "autotune": [("enabled", "autotune")]
                + [(k, "autotune_" + k) for k in ("log_file", "warmup_samples",
                                                  "steps_per_sample", "bayes_opt_max_samples",
                                                  "gaussian_process_noise")],
    "timeline": [("filename", "timeline_filename"), ("mark_cycles", "timeline_mark_cycles")],
    "stall_check": [("enabled", "no_stall_check"),
                    ("warning_time_seconds", "stall_check_warning_time_seconds"),
                    ("shutdown_time_seconds", "stall_check_shutdown_time_seconds")],
    "library_options": [(k, k) for k in ("mpi_threads_disable", "num_nccl_streams",
                                         "thread_affinity", "gloo_timeout_seconds")],
    "logging": [("level", "log_level"), ("with_timestamp", "log_with_timestamp")],
}
# Keys whose flag means the opposite of the key: stall_check.enabled is --no-stall-check.
_NEGATED = {("stall_check", "enabled")}
# Keys that may be a YAML list: thread_affinity, one core per local rank.
_LISTS = {"thread_affinity"}
_KIND = {int: "a whole number", float: "a number"}


def load(path):
    """The file's sections, {section: value}; ValueError saying what is wrong and where
    (the caller names the file), OSError if it cannot be read."""
    try:
        import yaml
    except ImportError:
        raise ValueError("reading a config file needs PyYAML: pip install pyyaml") from None
    with open(path, encoding="utf-8") as f:
        try:
            config = yaml.safe_load(f)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            raise ValueError(f"not valid YAML: {where}{exc.problem}"
                             + (f" ({exc.context})" if exc.context else "")) from None
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML: {exc}") from None
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise ValueError(f"the top level must be a mapping of sections, not a "
                         f"{type(config).__name__}")
    return config


def _action(parser, dest):
    """The option that sets `dest` with a value (for a --x/--no-x pair, either one)."""
    for a in parser._actions:
        if a.dest == dest and a.option_strings:
            return a
    raise KeyError(dest)


def _checked(parser, section, key, value):
    """`value` as the flag for section.key would have it; ValueError naming the key."""
    dest = dict(SECTIONS[section])[key]
    action = _action(parser, dest)
    name = f"{section}.{key}"
    if action.nargs == 0:                         # a switch: --x / --no-x
        if not isinstance(value, bool):
            raise ValueError(f"{name}: {value!r} is not true or false")
        return (not value) if (section, key) in _NEGATED else value
    if key in _LISTS and isinstance(value, list):
        value = ",".join(str(v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        want = _KIND.get(action.type, "a string")
        raise ValueError(f"{name}: {value!r} is not {want}")
    convert = action.type or str
    try:
        value = convert(value if isinstance(value, str) else str(value))
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        raise ValueError(f"{name}: {value!r} is not {_KIND.get(action.type, 'valid')}") \
            from None
    if action.choices and value not in action.choices:
        raise ValueError(f"{name}: {value!r} is not one of {', '.join(action.choices)}")
    return value


def apply(parser, args, config):
    """Fill every flag the command line left unset (None) from the config's keys."""
    unknown = sorted(set(config) - set(SECTIONS) - {"controller"})
    if unknown:
        raise ValueError(f"unknown section(s) {', '.join(map(str, unknown))}; Horovod's "
                         f"are controller, {', '.join(SECTIONS)}")
    controller = config.get("controller")
    if controller is not None and not (args.use_gloo or args.use_mpi or args.use_jsrun):
        if str(controller).lower() not in ("gloo", "mpi"):
            raise ValueError(f"no such controller: {controller!r} (gloo or mpi)")
        setattr(args, "use_" + str(controller).lower(), True)
    for section, keys in SECTIONS.items():
        values = config.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ValueError(f"section {section!r} must be a mapping of keys, not "
                             f"{values!r}")
        extra = sorted(set(values) - {k for k, _ in keys})
        if extra:
            raise ValueError(f"unknown key(s) {', '.join(map(str, extra))} in section "
                             f"{section!r}")
        for key, dest in keys:
            if values.get(key) is not None and getattr(args, dest, None) is None:
                setattr(args, dest, _checked(parser, section, key, values[key]))
