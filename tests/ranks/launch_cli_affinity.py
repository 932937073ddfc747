"""Rank program of tests/test_launch_cli.py, run by
test_thread_affinity_pins_the_engine_thread."""
import os
import threading
import horovodlike as hvd


def main():
    main_before = os.sched_getaffinity(0)
    hvd.init()
    masks = {}
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    masks[int(tid)] = line.split()[1]
    hvd.barrier()            # nobody shuts down (ending the peers' engines) before all looked
    main = masks.pop(threading.get_native_id())
    print("main", main, "unchanged", os.sched_getaffinity(0) == main_before,
          "others", sorted(masks.values()), flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
