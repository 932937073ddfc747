"""Rank program of tests/test_runner.py, run by
test_output_prefixes_partial_lines_and_binary_junk: a line on stderr, then on stdout a
line and a partial one that is not UTF-8."""
import sys


def main():
    sys.stderr.write("warn\n")
    sys.stderr.flush()
    sys.stdout.buffer.write(b"line one\npartial \xff\xfe")


if __name__ == "__main__":
    main()
