"""How a rank's process ended, in the words every launcher uses.

horovodlikerun (static and elastic) and horovodlike.spark.run say it the same way, so
a log reads alike whichever started the job, and tests match one phrase.
"""
import signal


def _signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown"


def exit_text(code):
    """'exited with code N' or 'was killed by signal N (NAME)' from a wait status
    (Popen.returncode: negative for a signal). A shell between us and the process (ssh,
    sh -c) reports a signal death as exit code 128 + N, which is said as the likely
    signal."""
    if code < 0:
        return f"was killed by signal {-code} ({_signal_name(-code)})"
    if code > 128 and _signal_name(code - 128) != "unknown":
        return f"exited with code {code} (killed by {_signal_name(code - 128)}?)"
    return f"exited with code {code}"


def exit_status(code):
    """The launcher's own exit status for a job that ended with this rank's `code`:
    the rank's code, or 128 + N for a signal, as a shell reports it."""
    return 128 - code if code < 0 else code
