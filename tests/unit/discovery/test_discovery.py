"""Host discovery: parsing, diffing, blacklisting (pure) and running real scripts."""

from __future__ import annotations

import pathlib
import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ringmaster.discovery import (
    Blacklist,
    CooldownRange,
    DiscoveryError,
    ScriptDiscovery,
    diff_hosts,
    host_name_problem,
    parse_host_lines,
    parse_hosts_flag,
)

host_names = st.from_regex(r"[a-z][a-z0-9\-]{0,10}[a-z0-9]", fullmatch=True)


@given(st.dictionaries(host_names, st.integers(1, 64), max_size=12))
def test_printed_host_sets_parse_back(hosts: dict[str, int]) -> None:
    text = "".join(f"{h}:{s}\n" for h, s in hosts.items())
    assert parse_host_lines(text) == hosts


def test_comments_blank_lines_and_default_slots() -> None:
    text = "# cluster\n\nnode1:4\nnode2   # default slots\n"
    assert parse_host_lines(text, default_slots=2) == {"node1": 4, "node2": 2}


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("node1:4\nnode2:x\n", "line 2: 'node2:x': slots 'x' is not an integer"),
        ("node1:0\n", "line 1: 'node1:0': slots must be a positive integer, got 0"),
        ("node1:-2\n", "slots must be a positive integer, got -2"),
        ("node1\n", "line 1: 'node1' gives no slot count"),
        ("node1:2\nnode1:3\n", "line 2: host 'node1' is listed twice"),
        ("node 1:2\n", "line 1: 'node 1:2' has spaces"),
        ("no$de:2\n", "'no$de' is not a valid host name"),
        ("localhost:100000000000000000000\n", "slots must be at most 1024 per host"),
        ("node1:1025\n", "slots must be at most 1024 per host"),
        ("a" * 200_000 + ":2\n", "a host name of 200000 characters is over DNS's limit of 253"),
        ("x" * 64 + ".example:2\n", "labels of at most 63 characters"),
        ("fe80::1:2\n", "looks like an IPv6 address"),
        (".node:2\n", "is not a valid host name"),
        ("node1:1_0\n", "slots '1_0' is not an integer"),
        ("node1:\uff11\n", "is not an integer"),  # a full-width digit one: int() would take it
        ("node1:+2\n", "slots '+2' is not an integer"),
        ("".join(f"h{i}:1\n" for i in range(8193)), "line 8193: more than 8192 hosts listed"),
    ],
)
def test_malformed_lines_are_named(text: str, fragment: str) -> None:
    with pytest.raises(DiscoveryError, match=None) as info:
        parse_host_lines(text, source="discovery")
    assert fragment in str(info.value)
    assert len(str(info.value)) < 400  # a huge line is named, not echoed


@pytest.mark.parametrize("name", ["hostQ\n", "hostQ\r", "host\nQ", "ho\u0161t", "h\uff4fst", "host\x00"])
def test_control_and_foreign_characters_are_no_host_name(name: str) -> None:
    """A name that reaches the ssh command line, a log line or a store key: a trailing newline
    once passed (the pattern's `$` matched before it)."""
    assert host_name_problem(name) is not None


def test_real_host_names_and_addresses_pass() -> None:
    hosts = "node-1.cluster.example:8\n10.0.3.17:4\ngpu_node_02:2\n" + "a" * 63 + ".b:1\n"
    assert list(parse_host_lines(hosts)) == ["node-1.cluster.example", "10.0.3.17", "gpu_node_02", "a" * 63 + ".b"]


def test_hosts_flag() -> None:
    assert parse_hosts_flag("a:2,b:4,c") == {"a": 2, "b": 4, "c": 1}
    with pytest.raises(DiscoveryError, match="names no host"):
        parse_hosts_flag(",")
    with pytest.raises(DiscoveryError, match="--hosts entry 2"):
        parse_hosts_flag("a:2,b:0")


def test_diff_names_added_removed_resized() -> None:
    change = diff_hosts({"a": 2, "b": 2, "c": 1}, {"a": 2, "b": 4, "d": 1})
    assert change.added == {"d": 1}
    assert change.removed == {"c": 1}
    assert change.resized == {"b": (2, 4)}
    assert not diff_hosts({"a": 1, "b": 1}, {"b": 1, "a": 1})


def test_blacklist_without_range_is_permanent() -> None:
    blacklist = Blacklist()
    assert blacklist.record_failure("a", now=100.0) == float("inf")
    assert blacklist.is_blacklisted("a", now=1e9)
    assert not blacklist.is_blacklisted("b", now=100.0)


def test_cooldown_starts_at_lower_doubles_and_caps_with_jitter() -> None:
    blacklist = Blacklist(CooldownRange(10, 60), rng=random.Random(3))
    cooldowns = [blacklist.record_failure("a", now=0.0) for _ in range(6)]
    assert 10 <= cooldowns[0] <= 11
    assert 20 <= cooldowns[1] <= 22
    assert 40 <= cooldowns[2] <= 44
    assert cooldowns[3:] == [60, 60, 60]
    blacklist2 = Blacklist(CooldownRange(10, 60), rng=random.Random(3))
    first = blacklist2.record_failure("b", now=50.0)
    assert blacklist2.is_blacklisted("b", now=50.0 + first - 0.01)
    assert not blacklist2.is_blacklisted("b", now=50.0 + first)


def test_cooldown_range_is_validated() -> None:
    with pytest.raises(ValueError, match="0 < MIN <= MAX"):
        CooldownRange(30, 10)


