"""deploy/: the Kubernetes manifests validate against Kubernetes' own schemas (the
kubernetes-validate package ships them), the compose file and the manifests start langrt with
arguments langrt's own parser accepts, and their pieces point at each other (probes, Service
selector, HPA target and metric). No cluster or container runtime is needed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from langrt.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S_VERSIONS = ("1.30.0", "1.37.0")  # oldest still common, and the newest the package has

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="pip install kubernetes-validate (in the dev extra)"
)


def _documents() -> list[dict]:
    docs = []
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def _by_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in _documents() if d["kind"] == kind}


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_validate_against_kubernetes_schemas(version):
    docs = _documents()
    assert {d["kind"] for d in docs} == {"Deployment", "Service", "HorizontalPodAutoscaler"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_refuses_a_broken_manifest():
    worker = _by_kind("Deployment")["langrt-worker"]
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"] = [30000]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["replica"] = 2  # a misspelt field: strict validation refuses it
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)


def _container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def test_workers_are_ready_on_health_and_register_with_the_router_service():
    deployments, services = _by_kind("Deployment"), _by_kind("Service")
    worker = _container(deployments["langrt-worker"], "langrt")
    assert worker["readinessProbe"]["httpGet"]["path"] == "/health"
    build_parser().parse_args(worker["args"])
    router = _container(deployments["langrt-router"], "router")
    build_parser().parse_args(router["args"])
    # Workers register through the router's Service; a router ready only once it has a worker
    # (its /health) would never get one.
    assert router["readinessProbe"]["httpGet"]["path"] == "/list_workers"
    service = services["langrt-router"]
    assert (
        service["spec"]["selector"].items()
        <= deployments["langrt-router"]["spec"]["template"]["metadata"]["labels"].items()
    )
    register = _container(deployments["langrt-worker"], "register")
    router_url = next(e["value"] for e in register["env"] if e["name"] == "ROUTER_URL")
    assert router_url == f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    assert "/add_worker?url=" in register["args"][0]
    assert "/remove_worker?url=" in register["lifecycle"]["preStop"]["exec"]["command"][-1]


def test_the_hpa_scales_the_workers_on_a_metric_langrt_exports():
    hpa = _by_kind("HorizontalPodAutoscaler")["langrt-worker"]
    assert hpa["spec"]["scaleTargetRef"]["name"] in _by_kind("Deployment")
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    gauge = metric.removeprefix("langrt_")
    source = (ROOT / "langrt" / "entrypoints" / "native_api.py").read_text()
    assert f'"{gauge}":' in source, f"/metrics has no gauge {metric}"


def test_compose_runs_a_router_over_two_healthy_workers():
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"worker-0", "worker-1", "router"}
    router = services["router"]
    ns = build_parser().parse_args(router["command"])
    assert ns.command == "router" and ns.policy == "cache_aware"
    assert ns.worker_urls == ["http://worker-0:30000", "http://worker-1:30000"]
    for name in ("worker-0", "worker-1"):
        worker = services[name]
        assert worker["image"] == router["image"] and "healthcheck" in worker
        assert build_parser().parse_args(worker["command"]).command == "launch"
        assert router["depends_on"][name] == {"condition": "service_healthy"}
    assert router["ports"] == ["127.0.0.1:30000:30000"]


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfiles_copy_what_exists_and_start_langrt(name):
    text = (DEPLOY / name).read_text()
    for source in re.findall(r"^COPY (.+) \S+$", text, flags=re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"{name} copies {path}, which is not in the repository"
    assert 'ENTRYPOINT ["langrt"]' in text
    cmd = yaml.safe_load(re.search(r"^CMD (.+)$", text, flags=re.M).group(1))
    assert build_parser().parse_args(cmd).command == "launch"
    assert (DEPLOY / f"{name}.dockerignore").is_file()


def _guide_commands() -> list[list[str]]:
    import shlex

    text = (DEPLOY / "README.md").read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands.append(shlex.split(line))
    return commands


def test_the_guide_commands_name_what_exists():
    commands = _guide_commands()
    kinds = {c[0] for c in commands}
    assert {"langrt", "docker", "kubectl", "curl"} <= kinds
    for command in commands:
        if command[0] == "langrt":
            build_parser().parse_args(command[1:])
        for flag, value in zip(command, command[1:]):
            if flag == "-f" and command[0] in ("docker", "kubectl"):
                assert (ROOT / value).is_file(), f"{' '.join(command)}: no {value}"
    applied = {v for c in commands if c[0] == "kubectl" for f, v in zip(c, c[1:]) if f == "-f"}
    assert applied == {f"deploy/k8s/{p.name}" for p in (DEPLOY / "k8s").glob("*.yaml")}
