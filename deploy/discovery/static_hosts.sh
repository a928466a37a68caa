#!/bin/sh
# Example host discovery script: print one "host:slots" line per usable host.
# Ringmaster runs it every --discovery-interval; a non-zero exit or a malformed line keeps
# the last good host set (and, at start, refuses to begin).
cat <<HOSTS
node1:4
node2:4
HOSTS
