"""horovodrun's command line under horovodlikerun: every option string parses, and the
ones that change what a job does are checked on real 2-rank launches."""
import importlib.util
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from horovodlike.common import launch_contract  # noqa: E402
from horovodlike.runner import args as cli  # noqa: E402
from horovodlike.runner.job_env import job_env  # noqa: E402
from horovodlike.runner.mpirun import mpirun_argv  # noqa: E402
from horovodlike.runner.launch import build_parser, parse_args  # noqa: E402

from harness import MPIRUN_SKIP_REASON, rank_program  # noqa: E402

if importlib.util.find_spec("pytest_timeout") is not None:
    pytestmark = pytest.mark.timeout(180)

# Every option string of Horovod 0.28.1's horovodrun (horovod/runner/launch.py).
HOROVODRUN_OPTIONS = [
    "-v", "--version", "-np", "--num-proc", "-cb", "--check-build", "--disable-cache",
    "--start-timeout", "--network-interfaces", "--network-interface", "--output-filename",
    "--verbose", "--config-file", "-p", "--ssh-port", "-i", "--ssh-identity-file",
    "--fusion-threshold-mb", "--cycle-time-ms", "--cache-capacity",
    "--hierarchical-allreduce", "--no-hierarchical-allreduce", "--hierarchical-allgather",
    "--no-hierarchical-allgather", "--torus-allreduce", "--no-torus-allreduce",
    "--autotune", "--no-autotune", "--autotune-log-file", "--autotune-warmup-samples",
    "--autotune-steps-per-sample", "--autotune-bayes-opt-max-samples",
    "--autotune-gaussian-process-noise", "--min-np", "--min-num-proc", "--max-np",
    "--max-num-proc", "--slots-per-host", "--elastic-timeout", "--reset-limit",
    "--blacklist-cooldown-range", "--timeline-filename", "--timeline-mark-cycles",
    "--no-timeline-mark-cycles", "--no-stall-check", "--stall-check",
    "--stall-check-warning-time-seconds", "--stall-check-shutdown-time-seconds",
    "--mpi-threads-disable", "--no-mpi-threads-disable", "--mpi-args", "--tcp",
    "--binding-args", "--num-nccl-streams", "--thread-affinity", "--gloo-timeout-seconds",
    "--log-level", "--log-with-timestamp", "--log-without-timestamp", "-prefix-timestamp",
    "--prefix-output-with-timestamp", "--log-hide-timestamp", "--no-log-hide-timestamp",
    "-H", "--hosts", "-hostfile", "--hostfile", "--host-discovery-script", "--gloo", "--mpi",
    "--jsrun",
]

ELASTIC_OPTIONS = {"--min-np": "2", "--min-num-proc": "2", "--max-np": "4",
                   "--max-num-proc": "4", "--slots-per-host": "2", "--elastic-timeout": "60",
                   "--reset-limit": "3", "--blacklist-cooldown-range": ["10", "100"],
                   "--host-discovery-script": "./discover.sh"}
EXITS_AT_ONCE = {"-v", "--version", "-cb", "--check-build"}


