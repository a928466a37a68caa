"""The `ringmaster` command: every verb (run, serve, agent, scale) in one place."""
