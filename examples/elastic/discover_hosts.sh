#!/bin/sh
# Host discovery for the elastic examples: prints the file named by ELASTIC_HOSTS_FILE
# (default: hosts.txt in the directory horovodlikerun was started from), one
# "host:slots" per line. Edit the file while the job runs to add or remove hosts.
cat "${ELASTIC_HOSTS_FILE:-hosts.txt}"
