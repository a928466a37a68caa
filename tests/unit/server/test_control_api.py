"""The HTTP control API reports the coordinator's view of the job."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import httpx
import pytest
import uvicorn
from coordinator_rig import api_for
from fastapi.testclient import TestClient
from harness import free_port, wait_for

import ringmaster
from ringmaster.rendezvous.control.coordinator import Coordinator, RingStoreAddress
from ringmaster.settings import JobSettings


def test_status_reports_generation_hosts_workers_and_events() -> None:
    now = [0.0]
    coordinator = Coordinator(JobSettings(command=["x"], min_np=2), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    client = TestClient(api_for(coordinator, clock=lambda: now[0]))
    assert client.get("/status").json()["state"] == "starting"
    coordinator.set_hosts({"a": 2}, 0.0)
    coordinator.agent_connected("a", 77, 0.0)
    coordinator.settle(0.0)
    body = client.get("/status").json()
    assert body["state"] == "running" and body["generation"] == 1 and body["world_size"] == 2
    assert body["hosts"] == [{"name": "a", "slots": 2, "discovered": True, "agent_connected": True,
                              "agent_pid": 77, "blacklisted": False, "state": "active", "drain": "",
                              "drain_deadline_s": None}]
    assert body["min_np"] == 2 and body["max_np"] is None
    assert body["steps_per_second"] is None and body["loss"] is None and body["generations"] == []  # (no metrics kept)
    assert sorted(w["rank"] for w in body["workers"]) == [0, 1]
    assert any("generation 1 formed" in e for e in body["events"])
    assert client.get("/healthz").json() == {"status": "ok", "version": ringmaster.__version__}
    assert body["version"] == ringmaster.__version__ and body["version"] not in ("", "0.0.0+unknown")


def test_status_of_a_large_job_comes_in_pages() -> None:
    coordinator = Coordinator(JobSettings(command=["x"], min_np=1), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    hosts = {f"h{i:03d}": 4 for i in range(300)}
    coordinator.set_hosts(hosts, 0.0)
    for i, name in enumerate(hosts):
        coordinator.agent_connected(name, i + 1, 0.0)
    coordinator.settle(0.0)
    client = TestClient(api_for(coordinator))
    first = client.get("/status").json()
    assert (first["hosts_total"], first["workers_total"]) == (300, 1200)
    assert len(first["hosts"]) == 300 and len(first["workers"]) == 1000  # (the default page)
    seen = []
    for offset in range(0, 1200, 500):
        page = client.get("/status", params={"offset": offset, "limit": 500}).json()
        seen += [w["worker_id"] for w in page["workers"]]
    assert len(seen) == len(set(seen)) == 1200
    for bad in ({"limit": 0}, {"limit": 10_001}, {"offset": -1}):
        answer = client.get("/status", params=bad)
        assert answer.status_code == 422 and ("limit" in answer.text or "offset" in answer.text)


def test_scale_endpoint_validates_and_applies() -> None:
    coordinator = Coordinator(JobSettings(command=["x"], min_np=2, max_np=4),
                              "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    coordinator.set_hosts({"a": 4}, 0.0)
    coordinator.agent_connected("a", 77, 0.0)
    coordinator.settle(0.0)
    client = TestClient(api_for(coordinator, clock=lambda: 0.0))
    reply = client.post("/scale", json={"np": 3})
    assert reply.status_code == 200 and reply.json()["message"].startswith("scaling to 3 workers")
    assert client.get("/status").json()["target_np"] == 3
    refused = client.post("/scale", json={"np": 5})
    assert refused.status_code == 409 and refused.json()["detail"] == "cannot scale to 5 workers: --max-np is 4"
    assert client.post("/scale", json={"np": 0}).status_code == 422
    assert client.post("/scale", json={"workers": 2}).status_code == 422


def test_drain_and_undrain_endpoints_validate_and_need_the_secret() -> None:
    coordinator = Coordinator(JobSettings(command=["x"], min_np=1), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    coordinator.set_hosts({"a": 1, "b": 1}, 0.0)
    coordinator.agent_connected("a", 77, 0.0)
    coordinator.agent_connected("b", 78, 0.0)
    coordinator.settle(0.0)
    secret = "s" * 32
    good = {"Authorization": f"Bearer {secret}"}
    client = TestClient(api_for(coordinator, secret=secret))
    assert client.post("/hosts/b/drain", json={"deadline_s": 60}).status_code == 401
    assert coordinator.pool.hosts["b"].drain is None
    for body in ({"deadline_s": 0}, {"deadline_s": -1}, {"deadline_s": "60"}, {"deadline_s": True},
                 {"deadline_s": 1e9}, {"deadline": 60}):
        assert client.post("/hosts/b/drain", json=body, headers=good).status_code == 422, body
    unknown = client.post("/hosts/nope/drain", json={"deadline_s": 60}, headers=good)
    assert unknown.status_code == 404 and "no host 'nope'" in unknown.json()["detail"]
    reply = client.post("/hosts/b/drain", json={"deadline_s": 60}, headers=good)
    assert reply.status_code == 200 and "within 60 s" in reply.json()["message"], reply.text
    host = next(h for h in client.get("/status", headers=good).json()["hosts"] if h["name"] == "b")
    assert host["state"] == "draining" and host["drain"] == "operator: operator" and host["drain_deadline_s"] == 60
    assert client.post("/hosts/b/drain", headers=good).status_code == 200  # no body: the default deadline
    assert client.post("/hosts/b/undrain", headers=good).status_code == 200
    again = client.post("/hosts/b/undrain", headers=good)
    assert again.status_code == 409 and again.json()["detail"] == "host b is not being drained"


@pytest.fixture
def served_api():
    """The control API on a real uvicorn server on a free loopback port."""
    coordinator = Coordinator(JobSettings(command=["x"], min_np=1, max_np=4),
                              "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    coordinator.set_hosts({"a": 4}, 0.0)
    coordinator.agent_connected("a", 77, 0.0)
    coordinator.settle(0.0)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(api_for(coordinator, clock=lambda: 0.0), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, "the API server to start")
    try:
        yield port, coordinator
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def raw_post(port: int, head: bytes, body_chunks: tuple[bytes, ...] | list[bytes] = (),
             timeout_s: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(head)
        for chunk in body_chunks:
            try:
                sock.sendall(chunk)
            except OSError:
                break  # the server answered and closed: what we want
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            part = sock.recv(65536)
            if not part:
                break
            data += part
        return data


def test_a_huge_declared_body_is_refused_before_it_is_read(served_api) -> None:
    port, coordinator = served_api
    head = (b"POST /scale HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1200000000\r\n\r\n")
    started = time.monotonic()
    reply = raw_post(port, head)  # not one byte of the body is sent: the answer must not wait for it
    assert time.monotonic() - started < 2.0
    assert reply.startswith(b"HTTP/1.1 413") and b"over the limit of 65536 bytes" in reply
    assert coordinator.target_np is None


def test_a_client_that_sends_a_whole_10_mb_body_before_reading_still_gets_the_413(served_api) -> None:
    """urllib sends the whole body, then reads: the server closed with the body unread, and the
    client saw the connection reset instead of the answer."""
    port, coordinator = served_api
    request = urllib.request.Request(f"http://127.0.0.1:{port}/scale", data=b"x" * (10 << 20),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413 and 'send {"np": N}' in json.loads(refused.value.read())["detail"]
    assert coordinator.target_np is None


def test_a_chunked_body_is_cut_off_at_the_limit(served_api) -> None:
    port, coordinator = served_api
    head = b"POST /scale HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"x" * 16384
    chunks = [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 16 + [b"0\r\n\r\n"]
    reply = raw_post(port, head, chunks)
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert coordinator.target_np is None


@pytest.mark.parametrize("body", ['{"np": true}', '{"np": 1e400}', '{"np": 2.0}', '{"np": "2"}', '{"np": 10000000}',
                                  '{"np": 2, "extra": 1}', "not json"])
def test_scale_takes_only_a_json_integer(served_api, body) -> None:
    port, coordinator = served_api
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        reply = client.post("/scale", content=body, headers={"Content-Type": "application/json"})
    assert reply.status_code == 422, reply.text
    assert reply.json()["detail"]  # says which field and why
    assert coordinator.target_np is None


@pytest.mark.parametrize("client_host", ["127.0.0.1", "10.1.2.3"])
def test_changes_need_the_job_secret_and_so_does_reading_from_another_machine(client_host) -> None:
    coordinator = Coordinator(JobSettings(command=["x"], min_np=1, max_np=4),
                              "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    secret = "s" * 32
    client = TestClient(api_for(coordinator, secret=secret), client=(client_host, 50000))
    good = {"Authorization": f"Bearer {secret}"}
    for headers in ({}, {"Authorization": "Bearer " + "t" * 32}, {"Authorization": secret}):
        refused = client.post("/scale", json={"np": 2}, headers=headers)
        assert refused.status_code == 401 and "job secret" in refused.json()["detail"]
    assert client.post("/scale", json={"np": 7}, headers={}).status_code == 401  # refused before the body is judged
    for path in ("/scale", "/hosts/a/drain"):  # ... even one that is not JSON at all
        assert client.post(path, content=b"not json", headers={"Content-Type": "application/json"}).status_code == 401
    assert coordinator.limit == 4  # unchanged
    assert client.post("/scale", json={"np": 2}, headers=good).status_code == 200 and coordinator.limit == 2
    assert client.get("/status").status_code == (200 if client_host == "127.0.0.1" else 401)
    assert client.get("/status", headers=good).status_code == 200
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("host, code", [
    ("127.0.0.1:8080", 200), ("localhost:8080", 200), ("[::1]:8080", 200), ("10.9.8.7:8080", 200),
    ("rendezvous.internal", 200), ("attacker.example", 421), ("attacker.example:8080", 421),
    ("127.0.0.1.attacker.example", 421), ("", 421),
])
def test_requests_addressed_to_another_name_are_not_answered(host, code) -> None:
    """DNS rebinding: a page of attacker.example whose name now resolves to 127.0.0.1 makes a
    browser here call the API with `Host: attacker.example`; it must learn nothing."""
    coordinator = Coordinator(JobSettings(command=["x"], min_np=1, max_np=4),
                              "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    client = TestClient(api_for(coordinator, host_names={"10.9.8.7", "rendezvous.internal"}))
    for path in ("/status", "/events", "/healthz", "/"):  # (every path: the check comes first)
        answer = client.get(path, headers={"Host": host})
        assert answer.status_code == code, path
        if code == 421:
            assert "addressed to this machine only" in answer.json()["detail"]


def test_events_are_paged_by_number_with_what_each_said() -> None:
    now = [100.0]
    coordinator = Coordinator(JobSettings(command=["x"], min_np=2), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    client = TestClient(api_for(coordinator, clock=lambda: now[0]))
    assert client.get("/events").json() == {"events": [], "next": 0, "dropped": 0}
    coordinator.set_hosts({"a": 2}, 100.0)
    coordinator.agent_connected("a", 77, 100.0)
    coordinator.settle(100.0)
    page = client.get("/events", params={"limit": 2}).json()
    assert [e["seq"] for e in page["events"]] == [0, 1] and page["next"] == 2
    everything = client.get("/events").json()["events"]
    formed = next(e for e in everything if e["kind"] == "generation.formed")
    assert formed["fields"]["size"] == 2 and formed["generation"] == 1 and formed["level"] == "INFO"
    assert "generation 1 formed" in formed["message"]
    assert abs(formed["time"] - time.time()) < 60  # wall-clock seconds, not the coordinator's clock
    rest = client.get("/events", params={"since": page["next"]}).json()
    assert [e["seq"] for e in rest["events"]] == list(range(2, len(everything)))
    assert client.get("/events", params={"since": 10_000}).json()["events"] == []
    for bad in ({"since": -1}, {"limit": 0}, {"limit": 100_000}, {"since": "x"}):
        assert client.get("/events", params=bad).status_code == 422


def test_events_dropped_from_the_bounded_history_are_counted_not_lost_silently() -> None:
    from ringmaster.common.events import Event, Kind
    from ringmaster.rendezvous.control.records import MAX_EVENTS

    coordinator = Coordinator(JobSettings(command=["x"], min_np=1), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    for i in range(MAX_EVENTS + 5):
        coordinator.summary.add_event(Event(Kind.HOSTS_CHANGED, {"description": f"change {i}"}, 1, 0.0))
    client = TestClient(api_for(coordinator, clock=lambda: 0.0))
    page = client.get("/events", params={"since": 0, "limit": 1}).json()
    assert (
        page["dropped"] == 5
        and page["events"][0]["seq"] == 5
        and page["events"][0]["fields"]["description"] == "change 5"
    )


def test_ringmaster_status_and_events_print_a_running_api(served_api, capsys) -> None:
    """The CLI verbs against a real server: a table, then events (JSON and text)."""
    import json

    from ringmaster.cli.main import main

    port, _ = served_api
    api = f"http://127.0.0.1:{port}"
    assert main(["status", "--api", api]) == 0
    out = capsys.readouterr().out
    assert out.startswith("running: generation 1, world size 4 (target 4), 0 steps committed, 0 reset(s); job start")
    assert "a/1     a     0     spawning  0        -" in out
    assert "host  slots  state   agent pid" in out and "a     4      active  77" in out
    assert main(["events", "--api", api, "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert records and [r["seq"] for r in records] == list(range(len(records)))
    assert main(["events", "--api", api, "--since", str(len(records) - 1)]) == 0
    assert capsys.readouterr().out.count("\n") == 1
    assert main(["events", "--api", "ftp://x"]) == 1
    assert "give the control API's URL" in capsys.readouterr().err
    assert main(["status", "--api", f"http://127.0.0.1:{free_port()}"]) == 1
    assert "cannot reach the control API" in capsys.readouterr().err


def test_a_job_ending_waits_only_for_an_events_reader_that_has_not_fetched_the_last_ones() -> None:
    from ringmaster.rendezvous.server.http_api import EventFollowers

    now = [0.0]
    coordinator = Coordinator(JobSettings(command=["x"], min_np=2), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    followers = EventFollowers()
    client = TestClient(api_for(coordinator, clock=lambda: now[0], followers=followers))
    assert followers.caught_up(coordinator.view(0.0), 1.5)  # nobody reads
    coordinator.set_hosts({"a": 2}, 0.0)
    coordinator.agent_connected("a", 77, 0.0)
    coordinator.settle(0.0)
    client.get("/events", params={"limit": 1})
    assert followers.last_poll == 0.0 and not followers.caught_up(coordinator.view(0.5), 1.5)  # more to fetch
    client.get("/events", params={"since": followers.served_upto})
    assert followers.caught_up(coordinator.view(0.5), 1.5)
    coordinator.scale(2, 0.0)  # a new event
    # gone quiet
    assert not followers.caught_up(coordinator.view(1.0), 1.5) and followers.caught_up(coordinator.view(2.0), 1.5)


def test_the_dashboard_page_is_served_whole_from_the_api_and_runs_nothing_else() -> None:
    coordinator = Coordinator(JobSettings(command=["x"]), "127.0.0.1:1", RingStoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3))
    client = TestClient(api_for(coordinator, secret="s3cret"))
    page = client.get("/")  # the page itself holds no data: open, like /healthz
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
    for name, kind in (("dashboard.js", "text/javascript"), ("dashboard.css", "text/css")):
        reply = client.get(f"/{name}")
        assert reply.status_code == 200 and reply.headers["content-type"].startswith(kind), name
        assert "http://" not in reply.text and "https://" not in reply.text and "innerHTML" not in reply.text
    assert 'src="dashboard.js"' in page.text and "<script>" not in page.text  # no inline script, no CDN
    assert "http://" not in page.text and "https://" not in page.text


def test_status_with_metrics_has_the_generations_their_causes_rate_and_loss() -> None:
    from coordinator_rig import Rig

    from ringmaster.common.figures import WorkerFigures
    from ringmaster.rendezvous.server.metrics import JobMetrics

    rig = Rig(min_np=1, max_np=8)
    wall = [1000.0]
    metrics = JobMetrics(lambda: rig.coordinator.view(rig.now), wall_clock=lambda: wall[0])
    rig.coordinator.job.on_event = metrics.on_event
    ids = rig.start_elastic({"a": 1, "b": 1})
    figures = WorkerFigures()
    figures.report(0.5)
    metrics.figures.update(ids[0], figures.stats())
    rig.now, wall[0] = 10.0, 1010.0
    rig.agent_disconnected("b")
    rig.worker_ready(ids[0], 1, "allreduce failed", True)
    rig.now = 10.25
    rig.worker_heartbeat(ids[0], 3, True)
    client = TestClient(api_for(rig.coordinator, clock=lambda: rig.now, metrics=metrics))
    body = client.get("/status").json()
    gens = body["generations"]
    assert [g["number"] for g in gens] == [1, 2] and [g["started"] for g in gens] == [1000.0, 1010.0]
    assert "host_lost" in gens[1]["causes"] and gens[1]["size"] == 1 and abs(gens[1]["recovery_s"] - 0.25) < 1e-9
    assert body["loss"] == 0.5 and body["steps_per_second"] is not None
    assert {h["name"]: h["state"] for h in body["hosts"]} == {"a": "active", "b": "blacklisted"}


def test_the_status_line_has_the_rate_and_the_loss_when_they_are_known() -> None:
    from ringmaster.cli.remote import render_status

    job = {"state": "running", "generation": 2, "world_size": 2, "target_np": None, "steps": 10, "resets": 1,
           "message": "m", "steps_per_second": 2.5, "loss": 0.12345, "hosts": [], "workers": []}
    assert render_status(job).startswith("running: generation 2, world size 2, 10 steps committed, 2.50 steps/s, "
                                         "loss 0.1235, 1 reset(s); m")
