"""How `run` starts hosts' agents: commands, what is handed over, which names are this machine."""

from __future__ import annotations

import shlex

import pytest

from ringmaster.common.handover import handover, read_handover
from ringmaster.common.network import (
    NetworkError,
    interface_address,
    is_this_machine,
    route_address,
    this_machine_names,
)
from ringmaster.launch.launch_plan import SshOptions, agent_command, forwarded_environment, ssh_command


def test_the_remote_command_runs_this_python_in_this_directory_and_carries_no_secret() -> None:
    remote = agent_command("/opt/venv/bin/python", "10.0.0.1:29400", "node1", 1.0, 5.0, remote=True)
    argv = ssh_command("node1", SshOptions(2222, "/keys/id", ("-o", "UserKnownHostsFile=/dev/null")), remote,
                       "/work dir")
    assert argv[:2] == ["ssh", "-o"] and "BatchMode=yes" in argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-i") + 1] == "/keys/id"
    assert argv[-3:-1] == ["--", "node1"] and "UserKnownHostsFile=/dev/null" in argv
    shell = shlex.split(argv[-1])
    assert shell[:3] == ["cd", "/work dir", "&&"] and shell[3:6] == ["exec", "/opt/venv/bin/python", "-m"]
    assert "--from-launcher" in shell and not any("secret" in part.lower() for part in argv)
    local = agent_command("/py", "127.0.0.1:1", "hostA", 1.0, 5.0, remote=False)
    assert "--die-with-parent" in local and "--from-launcher" in local  # its key comes on stdin too


def test_the_environment_handed_over_leaves_out_what_describes_this_machine() -> None:
    env = {"PATH": "/bin", "PYTHONPATH": "/src", "HOME": "/root", "SSH_AUTH_SOCK": "/tmp/a", "BASH_FUNC_x%%": "()",
           "XDG_RUNTIME_DIR": "/run", "NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0"}
    assert forwarded_environment(env) == {"PATH": "/bin", "PYTHONPATH": "/src", "NCCL_DEBUG": "INFO"}
    key, back = read_handover(handover("ab" * 32, {"A": "1"}))
    assert key == "ab" * 32 and back == {"A": "1"}


@pytest.mark.parametrize("line, message", [
    (b"not json\n", "not JSON"),
    (b'{"key": 1, "env": {}}\n', "lacks a key"),
    (b'{"secret": "x", "env": {}}\n', "lacks a key"),
    (b'{"key": "x", "env": {"A": 1}}\n', "environment of strings"),
    (b"x" * (2 << 20), "over"),
])
def test_a_bad_handover_is_refused_naming_it(line, message) -> None:
    with pytest.raises(ValueError, match=message):
        read_handover(line)


def test_names_of_this_machine_and_routes() -> None:
    names = this_machine_names()
    for name in ("localhost", "127.0.0.1", "127.1.2.3", "LOCALHOST"):
        assert is_this_machine(name, names)
    assert not is_this_machine("hostA", names)
    assert route_address("127.0.0.1") == "127.0.0.1"
    assert interface_address("lo") == "127.0.0.1"
    with pytest.raises(NetworkError, match="no such interface"):
        interface_address("nosuch0")
    with pytest.raises(NetworkError, match="cannot resolve host"):
        route_address("no-such-host.invalid")
