"""deploy/k8s: the manifests parse, and their names, ports and endpoints agree with the
Collector configs (deploy/otel-collector.yaml, deploy/k8s/otel-collector-agent.yaml),
deploy/jaeger.yaml and the Prometheus configs. The configs themselves are checked with
the real ``otelcol validate`` and ``promtool check config`` when the binaries are built."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from otel_train import contract as c
from otel_train.export import resource
from otel_train.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUSTOMIZATION = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
DOCS = [
    d
    for rel in KUSTOMIZATION["resources"]
    for d in yaml.safe_load_all((DEPLOY / rel).read_text())
    if d
]
GATEWAY_CONFIG = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text())
AGENT_CONFIG = yaml.safe_load((DEPLOY / "k8s" / "otel-collector-agent.yaml").read_text())
JAEGER_CONFIG = yaml.safe_load((DEPLOY / "jaeger.yaml").read_text())
PROM_LOCAL = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
PROM_K8S = yaml.safe_load((DEPLOY / "k8s" / "prometheus.yml").read_text())


def obj(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_spec(workload)["containers"]
    return only  # type: ignore[no-any-return]


def env_of(workload: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(workload)["env"]}


def default(value: str) -> str:
    """The default of a ``${env:VAR:-default}`` expansion."""
    m = re.fullmatch(r"\$\{env:\w+:-(.*)\}", value)
    assert m, f"{value!r} is not an env expansion with a default"
    return m.group(1)


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def service_ports(name: str) -> dict[int, int]:
    svc = obj("Service", name)
    return {p["port"]: p.get("targetPort", p["port"]) for p in svc["spec"]["ports"]}


def container_ports(workload: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {p["containerPort"]: p for p in container(workload)["ports"]}


def service_reaches(service: str, port: int, workload: dict[str, Any]) -> None:
    svc = obj("Service", service)
    labels = workload["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items(), f"{service} selects no pod"
    target = service_ports(service).get(port)
    assert target is not None, f"Service {service} has no port {port}"
    assert target in container_ports(workload), f"{service}:{port} targets a closed port"


def otlp_ports(config: dict[str, Any]) -> dict[str, int]:
    protocols = config["receivers"]["otlp"]["protocols"]
    return {p: port_of(default(v["endpoint"])) for p, v in protocols.items()}


def telemetry_port(config: dict[str, Any]) -> int:
    reader = config["service"]["telemetry"]["metrics"]["readers"][0]
    return int(default(reader["pull"]["exporter"]["prometheus"]["port"]))


def configmap_files(name: str) -> dict[str, Path]:
    (gen,) = [g for g in KUSTOMIZATION["configMapGenerator"] if g["name"] == name]
    out = {}
    for entry in gen["files"]:
        key, _, rel = entry.partition("=")
        out[key] = DEPLOY / rel
    return out


def test_every_workload_selects_its_own_pods() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in DOCS}
    assert {
        ("DaemonSet", "otel-agent"),
        ("Deployment", "otel-gateway"),
        ("Deployment", "jaeger"),
        ("Deployment", "prometheus"),
        ("StatefulSet", "thanos-receive"),
        ("Deployment", "thanos-query"),
        ("Deployment", "victorialogs"),
        ("Job", "train"),
    } <= kinds
    for d in DOCS:
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet"):
            labels = d["spec"]["template"]["metadata"]["labels"]
            assert d["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_configmaps_are_generated_from_the_deploy_configs_and_mounted() -> None:
    assert configmap_files("otel-gateway-config") == {"config.yaml": DEPLOY / "otel-collector.yaml"}
    assert configmap_files("jaeger-config") == {"config.yaml": DEPLOY / "jaeger.yaml"}
    rules = configmap_files("prometheus-rules")
    assert set(rules.values()) == set((DEPLOY / "prometheus" / "rules").glob("*.yml"))
    generated = {g["name"] for g in KUSTOMIZATION["configMapGenerator"]}
    for d in DOCS:
        if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet", "Job"):
            for v in pod_spec(d).get("volumes", []):
                if "configMap" in v:
                    assert v["configMap"]["name"] in generated
    for name, files in (
        (g["name"], configmap_files(g["name"])) for g in KUSTOMIZATION["configMapGenerator"]
    ):
        for path in files.values():
            assert path.is_file() and path.resolve().is_relative_to(DEPLOY), name


def test_agent_listens_on_the_node_where_ranks_send() -> None:
    agent = obj("DaemonSet", "otel-agent")
    ports = container_ports(agent)
    for proto, port in otlp_ports(AGENT_CONFIG).items():
        assert ports[port]["hostPort"] == port, f"agent OTLP/{proto} is not on the node's IP"
    assert telemetry_port(AGENT_CONFIG) in ports
    job_env = env_of(obj("Job", "train"))
    assert job_env["HOST_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    endpoint = urlsplit(job_env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert endpoint.hostname == "$(host_ip)"  # urlsplit lowercases the host
    assert endpoint.port == otlp_ports(AGENT_CONFIG)["http"]
    assert job_env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"


def test_agent_forwards_to_the_gateway_service() -> None:
    # Every signal the gateway exports (traces, metrics, logs) reaches it from the agents.
    pipelines = AGENT_CONFIG["service"]["pipelines"]
    assert set(pipelines) == set(GATEWAY_CONFIG["service"]["pipelines"])
    assert all(p["exporters"] == ["otlp_grpc/gateway"] for p in pipelines.values())
    exporter = AGENT_CONFIG["exporters"]["otlp_grpc/gateway"]["endpoint"]
    env = env_of(obj("DaemonSet", "otel-agent"))
    for endpoint in (default(exporter), env["OTELCOL_GATEWAY_ENDPOINT"]):
        host, port = endpoint.rsplit(":", 1)
        assert int(port) == otlp_ports(GATEWAY_CONFIG)["grpc"]
        service_reaches(host, int(port), obj("Deployment", "otel-gateway"))


def test_gateway_exports_to_the_jaeger_prometheus_and_victorialogs_services() -> None:
    env = env_of(obj("Deployment", "otel-gateway"))
    exporters = GATEWAY_CONFIG["exporters"]
    jaeger = env["OTELCOL_JAEGER_OTLP_ENDPOINT"]
    assert jaeger == default(exporters["otlp_grpc/jaeger"]["endpoint"])
    host, port = jaeger.rsplit(":", 1)
    assert int(port) == otlp_ports(JAEGER_CONFIG)["grpc"]
    service_reaches(host, int(port), obj("Deployment", "jaeger"))
    prom = env["OTELCOL_PROMETHEUS_OTLP_ENDPOINT"]
    assert prom == default(exporters["otlp_http/prometheus"]["endpoint"])
    url = urlsplit(prom)
    assert url.path == "/api/v1/otlp"
    assert url.hostname and url.port
    service_reaches(url.hostname, url.port, obj("Deployment", "prometheus"))
    assert "--web.enable-otlp-receiver" in container(obj("Deployment", "prometheus"))["args"]
    logs = env["OTELCOL_VICTORIALOGS_OTLP_ENDPOINT"]
    assert logs == default(exporters["otlp_http/victorialogs"]["endpoint"])
    url = urlsplit(logs)
    assert url.path == "/insert/opentelemetry"  # the exporter appends /v1/logs
    assert url.hostname and url.port
    victorialogs = obj("Deployment", "victorialogs")
    service_reaches(url.hostname, url.port, victorialogs)
    assert f"-httpListenAddr=:{url.port}" in container(victorialogs)["args"]


def test_prometheus_k8s_config_matches_the_local_one_and_scrapes_the_collectors() -> None:
    for key in ("global", "otlp", "storage", "rule_files"):
        assert PROM_K8S[key] == PROM_LOCAL[key], f"deploy/k8s/prometheus.yml {key} differs"
    (local,), (k8s,) = PROM_LOCAL["remote_write"], PROM_K8S["remote_write"]
    assert {**k8s, "url": ""} == {**local, "url": ""}  # the same but for the address
    prom = obj("Deployment", "prometheus")
    args = container(prom)["args"]
    config_path = next(a.split("=", 1)[1] for a in args if a.startswith("--config.file="))
    mounts = {m["name"]: m["mountPath"] for m in container(prom)["volumeMounts"]}
    assert mounts["config"] == config_path
    assert configmap_files("prometheus-config") == {
        Path(config_path).name: DEPLOY / "k8s" / "prometheus.yml"
    }
    (rule_glob,) = PROM_K8S["rule_files"]
    assert str(Path(config_path).parent / Path(rule_glob).parent) == mounts["rules"]
    by_job = {j["job_name"]: j["dns_sd_configs"][0] for j in PROM_K8S["scrape_configs"]}
    for job, service, workload in (
        ("otelcol-agent", "otel-agent", obj("DaemonSet", "otel-agent")),
        ("otelcol-gateway", "otel-gateway-pods", obj("Deployment", "otel-gateway")),
    ):
        sd = by_job[job]
        assert sd["names"] == [service]
        assert obj("Service", service)["spec"]["clusterIP"] == "None"  # one record per pod
        config = AGENT_CONFIG if workload["kind"] == "DaemonSet" else GATEWAY_CONFIG
        assert sd["port"] == telemetry_port(config)
        service_reaches(service, sd["port"], workload)


def test_training_job_environment_becomes_the_resource(monkeypatch: pytest.MonkeyPatch) -> None:
    job = obj("Job", "train")
    assert job["spec"]["completionMode"] == "Indexed"
    env = env_of(job)
    for name in ("K8S_POD_NAME", "K8S_NAMESPACE_NAME", "K8S_NODE_NAME", "K8S_JOB_NAME"):
        assert "fieldRef" in env[name], f"{name} should come from the downward API"
    assert "--node_rank=$(JOB_COMPLETION_INDEX)" in container(job)["command"]
    # What the pod would see: every downward-API variable lands on the resource.
    for var in [*env, "JOB_COMPLETION_INDEX", "RANK", "TORCHELASTIC_RUN_ID"]:
        monkeypatch.setenv(var, "7")
    attrs = resource.build_resource(Settings()).attributes
    for key in ("k8s.pod.name", "k8s.namespace.name", "k8s.node.name", "k8s.job.name"):
        assert attrs[key] == "7"
    assert attrs[c.RESOURCE_NODE_RANK.key] == 7
    assert attrs["host.name"] == "7"  # the node, not the pod's hostname
    service_reaches("train", 29500, job)
    assert pod_spec(job)["subdomain"] == "train"


def test_images_are_the_pinned_versions() -> None:
    versions = dict(
        line.split("=", 1)
        for line in (DEPLOY / "versions.env").read_text().splitlines()
        if line and not line.startswith("#")
    )
    kinds = ("DaemonSet", "Deployment", "StatefulSet")
    images = {container(d)["image"] for d in DOCS if d["kind"] in kinds}
    assert images == {
        f"otel/opentelemetry-collector-contrib:{versions['OTELCOL_VERSION']}",
        f"jaegertracing/jaeger:{versions['JAEGER_VERSION']}",
        f"prom/prometheus:v{versions['PROMETHEUS_VERSION']}",
        f"quay.io/thanos/thanos:v{versions['THANOS_VERSION']}",
        f"victoriametrics/victoria-logs:v{versions['VICTORIALOGS_VERSION']}",
    }


def test_agent_config_is_valid_for_the_real_collector(stack_bins: Path) -> None:
    done = subprocess.run(
        [
            str(stack_bins / "otelcol"),
            "validate",
            f"--config={DEPLOY / 'k8s/otel-collector-agent.yaml'}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_k8s_prometheus_config_is_valid_for_promtool(stack_bins: Path) -> None:
    done = subprocess.run(
        [str(stack_bins / "promtool"), "check", "config", str(DEPLOY / "k8s/prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments by name (the subcommand left out)."""
    return dict(a.split("=", 1) for a in args if a.startswith("--"))


