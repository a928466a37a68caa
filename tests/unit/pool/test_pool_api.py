"""The pool's control API on a pool whose loop is not running: what it accepts, what it refuses
and with which status. (The jobs are only queued here; tests/e2e/test_pool.py runs them.)"""

from __future__ import annotations

import pathlib
import time

import pytest
from fastapi.testclient import TestClient

from ringmaster.common.events import Event, Kind
from ringmaster.discovery import StaticDiscovery
from ringmaster.rendezvous.pool.api import create_pool_app
from ringmaster.rendezvous.pool.service import PoolService
from ringmaster.rendezvous.scheduling.model import Settings

SECRET = "pool-secret-pool-secret-pool-secret-0"
AUTH = {"Authorization": f"Bearer {SECRET}"}


@pytest.fixture
def api(tmp_path: pathlib.Path):
    said: list[tuple] = []
    pool = PoolService(StaticDiscovery({"a": 4, "b": 4}), "fifo", Settings(queue_weights={"team-a": 2}), {}, tmp_path,
                       lambda kind, **fields: said.append((kind, fields)))
    pool.pool_hosts.hosts = {"a": 4, "b": 4}
    return TestClient(create_pool_app(pool, SECRET)), pool


def test_every_call_but_health_needs_the_pools_secret(api) -> None:
    client, _ = api
    assert client.get("/healthz").status_code == 200
    for method, path in (("get", "/jobs"), ("post", "/jobs"), ("get", "/hosts"), ("post", "/jobs/x/cancel"),
                         ("get", "/jobs/x/status")):
        answer = getattr(client, method)(path, headers={"Authorization": "Bearer wrong"})
        assert answer.status_code == 401 and "pool's secret" in answer.json()["detail"], (path, answer.text)


