"""``horovodlike.run(fn, ...)``: Horovod's ``horovod.run``, on horovodlikerun.

The caller's function, arguments and keyword arguments are pickled into a private
directory (mode 0700), ``horovodlikerun`` starts N ranks of this module's task entry
point, each rank unpickles the function, calls it and pickles its return value (or the
exception it raised) into the same directory, and the caller reads the results back in
rank order. Nothing travels over a network port: the only pickles read are files that
this process and its own child processes wrote.

Functions are pickled by reference (module and name), so they must be importable by the
ranks. A function defined in the script being run (``__main__``) works the way
``multiprocessing``'s spawn start method makes it work: each rank runs the script as
module ``__mp_main__`` (its ``if __name__ == "__main__":`` block does not run) and finds
the function there. With cloudpickle installed, lambdas and closures work too.
"""

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import warnings

PAYLOAD = "payload.pkl"


def _have_cloudpickle():
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        return False
    return True


def _dumps(obj):
    if _have_cloudpickle():
        import cloudpickle
        return cloudpickle.dumps(obj)
    return pickle.dumps(obj)


def _elastic_args(**kw):
    return [k for k, v in kw.items() if v is not None]


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None,
        slots=None, reset_limit=None, cooldown_range=None, hosts=None, hostfile=None,
        host_discovery_script=None, start_timeout=None, ssh_port=None,
        ssh_identity_file=None, disable_cache=None, output_filename=None, verbose=None,
        use_gloo=None, use_mpi=None, mpi_args=None, network_interface=None,
        network_interfaces=None, executable=None, np=None, min_np=None, max_np=None):
    """Run ``func(*args, **kwargs)`` on ``num_proc`` ranks; return the results in rank order.

    The signature is ``horovod.run``'s. ``func`` must be picklable; each rank calls
    ``hvd.init()`` itself, as under horovodrun. If any rank fails, ``RuntimeError``
    names it (with the exception and traceback it raised, or its exit status).
    Elastic arguments (``min_num_proc``, ``max_num_proc``, ``slots``, ``reset_limit``,
    ``cooldown_range``, ``host_discovery_script``) raise ``NotImplementedError``.
    """
    if network_interface:
        warnings.warn("network_interface is deprecated, use network_interfaces instead",
                      DeprecationWarning)
        network_interfaces = network_interface.split(",")
    if np is not None:
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning)
        num_proc = np
    if min_np is not None:
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning)
        min_num_proc = min_np
    if max_np is not None:
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning)
        max_num_proc = max_np
    elastic = _elastic_args(min_num_proc=min_num_proc, max_num_proc=max_num_proc,
                            slots=slots, reset_limit=reset_limit,
                            cooldown_range=cooldown_range,
                            host_discovery_script=host_discovery_script)
    if elastic:
        raise NotImplementedError(f"horovodlike.run: {', '.join(elastic)}: elastic "
                                  f"training is not yet supported")
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    if not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"num_proc must be a positive integer, got {num_proc!r}")

    argv = ["-np", str(num_proc)]
    for flag, value in (("-H", hosts), ("--hostfile", hostfile),
                        ("--start-timeout", start_timeout), ("--ssh-port", ssh_port),
                        ("--ssh-identity-file", ssh_identity_file),
                        ("--output-filename", output_filename)):
        if value is not None:
            argv += [flag, str(value)]
    if mpi_args:
        argv.append(f"--mpi-args={mpi_args}")
    if network_interfaces:
        argv += ["--network-interfaces", ",".join(network_interfaces)]
    argv += [flag for flag, on in (("--disable-cache", disable_cache),
                                   ("--verbose", verbose), ("--gloo", use_gloo),
                                   ("--mpi", use_mpi)) if on]

    payload = _payload(func, tuple(args), dict(kwargs or {}))
    remote = _has_remote_hosts(hosts, hostfile)
    # Remote ranks start in the same working directory (as horovodlikerun does), so
    # the run directory must be there, on a filesystem every host shares.
    run_dir = tempfile.mkdtemp(prefix=".horovodlike-run-" if remote else "horovodlike-run-",
                               dir=os.getcwd() if remote else None)
    try:
        with open(os.path.join(run_dir, PAYLOAD), "wb") as f:
            f.write(payload)
        task = [executable or sys.executable, "-m", "horovodlike.runner.run_task",
                run_dir]
        code, tail = _launch(argv + ["--"] + task)
        return _collect(run_dir, num_proc, code, tail)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _payload(func, args, kwargs):
    main_path = None
    if getattr(func, "__module__", None) == "__main__" and not _have_cloudpickle():
        # cloudpickle would send it by value; plain pickle needs the ranks to find it.
        main_path = getattr(sys.modules.get("__main__"), "__file__", None)
        if main_path is None:
            raise ValueError(
                f"horovodlike.run: {getattr(func, '__qualname__', func)!r} is defined in an "
                f"interactive session, which the ranks cannot import; define it in a "
                f"module (or pip install cloudpickle)")
        main_path = os.path.abspath(main_path)
    try:
        body = _dumps((func, args, kwargs))
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(f"horovodlike.run: the function and its arguments must be "
                         f"picklable (a module-level function; pip install cloudpickle for "
                         f"lambdas and closures): {exc}") from None
    return pickle.dumps({"main_path": main_path, "sys_path": user_path(), "body": body})


