"""What each rank of ``horovodlike.run`` runs: ``python -m horovodlike.runner.run_task DIR``.

It reads the function its caller pickled into DIR, calls it, and writes
``DIR/result.<rank>`` (the pickled return value) or ``DIR/error.<rank>`` (the
exception's summary and traceback), replacing the file atomically. DIR is the private
directory the caller made; nothing here reads from the network.
"""
import logging
import os
import pickle
import runpy
import sys
import time
import traceback
import types

from horovodlike.runner.run_fn import PAYLOAD


def _load_main(path):
    """Run the caller's script as __mp_main__ so its functions can be unpickled."""
    module = types.ModuleType("__mp_main__")
    module.__file__ = path
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))


def _rank():
    from horovodlike.common.bootstrap import detect
    _, rank, _ = detect()
    return rank


def _write(run_dir, name, obj):
    tmp = os.path.join(run_dir, f".{name}.tmp")
    with open(tmp, "wb") as f:
        f.write(obj)
    os.replace(tmp, os.path.join(run_dir, name))


def _task_main(run_dir):
    rank = _rank()
    try:
        path = os.path.join(run_dir, PAYLOAD)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} is not on this host: horovodlike.run with remote hosts needs the "
                f"working directory on a filesystem every host shares")
        with open(path, "rb") as f:      # written by the caller, our parent
            payload = pickle.load(f)
        for p in reversed(payload["sys_path"]):
            if p not in sys.path:
                sys.path.insert(0, p)
        if payload["main_path"] and os.path.exists(payload["main_path"]):
            _load_main(payload["main_path"])
        func, args, kwargs = pickle.loads(payload["body"])
        result = func(*args, **kwargs)
        _write(run_dir, f"result.{rank}", pickle.dumps(result))
    except BaseException as exc:
        summary = f"{type(exc).__name__}: {exc}"
        _write(run_dir, f"error.{rank}", pickle.dumps(
            {"summary": summary, "traceback": traceback.format_exc(), "time": time.time(),
             "secondary": type(exc).__name__ == "HorovodInternalError"}))
        logging.getLogger("horovodlike.run").error("horovodlike.run: rank %s: %s", rank,
                                                   summary)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m horovodlike.runner.run_task RUN_DIR")
    sys.exit(_task_main(sys.argv[1]))
