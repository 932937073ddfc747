"""Rank program of tests/test_runner.py, run by test_signal_to_launcher_is_forwarded_to_ranks:
catches the signal numbered argv[1], prints "caught <NAME>" and exits 0; prints "ready"
once its handler is in place."""
import signal
import sys
import time


def handler(signum, frame):
    print("caught", signal.Signals(signum).name, flush=True)
    sys.exit(0)


def main():
    signal.signal(int(sys.argv[1]), handler)
    print("ready", flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main()
