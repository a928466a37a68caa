"""Shared fixtures: jobs that are always reaped."""

from __future__ import annotations

import logging
import os
import pathlib
import sys
from typing import Iterator

import pytest
from hypothesis import settings

# CI machines are small and busy: judge properties, not per-example speed.
settings.register_profile("ringmaster", deadline=None)
settings.load_profile("ringmaster")

# pytest's rewritten test modules are cached as bytecode only where bytecode may be written: with
# PYTHONDONTWRITEBYTECODE set (as on some machines) every worker rewrote all 240 modules at each
# run, 8.5 s of its collection. The caches live in git-ignored __pycache__ folders.
sys.dont_write_bytecode = False
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# Ray (the Ray tests' clusters) on loopback only: read when Ray is first imported, so set here.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

from etcd_server import ETCD, EtcdCluster, EtcdServer  # noqa: E402
from failure_report import Watchdog, job_sections  # noqa: E402
from harness import WATCHED_JOBS, Job  # noqa: E402
from unreaped import children, unreaped_since  # noqa: E402
from xdist_groups import group_items  # noqa: E402

#: Horovod's own test files run inside jobs of their own (tests/e2e/test_horovod_suite.py), never
#: collected by the suite itself.
collect_ignore = ["horovod"]

_JOBS = pytest.StashKey[list]()
_WATCHDOG = pytest.StashKey[Watchdog]()
_CHILDREN = pytest.StashKey[set]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CHILDREN] = children()


@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem):
    """After the test's fixtures tore down: a process it started and never waited for fails it (`unreaped`)."""
    yield
    left = unreaped_since(item.stash.get(_CHILDREN, set()))
    if left:
        pytest.fail(f"the test left {len(left)} process(es) it started unwaited for (zombies): {', '.join(left)}; "
                    "wait for every process a test starts (Popen.wait after a kill)", pytrace=False)


def _limit_s(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(item.config.getini("timeout") or 0)


#: Seconds a test that starts no whole job (not marked `slow`) may take: all take under 5 s, so
#: a hang costs a minute, not the 300 s every whole job gets (tests longer still say their own).
FAST_TEST_LIMIT_S = 60


@pytest.hookimpl(trylast=True)  # (after pytest-xdist's, whose group marks `group_items` mends)
def pytest_collection_modifyitems(config, items) -> None:
    group_items(config, items)
    for item in items:
        if item.get_closest_marker("slow") is None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(FAST_TEST_LIMIT_S))


@pytest.fixture(autouse=True)
def _watched_jobs():
    """Each test watches only the jobs it started (`harness.failed_job`)."""
    WATCHED_JOBS.clear()
    yield
    WATCHED_JOBS.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A watchdog takes the stacks of every process the test started shortly before its limit."""
    limit = _limit_s(item)
    if limit > 0:
        item.stash[_WATCHDOG] = Watchdog(limit)
    try:
        yield
    finally:
        watchdog = item.stash.get(_WATCHDOG, None)
        if watchdog is not None:
            watchdog.cancel()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """A failed test's report carries the story and output tail of each job it ran, and, when it
    ran out of time, the stacks the watchdog took."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for title, text in job_sections(item.stash.get(_JOBS, [])):
        report.sections.append((title, text))
    watchdog = item.stash.get(_WATCHDOG, None)
    if watchdog is not None and watchdog.stacks is not None:
        report.sections.append(("stacks of the test's processes before its time limit", watchdog.stacks))


def _running(etcd: EtcdServer | EtcdCluster) -> Iterator[EtcdServer | EtcdCluster]:
    """Start `etcd`, hand it to the test, kill it afterwards; skip where the binary is missing."""
    if ETCD is None:
        pytest.skip("the etcd binary is missing (Debian package etcd-server; .ci/run installs it)")
    try:
        yield etcd.start()
    finally:
        etcd.kill()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    """One real etcd on free loopback ports for the tests that share it (each uses its own prefix)."""
    yield from _running(EtcdServer(tmp_path_factory.mktemp("etcd")))


@pytest.fixture
def own_etcd(tmp_path):
    """An etcd of the test's own (tests kill and restart it)."""
    yield from _running(EtcdServer(tmp_path / "etcd"))


@pytest.fixture
def etcd_cluster(tmp_path):
    """A three-member etcd cluster of the test's own (tests kill members of it)."""
    yield from _running(EtcdCluster(tmp_path / "etcd-cluster"))


@pytest.fixture(params=["memory", "etcd"])
def make_store(request):
    """An async factory of fresh stores of one kind: the same tests run against both."""
    from ringmaster.rendezvous.state.etcd_kv import EtcdStore
    from ringmaster.rendezvous.state.memory_kv import MemoryStore

    if request.param == "memory":
        async def memory():
            return MemoryStore()
        return memory
    server = request.getfixturevalue("etcd")

    async def etcd_store():
        return await EtcdStore.connect([server.endpoint])
    return etcd_store


@pytest.fixture
def run_job(tmp_path, request):
    """Start `ringmaster run` jobs; all are killed (with their hosts) at teardown, and what each
    printed is kept as `<tmp_path>/job-N-<verb>.out` (a failure's whole story, which pytest's
    report cuts short)."""
    jobs: list[Job] = []
    request.node.stash[_JOBS] = jobs  # (a failed test's report tells each job's story)

    def start(*args: str, env: dict[str, str | None] | None = None, verb: str = "run", preexec=None,
              prefix: list[str] | None = None, program: list[str] | None = None, cwd=None) -> Job:
        job = Job([str(a) for a in args], env=env, verb=verb, preexec=preexec, prefix=prefix, program=program, cwd=cwd)
        jobs.append(job)
        return job

    yield start
    for number, job in enumerate(jobs):
        job.kill()
        job.save_output(tmp_path / f"job-{number}-{job.verb}.out")


@pytest.fixture
def alone(monkeypatch):
    """The training library as a job of one: no Ringmaster environment, a fresh `hvd.init()`."""
    import ringmaster.torch as hvd

    for name in list(os.environ):
        if name.startswith("RINGMASTER_"):
            monkeypatch.delenv(name)
    hvd.shutdown()
    hvd.init()
    yield
    hvd.shutdown()


class EventLog(logging.Handler):
    """The structured events logged in this process (records of the `ringmaster` loggers)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: list = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        if event is not None:
            self.events.append(event)

    def of(self, kind) -> list:
        return [e for e in self.events if e.kind == kind]


@pytest.fixture
def logged_events() -> Iterator[EventLog]:
    """Collect the events this process logs while the test runs."""
    logger = logging.getLogger("ringmaster")
    handler, level = EventLog(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
