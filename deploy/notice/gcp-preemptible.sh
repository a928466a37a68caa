#!/bin/sh
# A preemption notice script for GCE preemptible and spot VMs (`--preemption-notice-script`).
# The metadata server's `instance/preempted` turns TRUE when the VM is being preempted; GCE
# gives 30 seconds (then ACPI soft-off). Prints `drain 30` then, nothing otherwise.
set -u
preempted=$(curl -s -m 2 -f -H "Metadata-Flavor: Google" \
  "http://metadata.google.internal/computeMetadata/v1/instance/preempted") || exit 0
[ "$preempted" = "TRUE" ] && echo "drain 30"
exit 0