def _script(tmp_path: pathlib.Path, body: str) -> str:
    path = tmp_path / "hosts.sh"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_script_output_is_parsed(tmp_path: pathlib.Path) -> None:
    discovery = ScriptDiscovery(_script(tmp_path, "echo hostA:2\necho hostB\n"), default_slots=3)
    assert discovery.find_hosts() == {"hostA": 2, "hostB": 3}


def test_the_same_output_again_gives_the_same_hosts_and_a_change_is_read(tmp_path: pathlib.Path) -> None:
    """Output printed again is not parsed again (4,096 lines every interval), and what a caller
    does to the hosts it got changes nothing of what it gets next."""
    listing = tmp_path / "hosts.txt"
    listing.write_text("hostA:2\nhostB:1\n")
    discovery = ScriptDiscovery(_script(tmp_path, f"cat {listing}\n"))
    first = discovery.find_hosts()
    first["hostC"] = 9
    assert discovery.find_hosts() == {"hostA": 2, "hostB": 1}
    listing.write_text("hostA:2\nhostB:4\n")
    assert discovery.find_hosts() == {"hostA": 2, "hostB": 4}
    listing.write_text("hostA:2\nhostA:4\n")
    with pytest.raises(DiscoveryError, match="listed twice"):
        discovery.find_hosts()


def test_failing_script_reports_code_and_stderr(tmp_path: pathlib.Path) -> None:
    discovery = ScriptDiscovery(_script(tmp_path, "echo 'cannot reach the scheduler' >&2\nexit 3\n"))
    with pytest.raises(DiscoveryError, match="exited with code 3: cannot reach the scheduler"):
        discovery.find_hosts()


def test_hanging_script_is_killed_at_its_timeout(tmp_path: pathlib.Path) -> None:
    discovery = ScriptDiscovery(_script(tmp_path, "sleep 30\n"), timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(DiscoveryError, match="did not finish within 0.5 s"):
        discovery.find_hosts()
    assert time.monotonic() - started < 5


def test_garbage_output_names_the_line(tmp_path: pathlib.Path) -> None:
    discovery = ScriptDiscovery(_script(tmp_path, "echo hostA:2\necho 'hostB:lots'\n"))
    with pytest.raises(DiscoveryError, match="line 2: 'hostB:lots'"):
        discovery.find_hosts()


def test_missing_script(tmp_path: pathlib.Path) -> None:
    discovery = ScriptDiscovery(str(tmp_path / "nope.sh"))
    with pytest.raises(DiscoveryError, match="exited with code 127"):
        discovery.find_hosts()


def test_a_child_left_holding_the_pipe_is_not_waited_for(tmp_path: pathlib.Path) -> None:
    """`echo host:2; setsid sleep 25 &`: the script is done at once; its child (its own session,
    out of reach of a group kill) keeps stdout open. Discovery answers without waiting for it."""
    pidfile = tmp_path / "child.pid"
    discovery = ScriptDiscovery(_script(tmp_path, f"echo localhost:2\nsetsid sleep 25 &\necho $! > {pidfile}\n"),
                                timeout_s=3)
    try:
        started = time.monotonic()
        assert discovery.find_hosts() == {"localhost": 2}
        assert time.monotonic() - started < 1.5
    finally:
        _kill_pidfile(pidfile)


def test_children_left_in_the_scripts_group_are_killed(tmp_path: pathlib.Path) -> None:
    """`echo host:2; sleep 25 &`: the child stays in the script's process group and holds the
    pipe; every run would leave one more behind. It goes with the script."""
    import os

    from harness import wait_for

    pidfile = tmp_path / "child.pid"
    discovery = ScriptDiscovery(_script(tmp_path, f"echo localhost:2\nsleep 25 &\necho $! > {pidfile}\n"), timeout_s=3)
    try:
        assert discovery.find_hosts() == {"localhost": 2}
        child = int(pidfile.read_text())

        def gone() -> bool:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return True
            with open(f"/proc/{child}/stat") as f:  # a zombie waiting for init counts as gone
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"

        wait_for(gone, 5, "the script's child to be killed")
    finally:
        _kill_pidfile(pidfile)


def test_the_timeout_holds_whatever_the_children_do(tmp_path: pathlib.Path) -> None:
    pidfile = tmp_path / "child.pid"
    body = f"setsid sleep 25 &\necho $! > {pidfile}\necho localhost:2\nsleep 25\n"
    discovery = ScriptDiscovery(_script(tmp_path, body), timeout_s=1)
    try:
        started = time.monotonic()
        with pytest.raises(DiscoveryError, match="did not finish within 1 s"):
            discovery.find_hosts()
        assert time.monotonic() - started < 2.5
    finally:
        _kill_pidfile(pidfile)


def test_a_flood_of_output_is_cut_off(tmp_path: pathlib.Path) -> None:
    discovery = ScriptDiscovery(_script(tmp_path, "yes localhost:2\n"), timeout_s=5)
    with pytest.raises(DiscoveryError, match="printed more than 4194304 bytes"):
        discovery.find_hosts()


def _kill_pidfile(pidfile: pathlib.Path) -> None:
    """Reap the script's child (its own session: a group kill does not reach it)."""
    import os
    import signal

    from harness import wait_for

    try:
        wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 5, "the child's pid")
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
    except (AssertionError, OSError, ValueError):
        pass  # no child was started: nothing to reap


def test_a_script_that_may_not_run_says_chmod(tmp_path: pathlib.Path) -> None:
    script = tmp_path / "hosts.sh"
    script.write_text("#!/bin/sh\necho localhost:2\n")
    script.chmod(0o644)
    with pytest.raises(DiscoveryError, match=r"exited with code 126.*chmod \+x .*hosts\.sh"):
        ScriptDiscovery(str(script)).find_hosts()
