#!/bin/sh
# A preemption notice script for EC2 spot instances (`ringmaster agent --preemption-notice-script`).
# AWS posts `spot/instance-action` (JSON with the action and its UTC time) two minutes before it
# stops or terminates the instance, and advises polling it every 5 seconds. Prints
# `drain SECONDS` once a notice is posted, nothing otherwise. IMDSv2: a session token first.
set -u
IMDS=http://169.254.169.254/latest
token=$(curl -s -m 2 -X PUT "$IMDS/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 60") || exit 0
action=$(curl -s -m 2 -f -H "X-aws-ec2-metadata-token: $token" "$IMDS/meta-data/spot/instance-action") || exit 0
# {"action": "terminate", "time": "2026-11-25T08:22:00Z"}
when=$(printf '%s' "$action" | sed -n 's/.*"time"[^"]*"\([^"]*\)".*/\1/p')
[ -n "$when" ] || { echo "drain 120"; exit 0; }
left=$(( $(date -u -d "$when" +%s) - $(date -u +%s) ))
[ "$left" -gt 0 ] || left=0
echo "drain $left"
