"""deploy/k8s: the manifests are what kubectl reads, and they say what the product needs.

No Kubernetes API server can be had on these machines, and `kubectl apply --dry-run=client` asks
one for its API groups: the test runs it, and where it says no server answers, it checks the
manifests with what kubectl does without one: `kubectl kustomize` builds them and `kubectl label
--local` decodes every object. Then it checks what Ringmaster needs of them: the flags parse as
Ringmaster's own parsers read them, the agents join by connecting, the rendezvous keeps its state
in the etcd the manifests run, the kubelet's grace outlasts the agents' drain, and the secret
comes from a Kubernetes Secret.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from ringmaster.cli.main import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on this machine")


def kubectl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin:/usr/local/bin", "KUBECONFIG": "/dev/null", "HOME": "/tmp"})


@pytest.fixture(scope="module")
def objects() -> dict[tuple[str, str], dict]:
    dry = kubectl("apply", "--dry-run=client", "-k", str(K8S))
    if dry.returncode != 0:
        # no server, nothing else
        assert "connection refused" in dry.stderr or "unable to recognize" in dry.stderr, dry.stderr
    built = kubectl("kustomize", str(K8S))
    assert built.returncode == 0, built.stderr
    decoded = kubectl("label", "--local", "-f", "-", "-o", "json", "ringmaster.checked=yes", stdin=built.stdout)
    assert decoded.returncode == 0, decoded.stderr
    items: list[dict] = []
    text, at = decoded.stdout, 0
    decoder = json.JSONDecoder()
    while text[at:].strip():  # one JSON object per manifest, one after another
        at += len(text[at:]) - len(text[at:].lstrip())
        item, at = decoder.raw_decode(text, at)
        items += item["items"] if item.get("kind") == "List" else [item]
    return {(o["kind"], o["metadata"]["name"]): o for o in items}


def container(obj: dict) -> dict:
    (only,) = obj["spec"]["template"]["spec"]["containers"]
    return only


def test_the_manifests_hold_etcd_two_rendezvous_agents_and_a_disruption_budget(objects) -> None:
    assert objects[("StatefulSet", "etcd")]["spec"]["replicas"] == 3
    assert objects[("Deployment", "ringmaster-rendezvous")]["spec"]["replicas"] == 2
    assert objects[("StatefulSet", "ringmaster-agent")]["spec"]["replicas"] >= 1
    budget = objects[("PodDisruptionBudget", "ringmaster-agent")]
    assert budget["spec"]["selector"]["matchLabels"] == {"app": "ringmaster-agent"}


def test_the_rendezvous_flags_parse_and_keep_the_job_in_the_manifests_etcd(objects) -> None:
    rendezvous = container(objects[("Deployment", "ringmaster-rendezvous")])
    args = [a.replace("$(POD_IP)", "10.0.0.1") for a in rendezvous["args"]]
    parsed, unknown = build_parser().parse_known_args(args)
    assert not unknown and parsed.verb == "serve" and parsed.hosts_from_agents
    members = parsed.store.removeprefix("etcd://").split("/")[0].split(",")
    assert members == [f"etcd-{i}.etcd:2379" for i in range(3)]
    assert rendezvous["readinessProbe"]["tcpSocket"]["port"] == parsed.port  # only the leader listens, so is ready
    service_ports = {p["port"] for p in objects[("Service", "ringmaster-rendezvous")]["spec"]["ports"]}
    assert parsed.port in service_ports


def test_agents_join_by_connecting_and_drain_within_the_kubelets_grace(objects) -> None:
    agents = objects[("StatefulSet", "ringmaster-agent")]
    agent = container(agents)
    help_text = subprocess.run([sys.executable, "-m", "ringmaster.worker.agent", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in agent["args"][1:]}
    assert agent["args"][0] == "agent" and all(flag in help_text for flag in flags)
    assert flags["--rendezvous"] == "ringmaster-rendezvous:29400"
    grace = agents["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert float(flags["--drain-grace"]) + 10 <= grace  # the drain ends (and the agent exits) before SIGKILL


def test_every_part_proves_the_job_secret_from_a_kubernetes_secret(objects) -> None:
    for key in (("Deployment", "ringmaster-rendezvous"), ("StatefulSet", "ringmaster-agent")):
        env = {e["name"]: e for e in container(objects[key])["env"]}
        assert env["RINGMASTER_SECRET"]["valueFrom"]["secretKeyRef"] == {"name": "ringmaster-secret",
                                                                         "key": "RINGMASTER_SECRET"}
    assert not [o for o in objects.values() if o["kind"] == "Secret"]  # made by the user, never committed
