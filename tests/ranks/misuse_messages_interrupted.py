"""Rank program of tests/test_misuse_messages.py, run by
test_ctrl_c_prints_one_line_per_rank."""
import time
import horovodlike as hvd


def main():
    hvd.init()
    print("ready", flush=True)
    time.sleep(60)


if __name__ == "__main__":
    main()
