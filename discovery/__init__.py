"""Host discovery: which hosts a job may use and how many slots each has.

`HostDiscovery` is the one interface; `StaticDiscovery` (``-H``) and `ScriptDiscovery`
(``--host-discovery-script``) implement it. Parsing, diffing and blacklisting are pure
functions and classes so they are tested without processes.
"""

from discovery.blacklist import Blacklist, CooldownRange
from discovery.diff import HostDiff, diff_hosts
from discovery.errors import DiscoveryError
from discovery.interface import HostDiscovery, Hosts
from discovery.parse import MAX_HOSTS, MAX_SLOTS_PER_HOST, host_name_problem, parse_host_lines, parse_hosts_flag
from discovery.script import ScriptDiscovery
from discovery.static import StaticDiscovery

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