def test_a_submission_is_queued_and_listed(api) -> None:
    client, pool = api
    answer = client.post("/jobs", json={"command": ["python", "train.py"], "min_np": 2, "max_np": 4, "name": "r",
                                        "queue": "team-a", "priority": 1}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "r-1" and answer.json()["state"] == "queued"
    rows = client.get("/jobs", headers=AUTH).json()
    assert [(r["id"], r["queue"], r["min_np"], r["max_np"]) for r in rows] == [("r-1", "team-a", 2, 4)]
    assert pool.changed.is_set()  # the loop is woken to schedule it
    assert [h["name"] for h in client.get("/hosts", headers=AUTH).json()] == ["a", "b"]


@pytest.mark.parametrize("body", [
    {"command": ["true"], "min_np": 2.0},
    {"command": ["true"], "min_np": "2"},
    {"command": ["true"], "min_np": True},
    {"command": "python train.py", "min_np": 1},
    {"command": [], "min_np": 1},
    {"command": ["true"], "min_np": 1, "priority": "high"},
    {"command": ["true"], "min_np": 1, "extra": 1},
    {"command": ["true"], "min_np": 10**12},
    {"command": ["true"], "min_np": 2, "group_size": 2.0},
    {"command": ["true"], "min_np": 2, "group_size": 0},
])
def test_malformed_bodies_are_refused_not_coerced(api, body) -> None:
    client, pool = api
    answer = client.post("/jobs", json=body, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert not pool.table.jobs


def test_an_argument_no_os_can_take_is_refused_naming_it_and_a_byte_that_is_not_utf8_is_taken(api) -> None:
    client, pool = api
    refused = client.post("/jobs", headers={**AUTH, "Content-Type": "application/json"},
                          content=b'{"command": ["python", "ok", "\\ud800x"], "min_np": 1}')
    assert refused.status_code == 422 and "command[2]" in refused.text and "lone surrogate" in refused.text, (
        refused.text
    )
    taken = client.post("/jobs", headers={**AUTH, "Content-Type": "application/json"},
                        content=b'{"command": ["python", "caf\\udce9.py"], "min_np": 1}')  # (a shell's b"caf\xe9.py")
    assert taken.status_code == 200, taken.text
    assert [j.command for j in pool.table.jobs.values()] == [["python", "caf\udce9.py"]]


def test_a_body_over_the_limit_is_answered_413_naming_the_pools_fields(api) -> None:
    client, pool = api
    answer = client.post("/jobs", json={"command": ["python", "x" * 70_000], "min_np": 1}, headers=AUTH)
    assert answer.status_code == 413 and '"command"' in answer.json()["detail"] and '"np"' not in answer.text
    assert not pool.table.jobs


def test_a_call_without_its_credentials_is_401_whatever_its_body_not_json_included(api) -> None:
    client, pool = api
    for path in ("/hosts/a/poll", "/hosts/a/leave", "/jobs", "/jobs/x/scale"):
        for body in (b"{}", b'{"session": 1}', b'{"slots": "many"}', b"not json", b""):
            answer = client.post(path, content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 401, (path, body, answer.text)
    assert not pool.table.jobs


@pytest.mark.parametrize("body, says", [
    ({"command": ["no-such-trainer"], "min_np": 1}, "command 'no-such-trainer' is not found on this machine"),
    ({"command": ["true"], "min_np": 9}, "more than the pool's 8 slots"),
    ({"command": ["true"], "min_np": 1, "queue": "nope"}, "unknown queue 'nope'"),
    ({"command": ["true"], "min_np": 1, "priority": 5000}, "outside -1000..1000"),
    ({"command": ["true"], "min_np": 2, "max_np": 3, "group_size": 2}, "--max-np 3 is not a whole number of groups"),
])
def test_what_the_pool_cannot_take_is_refused_with_the_reason(api, body, says) -> None:
    client, _ = api
    answer = client.post("/jobs", json=body, headers=AUTH)
    assert answer.status_code == 400 and says in answer.json()["detail"], answer.text


def test_a_job_of_replica_groups_is_submitted_listed_and_scaled_in_whole_groups(api) -> None:
    client, pool = api
    answer = client.post("/jobs", json={"command": ["true"], "min_np": 2, "max_np": 6, "group_size": 2}, headers=AUTH)
    assert answer.status_code == 200 and answer.json()["group_size"] == 2, answer.text
    job_id = answer.json()["id"]
    assert pool.table.get(job_id).ask().group_size == 2
    refused = client.post(f"/jobs/{job_id}/scale", json={"np": 5}, headers=AUTH)
    assert refused.status_code == 409 and "give 4 or 6" in refused.json()["detail"], refused.text
    assert client.post(f"/jobs/{job_id}/scale", json={"np": 4}, headers=AUTH).status_code == 200


def test_cancel_and_scale_of_jobs_that_are_not_there_or_ended(api) -> None:
    client, _ = api
    assert client.post("/jobs/ghost/cancel", headers=AUTH).status_code == 404
    job = client.post("/jobs", json={"command": ["true"], "min_np": 1, "max_np": 3}, headers=AUTH).json()["id"]
    assert client.post(f"/jobs/{job}/scale", json={"np": 5}, headers=AUTH).status_code == 409
    assert client.post(f"/jobs/{job}/scale", json={"np": 2}, headers=AUTH).json()["max_np"] == 2
    assert client.get(f"/jobs/{job}/status", headers=AUTH).status_code == 409  # queued: no rendezvous yet
    assert client.post(f"/jobs/{job}/cancel", headers=AUTH).json()["state"] == "cancelled"
    again = client.post(f"/jobs/{job}/cancel", headers=AUTH)
    assert again.status_code == 409 and "already ended" in again.json()["detail"]


def test_a_flood_of_submits_is_answered_429_and_the_queue_keeps_its_jobs(api, monkeypatch) -> None:
    from ringmaster.rendezvous.pool import table

    monkeypatch.setattr(table, "MAX_SUBMITS_PER_MINUTE", 20)  # (the bound itself, smaller, to keep the test short)
    client, pool = api
    codes = [client.post("/jobs", json={"command": ["true"], "min_np": 1}, headers=AUTH).status_code for _ in range(50)]
    assert codes.count(200) == 20 and codes.count(429) == 30
    assert len(pool.table.live()) == 20


def test_a_queue_token_reaches_its_queues_jobs_only(tmp_path) -> None:
    pool = PoolService(StaticDiscovery({"a": 4}), "fair", Settings(queue_weights={"team-a": 1,
                                                                                  "team-b": 1}), {}, tmp_path,
                       lambda kind, **fields: None)
    pool.pool_hosts.hosts = {"a": 4}
    client = TestClient(create_pool_app(pool, SECRET, {"token-of-team-a-0123": "team-a"}))
    team_a = {"Authorization": "Bearer token-of-team-a-0123"}
    mine = client.post("/jobs", json={"command": ["true"], "min_np": 1, "queue": "team-a"}, headers=team_a)
    assert mine.status_code == 200, mine.text
    other = client.post("/jobs", json={"command": ["true"], "min_np": 1, "queue": "team-b"}, headers=AUTH).json()["id"]
    refused = client.post("/jobs", json={"command": ["true"], "min_np": 1, "queue": "team-b"}, headers=team_a)
    assert refused.status_code == 403 and "queue team-a only" in refused.json()["detail"]
    assert [j["id"] for j in client.get("/jobs", headers=team_a).json()] == [mine.json()["id"]]
    assert len(client.get("/jobs", headers=AUTH).json()) == 2
    hidden = client.post(f"/jobs/{other}/cancel", headers=team_a)
    assert hidden.status_code == 404 and "in queue team-a" in hidden.json()["detail"]
    assert pool.table.get(other).state == "queued"
    assert client.get("/hosts", headers=team_a).status_code == 403
    assert client.post(f"/jobs/{mine.json()['id']}/cancel", headers=team_a).json()["state"] == "cancelled"
    assert client.get("/jobs", headers={"Authorization": "Bearer token-of-team-a-0124"}).status_code == 401


def test_the_queue_tokens_file_is_checked_line_by_line() -> None:
    from ringmaster.common.errors import UsageError
    from ringmaster.rendezvous.pool.tokens import parse_queue_tokens

    queues = {"default", "team-a"}
    assert parse_queue_tokens("# tokens\nteam-a  aaaaaaaaaaaaaaaa\ndefault bbbbbbbbbbbbbbbb # the rest\n", queues) == {
        "aaaaaaaaaaaaaaaa": "team-a", "bbbbbbbbbbbbbbbb": "default"}
    for text, says in (("team-c aaaaaaaaaaaaaaaa", "line 1: unknown queue 'team-c'"), ("team-a short",
                                                                                       "shorter than 16"),
                       ("team-a", "two words"), ("team-a aaaaaaaaaaaaaaaa\ndefault aaaaaaaaaaaaaaaa",
                                                 "line 2: a token is given twice")):
        with pytest.raises(UsageError, match=says):
            parse_queue_tokens(text, queues)


def test_the_pools_metrics_count_slots_jobs_and_the_queue(api) -> None:
    client, pool = api
    queued = client.post("/jobs", json={"command": ["true"], "min_np": 2, "max_np": 4, "queue": "team-a"}, headers=AUTH)
    running = pool.table.get(client.post("/jobs", json={"command": ["true"], "min_np": 3}, headers=AUTH).json()["id"])
    running.state, running.placement, running.started_at = "running", {"a": 3}, running.submitted + 2.0
    text = client.get("/metrics", headers=AUTH).text
    assert 'ringmaster_pool_slots{state="usable"} 8.0' in text and 'ringmaster_pool_slots{state="used"} 3.0' in text
    assert "ringmaster_pool_utilisation 0.375" in text
    assert "ringmaster_pool_queue_length 1.0" in text
    assert 'ringmaster_pool_jobs{state="running"} 1.0' in text and 'ringmaster_pool_jobs{state="queued"} 1.0' in text
    assert f'ringmaster_pool_job_size{{job="{running.id}",queue="default"}} 3.0' in text
    assert f'ringmaster_pool_job_bound{{bound="max",job="{queued.json()["id"]}",queue="team-a"}} 4.0' in text
    assert 'ringmaster_pool_wait_seconds_bucket{le="5.0"} 1.0' in text


def test_the_pools_page_is_served_with_its_own_files_only(api) -> None:
    client, _ = api
    page = client.get("/")
    assert page.status_code == 200 and "pool.js" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    script = client.get("/pool.js").text
    assert 'fetch(path)' in script and '"jobs", "hosts"' in script
    assert client.get("/pool.css").headers["content-type"].startswith("text/css")


def test_nothing_in_a_request_picks_which_file_the_page_serves(api) -> None:
    client, _ = api
    plain = client.get("/").content
    for query in ("?name=../../../../etc/passwd", "?name=pool.js", "?package=os"):
        assert client.get("/" + query).content == plain
    assert client.get("/../pyproject.toml").status_code == 404


def test_a_job_that_waits_while_hosts_are_blacklisted_says_so(api) -> None:
    client, pool = api
    answer = client.post("/jobs", json={"command": ["python", "train.py"], "min_np": 2}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    now = time.time()
    pool.pool_hosts.blacklisted.update({"a": now + 300, "b": now + 120})
    pool._schedule(now)
    reason = client.get(f"/jobs/{answer.json()['id']}", headers=AUTH).json()["reason"]
    assert "2 host(s) out of the pool after failures: b for 120 s, a for 300 s" in reason, reason


def test_a_resized_job_settles_when_its_rendezvous_forms_a_generation_on_its_placement(api) -> None:
    """The pool hears its jobs' events: a generation formed on the placement the pool gave is the
    resize taken, and the interval between resizes counts from then (not from the decision)."""
    _, pool = api
    job = pool.table.submit(["python", "train.py"], 2, 4, time.time(), 8)
    job.state, job.placement, job.resized_at, job.settled = "running", {"a": 3}, time.time() - 100, False
    pool._job_event(job.id, Event(Kind.GENERATION_FORMED, {"number": 4, "size": 2, "hosts": {"a": 2}}))
    assert not job.settled  # the size before the resize
    before = time.time()
    pool._job_event(job.id, Event(Kind.GENERATION_FORMED, {"number": 5, "size": 3, "hosts": {"a": 3}}))
    assert job.settled and job.resized_at is not None and job.resized_at >= before
