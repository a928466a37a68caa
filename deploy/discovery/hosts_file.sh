#!/bin/sh
# Example host discovery script: hosts listed in a file that an operator (or a scheduler)
# edits to grow or shrink the job. Lines are "host:slots"; '#' starts a comment.
exec cat "${RINGMASTER_HOSTS_FILE:-/etc/ringmaster/hosts}"
