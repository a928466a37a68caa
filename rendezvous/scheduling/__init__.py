"""Scheduling many elastic jobs on one pool of hosts: pure policies that say each job's size and
hosts (`plan.schedule`), driven by the pool service and by the trace simulator alike."""
