"""Rank program of tests/test_elastic_hangs.py, run by
test_hanging_discovery_script_does_not_outlive_the_job: joins the job and stays in it
3 s, long enough for the driver to run the discovery script again, then ends."""
import time

import horovodlike as hvd


def main():
    hvd.init()
    time.sleep(3)


if __name__ == "__main__":
    main()
