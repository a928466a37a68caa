"""Hosts from a Slurm allocation: its nodes (`SLURM_JOB_NODELIST`, expanded by `scontrol show
hostnames`), less those Slurm marks down, drained, failed or not responding, with their slots.

Slots per node: `--slots-per-host` when given, else `SLURM_GPUS_ON_NODE`, else
`SLURM_NTASKS_PER_NODE`, else `SLURM_TASKS_PER_NODE` (per node, in the allocation's order:
`2(x3),1`), else 1. Node states come from `sinfo` at every poll, so a node an administrator
drains (or Slurm marks DOWN) leaves the job at its next commit, and one that comes back joins.
The parsing is pure functions; `SlurmDiscovery` runs the two commands with a bound on time and
output, as a discovery script is run.
"""

from __future__ import annotations

import os
import re
import shlex
from typing import Mapping

from ringmaster.common.bounded_run import failure_detail, run_bounded
from ringmaster.discovery.errors import DiscoveryError
from ringmaster.discovery.parse import MAX_HOSTS, MAX_SLOTS_PER_HOST, host_name_problem

#: Node states (sinfo's compact `%t`, suffixes stripped) in which a node runs no new work.
UNUSABLE_STATES = ("down", "drain", "drng", "fail", "failg", "maint", "boot", "inval", "npc", "futr", "unk", "pow_dn",
                   "powered_down", "powering_down", "reboot")
#: Suffixes of a compact state that mean the node is not usable (`*`: not responding; `~`:
#: powered off; `#`: powering up; `%`: powering down; `!`: pending power down).
UNUSABLE_SUFFIXES = ("*", "~", "#", "%", "!")
_TASKS = re.compile(r"([0-9]{1,6})(?:\(x([0-9]{1,6})\))?")


