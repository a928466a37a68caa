"""What runs on a host: `agent` (the daemon that starts and stops training processes) and
`train` (the machinery behind the user API, `ringmaster.torch`, which lives in `worker/torch`)."""