def user_path():
    """The caller's import path minus the interpreter's own directories: where a rank
    looks for the caller's function (horovodlike.spark.run's tasks too)."""
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix,
                                              sys.exec_prefix)}
    out = []
    for p in sys.path:
        full = os.path.realpath(p or os.getcwd())
        if os.path.isdir(full) and not any(full == x or full.startswith(x + os.sep)
                                           for x in prefixes) and full not in out:
            out.append(full)
    return out


def _has_remote_hosts(hosts, hostfile):
    from .launch import is_local_host, parse_hosts
    from .args import parse_hostfile
    spec = parse_hostfile(hostfile) if hostfile else hosts
    return bool(spec) and not all(is_local_host(h) for h, _ in parse_hosts(spec))


def _relay(pipe, stream, tail):
    with pipe:
        for raw in iter(pipe.readline, b""):
            text = raw.decode("utf-8", "replace")
            if text.startswith("horovodlikerun:"):
                tail.append(text.rstrip("\n"))
            try:
                stream.write(text)
                stream.flush()
            except (ValueError, OSError):
                pass


def _launch(argv):
    """Run horovodlikerun, relaying its output through sys.stdout/sys.stderr (so a
    notebook shows it); return its exit code and its own messages."""
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "horovodlike.runner"] + argv, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    tail = []
    threads = [threading.Thread(target=_relay, args=(proc.stdout, sys.stdout, []),
                                daemon=True),
               threading.Thread(target=_relay, args=(proc.stderr, sys.stderr, tail),
                                daemon=True)]
    for t in threads:
        t.start()
    try:
        code = proc.wait()
    except BaseException:         # KeyboardInterrupt: stop the job, then re-raise
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    finally:
        for t in threads:
            t.join(timeout=5)
    return code, tail


def rank_failure(who, errors):
    """The RuntimeError for failed ranks: errors maps rank -> {summary (what it did, e.g.
    "raised ValueError: x"), traceback, time, secondary (its error only echoes another
    rank's loss)}. The cause is named first: a rank's own error before the
    HorovodInternalError its exit gave the others, then the earliest."""
    first = min(errors, key=lambda r: (errors[r]["secondary"], errors[r]["time"], r))
    others = sorted(set(errors) - {first})
    more = f" (ranks {others} failed too)" if others else ""
    return RuntimeError(f"{who}: rank {first} {errors[first]['summary']}{more}\n\n"
                        f"Traceback from rank {first}:\n{errors[first]['traceback']}")


def _collect(run_dir, num_proc, code, tail):
    results, errors = {}, {}
    for rank in range(num_proc):
        for kind, into in (("result", results), ("error", errors)):
            path = os.path.join(run_dir, f"{kind}.{rank}")
            if os.path.exists(path):
                with open(path, "rb") as f:     # written by our own child process
                    into[rank] = pickle.load(f)
    if errors:
        raise rank_failure("horovodlike.run", {r: dict(e, summary=f"raised {e['summary']}")
                                               for r, e in errors.items()})
    missing = [r for r in range(num_proc) if r not in results]
    if code != 0 or missing:
        why = "; ".join(tail) or f"horovodlikerun exited with code {code}"
        raise RuntimeError(f"horovodlike.run: the job failed: {why}"
                           + (f" (no result from ranks {missing})" if missing else ""))
    return [results[r] for r in range(num_proc)]