def tasks_per_node(value: str) -> list[int]:
    """`SLURM_TASKS_PER_NODE` (`2(x3),1`) as one count per node, in the allocation's order."""
    counts: list[int] = []
    for part in value.split(","):
        match = _TASKS.fullmatch(part.strip())
        if match is None:
            raise DiscoveryError(f"SLURM_TASKS_PER_NODE={value[:100]!r}: {part[:40]!r} is not COUNT or COUNT(xNODES)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
        if len(counts) > MAX_HOSTS:
            raise DiscoveryError(f"SLURM_TASKS_PER_NODE={value[:100]!r} names more than {MAX_HOSTS} nodes")
    return counts


def slots_of_nodes(nodes: list[str], environ: Mapping[str, str], slots_per_host: int | None) -> dict[str, int]:
    """Each node's slots, by the first of: --slots-per-host, SLURM_GPUS_ON_NODE,
    SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE, 1."""
    if slots_per_host is not None:
        return {node: slots_per_host for node in nodes}
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_NTASKS_PER_NODE"):
        text = environ.get(name, "").strip()
        if text:
            if not text.isdigit() or not 0 < int(text) <= MAX_SLOTS_PER_HOST:
                raise DiscoveryError(f"{name}={text[:40]!r} is not a slot count from 1 to {MAX_SLOTS_PER_HOST}; "
                                     "give --slots-per-host N")
            return {node: int(text) for node in nodes}
    per_node = environ.get("SLURM_TASKS_PER_NODE", "").strip()
    if per_node:
        counts = tasks_per_node(per_node)
        if len(counts) != len(nodes):
            raise DiscoveryError(f"SLURM_TASKS_PER_NODE={per_node[:100]!r} counts {len(counts)} nodes, the allocation "
                                 f"has {len(nodes)}; give --slots-per-host N")
        bad = [c for c in counts if not 0 < c <= MAX_SLOTS_PER_HOST]
        if bad:
            raise DiscoveryError(f"SLURM_TASKS_PER_NODE={per_node[:100]!r}: {bad[0]} is not a slot count from 1 to "
                                 f"{MAX_SLOTS_PER_HOST}")
        return dict(zip(nodes, counts))
    return {node: 1 for node in nodes}


def parse_node_names(text: str) -> list[str]:
    """`scontrol show hostnames` output: one node name per line, each a valid host name."""
    nodes = [line.strip() for line in text.splitlines() if line.strip()]
    if not nodes:
        raise DiscoveryError("scontrol show hostnames printed no node of the allocation")
    if len(nodes) > MAX_HOSTS:
        raise DiscoveryError(f"the allocation has {len(nodes)} nodes, more than {MAX_HOSTS}")
    for node in nodes:
        problem = host_name_problem(node)
        if problem:
            raise DiscoveryError(f"scontrol show hostnames: {problem}")
    return nodes


def usable_nodes(sinfo: str, nodes: list[str]) -> tuple[list[str], dict[str, str]]:
    """From `sinfo -h -N -o '%N %t'` output: the nodes of `nodes` that can run work now, in the
    allocation's order, and why each other one cannot (its state). A node sinfo does not list
    is not usable."""
    states: dict[str, str] = {}
    for line in sinfo.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in nodes:
            states[parts[0]] = parts[1][:40]
    usable, why = [], {}
    for node in nodes:
        state = states.get(node)
        if state is None:
            why[node] = "not listed by sinfo"
        elif state.endswith(UNUSABLE_SUFFIXES) or state.rstrip("*~#%!$@^-+").lower() in UNUSABLE_STATES:
            why[node] = state
        else:
            usable.append(node)
    return usable, why


class SlurmDiscovery:
    """The nodes of the Slurm job this process runs in (`SLURM_JOB_ID`, `SLURM_JOB_NODELIST`)."""

    def __init__(self, environ: Mapping[str, str] | None = None, slots_per_host: int | None = None,
                 timeout_s: float = 10.0) -> None:
        self._environ = dict(os.environ if environ is None else environ)
        self._slots_per_host = slots_per_host
        self._timeout_s = timeout_s
        self.job_id = self._environ.get("SLURM_JOB_ID", "")
        self.nodelist = self._environ.get("SLURM_JOB_NODELIST") or self._environ.get("SLURM_NODELIST") or ""
        if not self.nodelist:
            raise DiscoveryError("--launcher slurm needs a Slurm allocation (SLURM_JOB_NODELIST is not set): run it in "
                                 "an sbatch script or salloc, or give -H / --host-discovery-script")
        self._nodes: list[str] | None = None
        self.unusable: dict[str, str] = {}  # node -> its state, as of the last poll

    def describe(self) -> str:
        return f"Slurm job {self.job_id or '?'}'s nodes {self.nodelist[:200]}"

    def _run(self, command: str) -> str:
        try:
            outcome, code, stdout, stderr = run_bounded(command, self._timeout_s, env=self._environ)
        except OSError as exc:
            raise DiscoveryError(f"cannot run {command.split()[0]}: {exc}") from None
        if outcome != "done":
            raise DiscoveryError(
                f"{command[:80]}: "
                + ("took longer than %g s" % self._timeout_s if outcome == "timeout" else "printed too much")
            )
        if code != 0:
            raise DiscoveryError(failure_detail(command[:80], code or 0, stderr))
        return stdout.decode(errors="replace")

    def nodes(self) -> list[str]:
        """The allocation's nodes (asked of scontrol once: an allocation keeps its nodes)."""
        if self._nodes is None:
            self._nodes = parse_node_names(self._run(f"scontrol show hostnames {shlex.quote(self.nodelist)}"))
        return self._nodes

    def find_hosts(self) -> dict[str, int]:
        nodes = self.nodes()
        listed = self._run(f"sinfo -h -N -o '%N %t' -n {shlex.quote(','.join(nodes))}")
        usable, self.unusable = usable_nodes(listed, nodes)
        slots = slots_of_nodes(nodes, self._environ, self._slots_per_host)
        return {node: slots[node] for node in usable}
