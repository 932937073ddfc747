"""Shared by the elastic tests: run a job under horovodlikerun's elastic mode on fake
hosts (``--ssh-command "sh -c {command}"``), with a discovery script that prints a
host file the test (or the job itself) may rewrite while the job runs."""
import os
import stat
import threading
import time

from harness import leaked_segments, run_ranks

FAKE_NODES = ["--ssh-command", "sh -c {command}"]


def records(res, tag):
    """[(worker id, {key: value})] for every stdout line 'tag k=v k=v ...'."""
    out = []
    for wid, lines in sorted(res.rank_lines().items()):
        for line in lines:
            if line.startswith(tag + " "):
                out.append((wid, dict(kv.split("=", 1) for kv in line.split()[1:])))
    return out


def run_elastic(script, tmp_path, hosts, np_, min_np, max_np, env=None, extra=(),
                timeout=300, on_marker=None):
    """Run `script` elastically. hosts: the discovery's first answer. on_marker:
    (marker file, seconds, new hosts): once the job creates the marker file, wait that
    long and rewrite the host file (a host coming back later, say)."""
    hostfile = tmp_path / "hosts"
    hostfile.write_text(hosts)
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hostfile}\n")
    discover.chmod(discover.stat().st_mode | stat.S_IXUSR)
    env = dict(env or {}, EL_HOSTFILE=str(hostfile))
    stop = threading.Event()
    if on_marker:
        marker, delay, later = on_marker

        def rewrite():
            while not stop.wait(0.2):
                if os.path.exists(marker):
                    time.sleep(delay)
                    hostfile.write_text(later)
                    return
        threading.Thread(target=rewrite, daemon=True).start()
    args = ["--min-np", str(min_np), "--max-np", str(max_np),
            "--host-discovery-script", str(discover), *FAKE_NODES, *extra]
    try:
        return run_ranks(script, np=np_, launcher_args=args, env=env, timeout=timeout)
    finally:
        stop.set()
        assert not leaked_segments()
