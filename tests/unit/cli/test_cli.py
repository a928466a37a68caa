"""The `ringmaster` command line: flags, defaults, and errors that say what to change."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from harness import ROOT

from ringmaster.cli.main import UsageError, build_parser, main, settings_from_args


def parse(*argv: str):
    return settings_from_args(build_parser().parse_args(["run", *argv]))


def test_help_documents_every_flag_and_its_default() -> None:
    proc = subprocess.run([sys.executable, "-m", "ringmaster.cli", "run",
                           "--help"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for flag in ["-np", "--min-np", "--max-np", "-H", "--host-discovery-script",
                 "--slots-per-host", "--elastic-timeout",
                 "--reset-limit", "--blacklist-cooldown-range", "--discovery-interval", "--heartbeat-timeout",
                 "--collective-timeout", "--warmup-grace", "--stop-grace"]:
        assert flag in text
    assert "(default: 600.0)" in text  # --elastic-timeout, as Horovod
    assert "(default: 1.0)" in text  # --discovery-interval
    assert "(default: None)" not in text
    verbs: Any = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    run = next(a for a in verbs.values() if a.prog.endswith(" run"))
    for action in run._actions:
        if action.dest not in ("help", "command"):
            assert "(default: " in action.help, f"{action.option_strings} does not state its default"


def test_np_alone_runs_locally() -> None:
    settings, discovery, hosts = parse("-np", "3", "python", "train.py")
    assert hosts == {"localhost": 3}
    assert (settings.min_np, settings.max_np) == (3, 3)
    assert settings.command == [sys.executable, "train.py"]


def test_hosts_flag_and_elastic_flags() -> None:
    settings, _, hosts = parse("-H", "a:2,b", "--min-np", "2", "--max-np", "6", "--reset-limit", "3",
                               "--blacklist-cooldown-range", "10", "100", "--slots-per-host", "4", "python", "t.py")
    assert hosts == {"a": 2, "b": 4}
    assert (settings.min_np, settings.max_np, settings.reset_limit) == (2, 6, 3)
    assert settings.blacklist_cooldown_s == (10.0, 100.0)


def test_horovodrun_spellings_and_defaults() -> None:
    """-H with --min-np is elastic over every slot (horovodrun's elastic mode); -H with -np alone
    is a fixed job of -np workers; --min-num-proc/--max-num-proc are aliases."""
    settings, _, _ = parse("-np", "2", "--min-num-proc", "2", "-H", "localhost:2,127.0.0.1:2", "python", "t.py")
    assert (settings.min_np, settings.max_np) == (2, None)
    settings, _, _ = parse("-np", "2", "-H", "a:2,b:2", "python", "t.py")
    assert (settings.min_np, settings.max_np) == (2, 2)
    settings, _, _ = parse("-np", "1", "--min-num-proc", "1", "--max-num-proc", "3", "-H", "a:4", "python", "t.py")
    assert (settings.min_np, settings.max_np) == (1, 3)
    args = build_parser().parse_args(["run", "-np", "2", "--log-level",
                                      "debug", "--no-spare-last-hosts", "python", "t.py"])
    assert args.log_level == "DEBUG"
    assert settings_from_args(args)[0].spare_last_hosts is False
    assert parse("-np", "2", "python", "t.py")[0].spare_last_hosts is True


@pytest.mark.parametrize("argv, message", [
    (["python", "t.py"], "say how many workers: -np N"),
    (["-np", "2"], "no training command given"),
    (["-np", "2", "--min-np", "4", "--max-np", "2", "python", "t.py"], "--max-np (2) must be at least --min-np (4)"),
    (["-H", "a:2", "--host-discovery-script", "x.sh", "python", "t.py"],
     "give one of -H/--hosts, --hostfile and --host-discovery-script"),
    (["-np", "2", "--slots-per-host", "0", "python", "t.py"], "--slots-per-host must be a positive integer"),
    (["-np", "0", "python", "t.py"], "-np must be a positive integer, got 0"),
    (["-np", "2", "--exit-report-timeout", "-1", "python", "t.py"], "--exit-report-timeout: "),
    (["-np", "2", "--bind", "::", "python", "t.py"], "--bind ::: IPv6 addresses are not supported; give an IPv4"),
    (["-np", "2", "--advertise-address", "::1", "python", "t.py"], "--advertise-address ::1: IPv6 addresses"),
])
def test_usage_errors_say_what_to_change(argv, message) -> None:
    with pytest.raises(UsageError) as info:
        parse(*argv)
    assert message in str(info.value)


def test_bad_flags_exit_2_with_the_message(capsys) -> None:
    assert main(["run", "-H", "a:zero", "python", "t.py"]) == 2
    assert "--hosts entry 1: 'a:zero': slots 'zero' is not an integer" in capsys.readouterr().err
    assert main(["run", "-H", "a" * 200_000 + ":2", "python", "t.py"]) == 2
    assert "a host name of 200000 characters is over DNS's limit of 253" in capsys.readouterr().err
    assert main(["run", "-H", "node:100000000000000000000", "python", "t.py"]) == 2
    assert "slots must be at most 1024 per host" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["run", "-np", "2", "--log-level", "LOUD", "python", "t.py"])
    assert info.value.code == 2
    assert "--log-level: invalid choice: 'LOUD'" in capsys.readouterr().err


@pytest.mark.parametrize("status, body, expected", [
    (502, b"<html><body>Bad Gateway</body></html>", "answered HTTP 502: (not a Ringmaster answer) <html><body>Bad "
                                                    "Gateway"),
    (200, b"ok", "(not a Ringmaster answer) ok"),
    (409, b'{"detail": "cannot scale to 9 workers: --max-np is 4"}', "answered HTTP 409: cannot scale to 9 workers"),
])
def test_scale_reports_any_answer_as_a_line_not_a_traceback(capsys, status, body, expected) -> None:
    """A proxy or another service on the port answers what it likes: a real HTTP server here."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        code = main(["scale", "--api", f"http://127.0.0.1:{server.server_port}", "-np", "9"])
    finally:
        server.shutdown()
        server.server_close()
    captured = capsys.readouterr()
    assert code == 1  # (a 200 that is not JSON is not an answer either)
    assert expected in captured.out + captured.err
    assert "Traceback" not in captured.out + captured.err


def test_the_agent_takes_its_defaults_from_the_shared_settings_and_names_a_bad_flag() -> None:
    import ringmaster.settings as settings

    help_text = subprocess.run([sys.executable, "-m", "ringmaster.worker.agent", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    assert f"(default: {settings.DEFAULT_STOP_GRACE_S})" in help_text
    assert f"else {settings.DEFAULT_RECONNECT_TIMEOUT_S:g})" in " ".join(help_text.split())
    bad = subprocess.run([sys.executable, "-m", "ringmaster.worker.agent", "--rendezvous", "a:1", "--host", "x",
                          "--heartbeat-interval", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--heartbeat-interval: Input should be greater than 0" in bad.stderr


@pytest.mark.parametrize("verb", ["run", "serve", "scale", "status", "events"])
def test_each_verb_says_what_it_does_with_an_example(verb) -> None:
    proc = subprocess.run([sys.executable, "-m", "ringmaster.cli", verb, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert lines[lines.index("") + 1].strip()  # a description right after the usage
    assert "example" in proc.stdout and f"ringmaster {verb} " in proc.stdout.split("example", 1)[1]


def test_a_mistyped_flag_is_named_with_the_verbs_usage_and_the_flag_meant(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", "--min-nps", "2", "python", "t.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("usage: ringmaster run") and "unrecognized arguments: --min-nps (did you mean --min-np?)" in err
    )


def test_version_and_an_agent_help_without_internal_flags() -> None:
    from ringmaster import __version__

    version = subprocess.run([sys.executable, "-m", "ringmaster.cli", "--version"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"ringmaster {__version__}"
    agent = subprocess.run([sys.executable, "-m", "ringmaster.worker.agent", "--help"], capture_output=True, text=True,
                           timeout=60).stdout
    assert "--from-launcher" not in agent and "--die-with-parent" not in agent
    assert "HEARTBEAT_INTERVAL" not in agent and "--heartbeat-interval S" in agent and "example" in agent


@pytest.mark.parametrize("flag", ["--busy-timeout", "--heartbeat-timeout", "--collective-timeout", "--start-timeout"])
def test_a_bad_value_names_its_flag(flag) -> None:
    from ringmaster.cli.main import build_parser, settings_from_args
    from ringmaster.common.errors import UsageError

    args = build_parser().parse_args(["run", "--min-np", "1", "--max-np", "2", flag, "-5", "python", "x.py"])
    with pytest.raises(UsageError, match=f"^{flag}: Input should be greater than 0"):
        settings_from_args(args)


def test_horovodruns_flags_mean_what_they_mean_to_horovodrun(tmp_path) -> None:
    from ringmaster.rendezvous.control.worker_env import base_env

    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the cluster\nnode1 slots=4\nnode2\tslots = 2\n\nnode3:1\n")
    settings, _discovery, initial = parse("--hostfile", str(hostfile), "-np", "7", "--gloo-timeout-seconds", "45",
                                          "--fusion-threshold-mb", "32", "python", "x.py")
    assert initial == {"node1": 4, "node2": 2, "node3": 1}
    assert (settings.collective_timeout_s, settings.fusion_threshold_bytes) == (45, 32 << 20)
    env = base_env("node1/1", "node1", 0, "r:1", "s:2", settings)
    assert env["RINGMASTER_FUSION_THRESHOLD"] == str(32 << 20)  # what the workers' fusion reads first
    assert "RINGMASTER_FUSION_THRESHOLD" not in base_env("a/1", "a", 0,
                                                         "r:1", "s:2", parse("-np", "2", "python", "x.py")[0])
    args = build_parser().parse_args(["run", "--verbose", "--timeline-filename", "t.json", "-p", "2222", "-i", "id_key",
                                      "--network-interfaces", "eth0", "-np", "2", "python", "x.py"])
    assert (args.log_level, args.timeline, args.ssh_port, args.ssh_identity_file, args.network_interface) == (
        "DEBUG", "t.json", 2222, "id_key", "eth0")


@pytest.mark.parametrize("text, message", [
    ("node1 slots=4\nnode2 cores=2\n", r"--hostfile \S+ line 2: 'node2 cores=2': write 'host slots=N'"),
    ("node1 slots=four\n", r"line 1: 'node1:four': slots 'four' is not an integer"),
    ("node1 slots=2\nnode1 slots=2\n", r"line 2: host 'node1' is listed twice"),
    ("bad/host slots=2\n", r"line 1: 'bad/host:2': 'bad/host' is not a valid host name"),
    ("# nobody\n", r"names no host"),
    (b"\xff\xfe slots=1\n", r"not UTF-8 text"),
])
def test_a_bad_hostfile_is_refused_naming_its_line(tmp_path, text, message) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError, match=message):
        parse("--hostfile", str(hostfile), "python", "x.py")


def test_host_flags_that_contradict_each_other_or_that_cannot_be_had_are_refused(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\n")
    with pytest.raises(UsageError, match="give one of -H/--hosts, --hostfile and --host-discovery-script"):
        parse("--hostfile", str(hostfile), "-H", "a:1", "python", "x.py")
    with pytest.raises(UsageError, match=r"--hostfile \S+missing: cannot read it"):
        parse("--hostfile", str(tmp_path / "missing"), "python", "x.py")
    with pytest.raises(UsageError, match="give one interface name"):
        parse("-np", "2", "--network-interfaces", "eth0,eth1", "python", "x.py")
    with pytest.raises(UsageError, match="--fusion-threshold-mb -1: give 0"):
        parse("-np", "2", "--fusion-threshold-mb", "-1", "python", "x.py")
