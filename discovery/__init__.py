"""Host discovery: which hosts a job may use and how many slots each has.

`HostDiscovery` is the one interface; `StaticDiscovery` (``-H``) and `ScriptDiscovery`
(``--host-discovery-script``) implement it. Parsing, diffing and blacklisting are pure
functions and classes so they are tested without processes.
"""

from ringmaster.discovery.blacklist import Blacklist, CooldownRange
from ringmaster.discovery.diff import HostDiff, diff_hosts
from ringmaster.discovery.errors import DiscoveryError
from ringmaster.discovery.interface import HostDiscovery, Hosts
from ringmaster.discovery.parse import (
    MAX_HOSTS,
    MAX_SLOTS_PER_HOST,
    host_name_problem,
    parse_host_lines,
    parse_hosts_flag,
)
from ringmaster.discovery.script import ScriptDiscovery
from ringmaster.discovery.static import StaticDiscovery

__all__ = [
    "Blacklist",
    "CooldownRange",
    "DiscoveryError",
    "HostDiff",
    "MAX_HOSTS",
    "MAX_SLOTS_PER_HOST",
    "HostDiscovery",
    "Hosts",
    "ScriptDiscovery",
    "StaticDiscovery",
    "diff_hosts",
    "host_name_problem",
    "parse_host_lines",
    "parse_hosts_flag",
]
