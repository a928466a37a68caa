"""The HTTP control API reports the coordinator's view of the job."""

from __future__ import annotations

from fastapi.testclient import TestClient

from rendezvous.control_api import create_app
from rendezvous.coordinator import Coordinator, StoreAddress
from rendezvous.settings import JobSettings


def test_status_reports_generation_hosts_workers_and_events() -> None:
    now = [0.0]
    coordinator = Coordinator(JobSettings(command=["x"], min_np=2), "127.0.0.1:1", StoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3), log=lambda _: None)
    client = TestClient(create_app(coordinator, clock=lambda: now[0]))
    assert client.get("/status").json()["state"] == "starting"
    coordinator.set_hosts({"a": 2}, 0.0)
    coordinator.agent_connected("a", 77, 0.0)
    coordinator.settle(0.0)
    body = client.get("/status").json()
    assert body["state"] == "running" and body["generation"] == 1 and body["world_size"] == 2
    assert body["hosts"] == [{"name": "a", "slots": 2, "discovered": True, "agent_connected": True,
                              "agent_pid": 77, "blacklisted": False}]
    assert sorted(w["rank"] for w in body["workers"]) == [0, 1]
    assert any("generation 1 formed" in e for e in body["events"])
    assert client.get("/healthz").json() == {"status": "ok"}


def test_scale_endpoint_validates_and_applies() -> None:
    coordinator = Coordinator(JobSettings(command=["x"], min_np=2, max_np=4), "127.0.0.1:1", StoreAddress("127.0.0.1", 2),
                              lambda g: ("127.0.0.1", 3), log=lambda _: None)
    coordinator.set_hosts({"a": 4}, 0.0)
    coordinator.agent_connected("a", 77, 0.0)
    coordinator.settle(0.0)
    client = TestClient(create_app(coordinator, clock=lambda: 0.0))
    reply = client.post("/scale", json={"np": 3})
    assert reply.status_code == 200 and reply.json()["message"].startswith("scaling to 3 workers")
    assert client.get("/status").json()["target_np"] == 3
    refused = client.post("/scale", json={"np": 5})
    assert refused.status_code == 409 and refused.json()["detail"] == "cannot scale to 5 workers: --max-np is 4"
    assert client.post("/scale", json={"np": 0}).status_code == 422
    assert client.post("/scale", json={"workers": 2}).status_code == 422