def test_prometheus_writes_to_the_receive_hashring(stack_module: Any) -> None:
    (write,) = PROM_K8S["remote_write"]
    url = urlsplit(write["url"])
    assert url.path == "/api/v1/receive" and url.hostname and url.port
    assert write["send_native_histograms"] and write["send_exemplars"]
    receive = obj("StatefulSet", "thanos-receive")
    service_reaches(url.hostname, url.port, receive)
    args = flags(container(receive)["args"])
    assert port_of(args["--remote-write.address"]) == url.port
    # The hashring names every pod of the StatefulSet, by its headless Service's DNS name.
    pods = receive["spec"]["serviceName"]
    assert obj("Service", pods)["spec"]["clusterIP"] == "None"
    (ring,) = json.loads(configmap_files("thanos-receive-hashring")["hashrings.json"].read_text())
    grpc = port_of(args["--grpc-address"])
    replicas = receive["spec"]["replicas"]
    assert ring["endpoints"] == [f"thanos-receive-{i}.{pods}:{grpc}" for i in range(replicas)]
    assert args["--receive.local-endpoint"] == f"$(POD_NAME).{pods}:{grpc}"
    mounts = {m["name"]: m["mountPath"] for m in container(receive)["volumeMounts"]}
    assert args["--receive.hashrings-file"] == f"{mounts['hashring']}/hashrings.json"
    service_reaches(pods, grpc, receive)
    # What the loopback stack runs, in the same terms.
    local = flags(stack_module.thanos_plan()["thanos-receive"]["cmd"][2:])
    for name in ("--tsdb.max-exemplars", "--tsdb.out-of-order.time-window"):
        assert args[name] == local[name], name
    label = stack_module.THANOS_REPLICA_LABEL
    assert args["--label"] == f'{label}="$(POD_NAME)"'


def test_thanos_query_reads_every_receive_pod(stack_module: Any) -> None:
    query = obj("Deployment", "thanos-query")
    args = flags(container(query)["args"])
    (endpoint,) = yaml.safe_load(args["--endpoint.sd-config"])["endpoints"]
    host, port = endpoint["address"].removeprefix("dns+").rsplit(":", 1)
    service_reaches(host, int(port), obj("StatefulSet", "thanos-receive"))
    assert args["--query.replica-label"] == stack_module.THANOS_REPLICA_LABEL
    service_reaches("thanos-query", port_of(args["--http-address"]), query)
