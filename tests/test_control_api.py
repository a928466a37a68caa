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
    body = client.get("/status").json()
    assert body["state"] == "running" and body["generation"] == 1 and body["world_size"] == 2
    assert body["hosts"] == [{"name": "a", "slots": 2, "discovered": True, "agent_connected": True,
                              "agent_pid": 77, "blacklisted": False}]
    assert sorted(w["rank"] for w in body["workers"]) == [0, 1]
    assert any("generation 1 formed" in e for e in body["events"])
    assert client.get("/healthz").json() == {"status": "ok"}