def _value(opt, tmp_path):
    """A valid value for an option that takes one (None for flags)."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=2\n")
    config = tmp_path / "config.yaml"
    config.write_text("params:\n  cycle_time_ms: 3\n")
    values = {
        "-np": "2", "--num-proc": "2", "--start-timeout": "30", "--network-interfaces": "lo",
        "--network-interface": "lo", "--output-filename": str(tmp_path / "out"),
        "--config-file": str(config), "-p": "2222", "--ssh-port": "2222",
        "-i": "/key", "--ssh-identity-file": "/key", "--fusion-threshold-mb": "32",
        "--cycle-time-ms": "2", "--cache-capacity": "512", "--autotune-log-file": "/x",
        "--autotune-warmup-samples": "3", "--autotune-steps-per-sample": "10",
        "--autotune-bayes-opt-max-samples": "20", "--autotune-gaussian-process-noise": "0.8",
        "--timeline-filename": str(tmp_path / "tl.json"),
        "--stall-check-warning-time-seconds": "60",
        "--stall-check-shutdown-time-seconds": "120", "--mpi-args": "--oversubscribe",
        "--binding-args": "--bind-to none", "--num-nccl-streams": "2",
        "--thread-affinity": "0", "--gloo-timeout-seconds": "30", "--log-level": "info",
        "-H": "localhost:2", "--hosts": "localhost:2", "-hostfile": str(hostfile),
        "--hostfile": str(hostfile),
    }
    values.update(ELASTIC_OPTIONS)
    return values.get(opt)


def _argv(opt, tmp_path):
    value = _value(opt, tmp_path)
    if isinstance(value, str) and value.startswith("-"):
        words = [f"{opt}={value}"]      # as Horovod's help says for --mpi-args
    else:
        words = [opt] + ([] if value is None else value if isinstance(value, list)
                         else [value])
    head = [] if opt in ("-np", "--num-proc") else ["-np", "2"]
    return head + words + ["python", "train.py"]


def test_every_horovodrun_option_string_is_declared():
    ours = set(cli.option_strings(build_parser()))
    missing = sorted(set(HOROVODRUN_OPTIONS) - ours)
    assert not missing, f"horovodrun options horovodlikerun lacks: {missing}"
    assert len(set(HOROVODRUN_OPTIONS)) == 71
    # Ours beyond horovodrun's: help, the ssh template and the shutdown grace.
    assert ours - set(HOROVODRUN_OPTIONS) == {"-h", "--help", "--ssh-command",
                                              "--shutdown-grace"}


def test_shutdown_grace_defaults_beyond_the_peer_timeout(monkeypatch, capsys):
    monkeypatch.delenv("HOROVODLIKE_PEER_TIMEOUT_SECONDS", raising=False)
    assert parse_args(["-np", "2", "python", "t.py"]).shutdown_grace == 35
    assert parse_args(["-np", "2", "--gloo-timeout-seconds", "4", "python",
                       "t.py"]).shutdown_grace == 9
    monkeypatch.setenv("HOROVODLIKE_PEER_TIMEOUT_SECONDS", "10")
    assert parse_args(["-np", "2", "python", "t.py"]).shutdown_grace == 15
    assert parse_args(["-np", "2", "--shutdown-grace", "2.5", "python",
                       "t.py"]).shutdown_grace == 2.5
    for bad in ("0", "-1", "nan"):
        with pytest.raises(SystemExit):
            parse_args(["-np", "2", f"--shutdown-grace={bad}", "python", "t.py"])
        assert "--shutdown-grace" in capsys.readouterr().err


@pytest.mark.parametrize("opt", HOROVODRUN_OPTIONS)
def test_every_option_string_parses(opt, tmp_path, capsys):
    argv = _argv(opt, tmp_path)
    if opt in EXITS_AT_ONCE:
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 0
        out = capsys.readouterr().out
        assert ("Available Frameworks" in out) if "c" in opt else re.match(r"\d+\.\d+", out)
        return
    args = parse_args(argv)
    assert args.command == ["python", "train.py"]
    assert args.num_proc == 2
    job_env(args)                       # every parsed combination maps to an env


def test_hostfile_short_form_is_not_help(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two hosts\nnode1 slots=2\n\nnode2 slots=3 max_slots=4\nnode3\n")
    args = parse_args(["-np", "5", "-hostfile", str(hosts), "python", "x.py"])
    assert args.host_list == [("node1", 2), ("node2", 3), ("node3", 1)]
    hosts.write_text("node1 slots=two\n")
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "--hostfile", str(hosts), "true"])


@pytest.mark.parametrize("pair", [
    ["--hierarchical-allreduce", "--no-hierarchical-allreduce"],
    ["--stall-check", "--no-stall-check"], ["--gloo", "--mpi"], ["-H", "--hostfile"],
    ["--log-with-timestamp", "--log-without-timestamp"]])
def test_exclusive_options_refused_together(pair, tmp_path):
    argv = ["-np", "2"]
    for opt in pair:
        argv += [opt] + ([_value(opt, tmp_path)] if _value(opt, tmp_path) else [])
    with pytest.raises(SystemExit) as exc:
        parse_args(argv + ["true"])
    assert exc.value.code == 2


def test_flags_map_to_horovods_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "17")
    env = job_env(parse_args([
        "-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
        "--cache-capacity", "0", "--no-hierarchical-allreduce", "--hierarchical-allgather",
        "--timeline-filename", "/t/x.json", "--no-timeline-mark-cycles", "--stall-check",
        "--stall-check-warning-time-seconds", "5", "--thread-affinity", "1,0",
        "--gloo-timeout-seconds", "12", "--log-level", "debug", "--log-with-timestamp",
        "--network-interfaces", "lo,lo", "--network-interface", "lo", "true"]))
    assert env == {
        "HOROVODLIKE_START_TIMEOUT": "17", "HOROVOD_START_TIMEOUT": "17",
        "HOROVOD_FUSION_THRESHOLD": str(32 * 1048576), "HOROVOD_CYCLE_TIME": "2.5",
        "HOROVOD_CACHE_CAPACITY": "0", "HOROVOD_HIERARCHICAL_ALLREDUCE": "0",
        "HOROVOD_HIERARCHICAL_ALLGATHER": "1", "HOROVOD_TIMELINE": "/t/x.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "0", "HOROVOD_STALL_CHECK_DISABLE": "0",
        "HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_THREAD_AFFINITY": "1,0",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "12", "HOROVODLIKE_PEER_TIMEOUT_SECONDS": "12",
        "HOROVOD_LOG_LEVEL": "DEBUG", "HOROVOD_LOG_HIDE_TIME": "0",
        "HOROVOD_GLOO_IFACE": "lo"}
    # --start-timeout wins over the variable; with neither, the default.
    assert job_env(parse_args(["-np", "1", "--start-timeout", "9", "true"]))[
        "HOROVODLIKE_START_TIMEOUT"] == "9"
    monkeypatch.delenv("HOROVOD_START_TIMEOUT")
    assert parse_args(["-np", "1", "true"]).start_timeout == \
        launch_contract.DEFAULT_START_TIMEOUT
    monkeypatch.setenv("HOROVOD_START_TIMEOUT", "soon")
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "true"])


def test_config_file_uses_horovods_keys_and_the_command_line_wins(tmp_path):
    config = tmp_path / "horovod.yaml"
    config.write_text(textwrap.dedent("""\
        # Horovod's example layout
        controller: mpi
        params:
          fusion_threshold_mb: 32
          cycle_time_ms: 10
          cache_capacity: 2048
          hierarchical_allreduce: false
          hierarchical_allgather: true
        timeline:
          filename: /tmp/timeline.json
          mark_cycles: true
        stall_check:
          enabled: false
          warning_time_seconds: 30
        library_options:
          thread_affinity: 0
          gloo_timeout_seconds: 40
        logging:
          level: debug
          with_timestamp: true
        """))
    args = parse_args(["-np", "2", "--config-file", str(config), "--cycle-time-ms", "7",
                       "--stall-check", "true"])
    env = job_env(args)
    assert args.use_mpi is True
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(32 * 1048576)
    assert env["HOROVOD_CYCLE_TIME"] == "7"                 # the flag wins
    assert env["HOROVOD_CACHE_CAPACITY"] == "2048"
    assert env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "0"
    assert env["HOROVOD_HIERARCHICAL_ALLGATHER"] == "1"
    assert env["HOROVOD_TIMELINE"] == "/tmp/timeline.json"
    assert env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "0"        # --stall-check wins
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "30"
    assert env["HOROVOD_THREAD_AFFINITY"] == "0"
    assert env["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "40"
    assert env["HOROVOD_LOG_LEVEL"] == "DEBUG"
    assert env["HOROVOD_LOG_HIDE_TIME"] == "0"


def test_config_file_is_yaml(tmp_path):
    """The file is real YAML (PyYAML's safe_load): flow mappings and lists, quoting,
    YAML 1.1's booleans; each value checked as its flag would be."""
    config = tmp_path / "horovod.yaml"
    config.write_text(textwrap.dedent("""\
        params: {fusion_threshold_mb: 1.5e+1, cycle_time_ms: "3", hierarchical_allreduce: yes}
        stall_check:
          enabled: off
          warning_time_seconds: 12
        library_options:
          thread_affinity: [0, 2]     # one core per local rank
        timeline: {filename: 'a file: with a colon.json', mark_cycles: on}
        logging: {level: Info}
        """))
    args = parse_args(["-np", "2", "--config-file", str(config), "true"])
    env = job_env(args)
    assert env["HOROVOD_FUSION_THRESHOLD"] == str(15 * 1048576)
    assert env["HOROVOD_CYCLE_TIME"] == "3"                   # "3" read as --cycle-time-ms 3
    assert env["HOROVOD_HIERARCHICAL_ALLREDUCE"] == "1"       # yes
    assert env["HOROVOD_STALL_CHECK_DISABLE"] == "1"          # enabled: off
    assert env["HOROVOD_STALL_CHECK_TIME_SECONDS"] == "12"
    assert env["HOROVOD_THREAD_AFFINITY"] == "0,2"
    assert env["HOROVOD_TIMELINE"] == "a file: with a colon.json"
    assert env["HOROVOD_TIMELINE_MARK_CYCLES"] == "1"         # on
    assert env["HOROVOD_LOG_LEVEL"] == "INFO"
    # An empty file, or one of comments only, sets nothing.
    config.write_text("# nothing yet\n")
    assert job_env(parse_args(["-np", "1", "--config-file", str(config), "true"])) == \
        job_env(parse_args(["-np", "1", "true"]))


@pytest.mark.parametrize("text, complaint", [
    ("params:\n  fusion_threshold_mb: -1\n", "must be >= 0"),
    ("params:\n  fusion_treshold_mb: 1\n", "unknown key(s) fusion_treshold_mb"),
    ("parameters:\n  x: 1\n", "unknown section(s) parameters"),
    ("controller: nccl\n", "no such controller"),
    ("- a list\n", "the top level must be a mapping of sections, not a list"),
    # Malformed YAML: where, and what.
    ("params:\n  cycle_time_ms: 1\n bad indent: 2\n", "not valid YAML: line 3, column 2"),
    ("params: {cycle_time_ms: 1\n", "not valid YAML: line 2"),
    ("params:\n\tcycle_time_ms: 1\n", "not valid YAML: line 2, column 1"),
    # A value of the wrong kind names its section and key.
    ("params:\n  cache_capacity: 1.5\n", "params.cache_capacity: 1.5 is not a whole number"),
    ("params:\n  cycle_time_ms: fast\n", "params.cycle_time_ms: 'fast' is not a number"),
    ("params:\n  fusion_threshold_mb: yes\n",
     "params.fusion_threshold_mb: True is not a number"),
    ("params:\n  hierarchical_allreduce: 1\n",
     "params.hierarchical_allreduce: 1 is not true or false"),
    ("stall_check:\n  enabled: maybe\n", "stall_check.enabled: 'maybe' is not true or false"),
    ("logging:\n  level: loud\n", "logging.level: 'LOUD' is not one of TRACE, DEBUG"),
    ("timeline: [a, b]\n", "section 'timeline' must be a mapping of keys"),
    ("timeline:\n  filename: {a: 1}\n", "timeline.filename: {'a': 1} is not a string"),
])
def test_bad_config_file_is_a_clear_error(text, complaint, tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(SystemExit) as exc:
        parse_args(["-np", "1", "--config-file", str(config), "true"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    if "must be >= 0" not in complaint:    # the range checks cover flags and file alike
        assert f"--config-file {config}: " in err, err      # the file is named
    assert complaint in err, err


def test_missing_config_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "--config-file", str(tmp_path / "none.yaml"), "true"])
    err = capsys.readouterr().err
    assert f"--config-file {tmp_path / 'none.yaml'}: " in err and "No such file" in err, err


@pytest.mark.parametrize("argv,said", [
    (["-np", "2", "--verbos", "python", "t.py"], "--verbos (did you mean --verbose?)"),
    (["--num-proces", "2", "python", "t.py"], "--num-proces (did you mean --num-proc?)"),
    (["-np", "2", "--start-timeot=3", "python", "t.py"],
     "--start-timeot=3 (did you mean --start-timeout?)"),
    (["-np", "2", "--zzzz", "python", "t.py"], "unrecognized arguments: --zzzz\n"),
])
def test_a_mistyped_flag_gets_a_did_you_mean(argv, said, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert said in err, err


def test_a_python_script_given_as_the_command_gets_the_python_hint(tmp_path, capsys,
                                                                   monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    with pytest.raises(SystemExit) as exc:
        parse_args(["-np", "2", "train.py", "--lr", "0.1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert ("train.py is a Python script, not an executable: run it with python, as in "
            "`horovodlikerun -np 2 python train.py --lr 0.1`") in err, err
    # An executable script (with its #! line) runs as it is.
    (tmp_path / "run.py").write_text("#!/usr/bin/env python3\n")
    (tmp_path / "run.py").chmod(0o755)
    assert parse_args(["-np", "2", "./run.py"]).command == ["./run.py"]


def test_ssh_port_and_identity_go_into_the_ssh_command():
    args = parse_args(["-np", "1", "-p", "2222", "-i", "/home/u/.ssh/id key", "true"])
    assert args.ssh_command.split()[:5] == ["ssh", "-p", "2222", "-i", "'/home/u/.ssh/id"]
    assert args.ssh_command.endswith("{host} {command}")
    with pytest.raises(SystemExit):
        parse_args(["-np", "1", "-p", "22", "--ssh-command", "rsh {host} {command}", "true"])


def test_mpirun_command_line_follows_horovod():
    args = parse_args(["-np", "4", "-H", "a:2,b:2", "--mpi", "--tcp", "-p", "2200",
                       "--network-interface", "eth0", "--binding-args=-bind-to core",
                       "--mpi-args=-x FOO --map-by ppr:2:node", "-prefix-timestamp",
                       "--output-filename", "/o", "python", "t.py"])
    argv = mpirun_argv(args, {"HOROVOD_CYCLE_TIME": "2", "BASH_FUNC_x%%": "y"},
                           "openmpi5")
    line = " ".join(argv)
    assert argv[:6] == ["mpirun", "--allow-run-as-root", "--tag-output", "-np", "4", "-H"]
    assert "a:2,b:2" in argv
    assert "--bind-to core" in line and "--bind-to none" not in line
    assert "-mca btl self,tcp" in line and "-mca pml ob1" in line
    assert "-mca plm_rsh_args" in line and "-p 2200" in argv
    assert "-mca btl_tcp_if_include eth0" in line and "-x NCCL_SOCKET_IFNAME=eth0" in line
    assert "--timestamp-output" in argv and "--output dir=/o" in line
    assert "-x HOROVOD_CYCLE_TIME" in line and "BASH_FUNC" not in line
    assert argv[-6:] == ["-x", "FOO", "--map-by", "ppr:2:node", "python", "t.py"]
    mpich = mpirun_argv(args, {}, "mpich")
    assert mpich[:2] == ["mpirun", "-l"] and "-ppn" in mpich and "-hosts" in mpich


# ------------------------------------------------------------------ real launches


def launcher_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    for k in list(env):
        if k.startswith(("HOROVOD_", "HOROVODLIKE_", "OMPI_COMM_WORLD", "PMI_", "PMIX_")):
            del env[k]
    env.update(extra)
    return env


def launch(args, timeout=90, cwd=None, **env):
    return subprocess.run([sys.executable, "-m", "horovodlike.runner", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=launcher_env(**env), start_new_session=True)


ALLREDUCE = rank_program("launch_cli_allreduce")


def test_output_filename_writes_horovods_per_rank_layout(tmp_path):
    out = tmp_path / "logs"
    res = launch(["-np", "2", "--output-filename", str(out), "-prefix-timestamp",
                  sys.executable, str(ALLREDUCE)])
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["rank.0", "rank.1"]
    stamp = r"\w{3} \w{3} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    for rank in (0, 1):
        stdout = (out / f"rank.{rank}" / "stdout").read_text()
        stderr = (out / f"rank.{rank}" / "stderr").read_text()
        assert re.fullmatch(stamp + rf"\[{rank}\]<stdout>:sum \[3\.0, 3\.0, 3\.0, 3\.0\] "
                            r"iface None\n", stdout), stdout
        assert re.search(stamp + rf"\[{rank}\]<stderr>:to stderr {rank}\n", stderr), stderr
        # The terminal gets the same lines.
        assert re.search(stamp + rf"\[{rank}\]<stdout>:sum", res.stdout)


def test_output_filename_pads_ranks_like_horovod():
    from horovodlike.runner.rank_output import pad_rank
    assert [pad_rank(r, 11) for r in (0, 3, 10)] == ["00", "03", "10"]
    assert pad_rank(0, 1) == "0" and pad_rank(9, 10) == "9" and pad_rank(99, 101) == "099"


def test_network_interface_reaches_the_ranks_and_a_missing_one_is_refused():
    res = launch(["-np", "2", "--network-interface", "lo", sys.executable, str(ALLREDUCE)])
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("sum [3.0, 3.0, 3.0, 3.0] iface lo") == 2, res.stdout
    names = {n for _, n in socket.if_nameindex()}
    bogus = next(f"nosuch{i}" for i in range(100) if f"nosuch{i}" not in names)
    res = launch(["-np", "2", "--network-interface", bogus, "true"])
    assert res.returncode == 2 and f"network interface {bogus} does not exist" in res.stderr


def test_hostfile_and_notices_on_a_real_launch(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost slots=2\n")
    res = launch(["-np", "2", "-hostfile", str(hosts), "--num-nccl-streams",
                  "2", "--disable-cache", "--jsrun", sys.executable, str(ALLREDUCE)])
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("sum [3.0, 3.0, 3.0, 3.0]") == 2
    notices = [l for l in res.stderr.splitlines() if " ignored: " in l]
    assert [l.split()[1] for l in notices] == [
        "--num-nccl-streams", "--jsrun", "--disable-cache"], res.stderr


LATE_RANK = rank_program("launch_cli_late_rank")


def test_start_timeout_from_horovod_start_timeout():
    t0 = time.monotonic()
    res = launch(["-np", "2", sys.executable, str(LATE_RANK)], HOROVOD_START_TIMEOUT="3")
    elapsed = time.monotonic() - t0
    assert res.returncode != 0
    assert "within 3 s" in res.stderr, res.stderr
    assert elapsed < 30, elapsed


AFFINITY = rank_program("launch_cli_affinity")


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or
                    not {0, 1} <= os.sched_getaffinity(0), reason="needs cores 0 and 1")
@pytest.mark.parametrize("spec, cores", [("0", ["0", "1"]), ("1,0", ["1", "0"])])
def test_thread_affinity_pins_the_engine_thread(spec, cores):
    res = launch(["-np", "2", "--thread-affinity", spec, sys.executable, str(AFFINITY)])
    assert res.returncode == 0, res.stderr
    for rank, core in enumerate(cores):
        line = next(l for l in res.stdout.splitlines() if l.startswith(f"[{rank}]<stdout>:"))
        assert "unchanged True" in line, line
        # The engine's thread (and its timeline writer, if any) sit on the one core.
        others = re.search(r"others \[(.*)\]", line).group(1)
        assert f"'{core}'" in others, line
        assert line.split()[1] != core       # the main thread keeps its wider mask


def test_log_with_timestamp_stamps_engine_log_lines():
    res = launch(["-np", "2", "--log-level", "INFO", "--log-with-timestamp",
                  sys.executable, str(ALLREDUCE)])
    assert res.returncode == 0, res.stderr
    engine_lines = [l for l in res.stderr.splitlines() if "[horovodlike rank" in l]
    assert engine_lines, res.stderr
    for l in engine_lines:
        assert re.match(r"\[\d\]<stderr>:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}\] "
                        r"\[horovodlike rank \d\]", l), l
    res = launch(["-np", "2", "--log-level", "INFO", sys.executable, str(ALLREDUCE)])
    assert re.search(r"<stderr>:\[horovodlike rank \d\]", res.stderr), res.stderr


def test_ssh_port_and_identity_file_reach_ssh(tmp_path):
    # A stand-in ssh records its arguments and runs the command here.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "ssh-args"
    (bin_dir / "ssh").write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$1 $2 $3 $4 $5 $6 $7 $8 $9" >> {record}
        for last; do :; done
        exec /bin/sh -c "$last"
        """))
    (bin_dir / "ssh").chmod(0o755)
    res = launch(["-np", "2", "-H", "nodea:1,nodeb:1", "-p", "2222", "-i", "/keys/id",
                  sys.executable, str(ALLREDUCE)],
                 PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                 HOROVODLIKE_STORE_HOST="127.0.0.1", HOROVODLIKE_IFACE_ADDR="127.0.0.1")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("sum [3.0, 3.0, 3.0, 3.0]") == 2, res.stdout
    calls = record.read_text().splitlines()
    assert len(calls) == 2
    for call, host in zip(sorted(calls, key=lambda c: "nodeb" in c), ("nodea", "nodeb")):
        assert call == f"-p 2222 -i /keys/id -o BatchMode=yes -o StrictHostKeyChecking=no {host}"


def test_check_build_and_version_from_the_command_line():
    res = launch(["--check-build"])
    assert res.returncode == 0, res.stderr
    assert "Available Frameworks:" in res.stdout and "[X] Gloo" in res.stdout
    torch_box = "[X]" if importlib.util.find_spec("torch") else "[ ]"
    assert f"{torch_box} PyTorch" in res.stdout
    res = launch(["-v"])
    assert res.returncode == 0 and re.fullmatch(r"\d+\.\d+\.\d+\S*\n", res.stdout)


@pytest.mark.skipif(MPIRUN_SKIP_REASON is not None, reason=MPIRUN_SKIP_REASON or "")
def test_mpi_runs_the_job_through_mpirun(tmp_path):
    res = launch(["-np", "2", "--mpi", "--verbose", "--mpi-args=--oversubscribe",
                  "--binding-args=-bind-to none", "--cycle-time-ms", "3",
                  sys.executable, str(ALLREDUCE), "--mpi-details"],
                 timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "horovodlikerun: mpirun " in res.stderr and "--bind-to none" in res.stderr
    assert res.stdout.count("mpi 2 sum [3.0, 3.0, 3.0, 3.0]") == 2, res.stdout
    assert res.stdout.count("ct 3") == 2


def test_elastic_flags_start_elastic_mode():
    # (the elastic jobs themselves: tests/test_elastic_*.py)
    res = launch(["-np", "2", "--min-np", "3", "--max-np", "4", "true"])
    assert res.returncode == 2
    assert "--min-np (3) <= -np (2)" in res.stderr, res.stderr
