"""Checks of the deploy/ configs: versions agree everywhere, the OCB manifest
holds exactly the components the collector config uses, and the real binaries
accept the configs (`otelcol validate`, `jaeger validate`, `promtool check config`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"

KINDS = ("receivers", "processors", "exporters", "extensions")

# Go module (last path element) -> component type, as in each module's
# metadata.yaml at collector 0.165.0. Only modules the manifest may list.
MODULE_TYPES = {
    "otlpreceiver": "otlp",
    "memorylimiterprocessor": "memory_limiter",
    "batchprocessor": "batch",
    "resourceprocessor": "resource",
    "transformprocessor": "transform",
    "schemaprocessor": "schema",
    "otlpexporter": "otlp_grpc",
    "otlphttpexporter": "otlp_http",
    "debugexporter": "debug",
    "healthcheckextension": "health_check",
}


def load(name: str):
    return yaml.safe_load((DEPLOY / name).read_text())


# Every port compose publishes binds here unless OTEL_TRAIN_BIND says otherwise.
LOOPBACK = "${OTEL_TRAIN_BIND:-127.0.0.1}"


def test_compose_publishes_every_port_on_loopback_only():
    published = {
        name: svc.get("ports", []) for name, svc in load("compose.yaml")["services"].items()
    }
    assert any(published.values())
    for name, ports in published.items():
        for port in ports:  # "HOST:PUBLISHED:CONTAINER", HOST the variable above
            assert port.startswith(f"{LOOPBACK}:") and port.count(":") == 3, (name, port)


def test_compose_grafana_lets_anonymous_visitors_look_and_not_change():
    env = load("compose.yaml")["services"]["grafana"]["environment"]
    assert env.get("GF_AUTH_ANONYMOUS_ORG_ROLE", "Viewer") == "Viewer"
    assert str(env.get("GF_AUTH_DISABLE_LOGIN_FORM", "false")).lower() == "false"
    assert "GF_AUTH_BASIC_ENABLED" not in env and "GF_AUTH_DISABLE_SIGNOUT_MENU" not in env


def test_prometheus_runs_without_its_lifecycle_api(stack_module):
    """No /-/reload or /-/quit for whoever reaches the port: neither in compose nor on
    the loopback stack (deploy/README.md says how to turn it on deliberately)."""
    compose = load("compose.yaml")["services"]["prometheus"]["command"]
    loopback = stack_module.service_plan()["prometheus"]["cmd"]
    for command in (compose, loopback):
        assert "--web.enable-lifecycle" not in command


def used_component_types(config: dict) -> dict[str, set[str]]:
    """Component types per kind that the collector config defines (`type/name` -> `type`)."""
    return {kind: {key.split("/", 1)[0] for key in (config.get(kind) or {})} for kind in KINDS}


def manifest_types(manifest: dict) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for kind in KINDS:
        types = set()
        for entry in manifest.get(kind) or []:
            module = entry["gomod"].split()[0]
            base = module.rsplit("/", 1)[1]
            assert base in MODULE_TYPES, f"unknown module {module}: add its type to MODULE_TYPES"
            types.add(MODULE_TYPES[base])
        out[kind] = types
    return out


# --------------------------------------------------------------------------- versions


def test_versions_file_is_complete(versions):
    for key in (
        "OTELCOL_VERSION",
        "OTELCOL_STABLE_VERSION",
        "OCB_VERSION",
        "JAEGER_VERSION",
        "JAEGER_GO_MODULE_VERSION",
        "PROMETHEUS_VERSION",
        "PROMETHEUS_GO_MODULE_VERSION",
        "GRAFANA_VERSION",
        "THANOS_VERSION",
        "VICTORIALOGS_VERSION",
    ):
        assert re.fullmatch(r"\d+\.\d+\.\d+", versions.get(key, "")), key
    assert versions["OCB_VERSION"] == versions["OTELCOL_VERSION"]
    major, minor, patch = versions["PROMETHEUS_VERSION"].split(".")
    assert versions["PROMETHEUS_GO_MODULE_VERSION"] == f"0.{int(major) * 100 + int(minor)}.{patch}"
    assert versions["GRAFANA_VERSION"].startswith("13.")


def test_compose_image_tags_match_versions(versions):
    compose = load("compose.yaml")
    images = {name: svc["image"] for name, svc in compose["services"].items()}
    assert images == {
        "otel-collector": f"otel/opentelemetry-collector-contrib:{versions['OTELCOL_VERSION']}",
        "jaeger": f"jaegertracing/jaeger:{versions['JAEGER_VERSION']}",
        "prometheus": f"prom/prometheus:v{versions['PROMETHEUS_VERSION']}",
        "thanos-receive": f"quay.io/thanos/thanos:v{versions['THANOS_VERSION']}",
        "thanos-query": f"quay.io/thanos/thanos:v{versions['THANOS_VERSION']}",
        "victorialogs": f"victoriametrics/victoria-logs:v{versions['VICTORIALOGS_VERSION']}",
        "grafana": f"grafana/grafana:{versions['GRAFANA_VERSION']}",
    }


def test_compose_mounts_the_deploy_configs():
    services = load("compose.yaml")["services"]

    def sources(name):
        return {v.split(":")[0]: v.split(":")[1] for v in services[name].get("volumes", [])}

    assert sources("otel-collector")["./otel-collector.yaml"] == "/etc/otelcol/config.yaml"
    assert "--config=/etc/otelcol/config.yaml" in services["otel-collector"]["command"]
    assert sources("jaeger")["./jaeger.yaml"] == "/etc/jaeger/config.yaml"
    assert "--config=/etc/jaeger/config.yaml" in services["jaeger"]["command"]
    prom = sources("prometheus")
    assert prom["./prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    # prometheus.yml refers to prometheus/rules and prometheus/targets relative to itself
    assert prom["./prometheus"] == "/etc/prometheus/prometheus"
    flags = services["prometheus"]["command"]
    assert "--web.enable-otlp-receiver" in flags
    assert "--enable-feature=exemplar-storage" in flags
    grafana = sources("grafana")
    assert grafana["../grafana/provisioning"] == "/etc/grafana/provisioning"
    assert "../grafana/dashboards" in grafana
    published = {p.rsplit(":", 2)[1] for svc in services.values() for p in svc.get("ports", [])}
    assert {"4317", "4318", "16686", "9090", "9428", "3000"} <= published
    # Grafana installs the VictoriaLogs data source's plugin (its type in provisioning).
    assert services["grafana"]["environment"]["GF_PLUGINS_PREINSTALL"] == (
        "victoriametrics-logs-datasource"
    )


def test_compose_runs_victorialogs_as_the_loopback_stack_does(stack_module):
    """The same flags as scripts/stack but for the data path and the listen address, and
    the Collector's default logs endpoint is the compose service's OTLP path."""
    services = load("compose.yaml")["services"]
    svc = services["victorialogs"]
    compose_flags = dict(a.split("=", 1) for a in svc["command"])
    local = dict(
        a.split("=", 1) for a in stack_module.victorialogs_plan()["victorialogs"]["cmd"][1:]
    )
    assert set(compose_flags) == set(local)
    for flag in set(local) - {"-storageDataPath", "-httpListenAddr"}:
        assert compose_flags[flag] == local[flag], flag
    (volume,) = svc["volumes"]
    assert volume.split(":")[1] == compose_flags["-storageDataPath"]
    port = compose_flags["-httpListenAddr"].rsplit(":", 1)[1]
    assert f"{LOOPBACK}:{port}:{port}" in svc["ports"]
    exporter = load("otel-collector.yaml")["exporters"]["otlp_http/victorialogs"]["endpoint"]
    assert exporter.endswith(f":-http://victorialogs:{port}/insert/opentelemetry}}")


def test_compose_runs_thanos_as_the_loopback_stack_does(stack_module):
    """Thanos shares Prometheus's network namespace in compose, so prometheus.yml's loopback
    remote write reaches it; its flags are those scripts/stack starts it with, but for the
    addresses."""
    services = load("compose.yaml")["services"]
    (write,) = load("prometheus.yml")["remote_write"]
    plan = stack_module.thanos_plan()
    for name in ("thanos-receive", "thanos-query"):
        svc = services[name]
        assert svc["network_mode"] == "service:prometheus"
        compose_flags = dict(a.split("=", 1) for a in svc["command"][1:])
        local = dict(a.split("=", 1) for a in plan[name]["cmd"][2:])
        assert svc["command"][0] == plan[name]["cmd"][1]  # the subcommand
        assert set(compose_flags) == set(local)
        where = {"--tsdb.path", "--endpoint.sd-config"}  # paths and addresses differ
        for flag, value in local.items():
            if not flag.endswith("-address") and flag not in where:
                assert compose_flags[flag] == value, (name, flag)
    receive = dict(a.split("=", 1) for a in services["thanos-receive"]["command"][1:])
    assert write["url"] == f"http://{receive['--remote-write.address']}/api/v1/receive"
    query = dict(a.split("=", 1) for a in services["thanos-query"]["command"][1:])
    (endpoint,) = yaml.safe_load(query["--endpoint.sd-config"])["endpoints"]
    assert endpoint["address"] == receive["--grpc-address"]
    published = {p.rsplit(":", 2)[1] for p in services["prometheus"]["ports"]}
    assert query["--http-address"].rsplit(":", 1)[1] in published


def test_ocb_manifest_pins_one_release(versions):
    manifest = load("otelcol-builder.yaml")
    assert manifest["dist"]["version"] == versions["OTELCOL_VERSION"]
    assert manifest["dist"]["name"] == "otelcol"
    entries = [e for kind in (*KINDS, "providers") for e in manifest.get(kind) or []]
    assert entries
    for entry in entries:
        _module, version = entry["gomod"].split()
        expected = (
            versions["OTELCOL_STABLE_VERSION"]
            if version.startswith("v1.")
            else versions["OTELCOL_VERSION"]
        )
        assert version == f"v{expected}", entry["gomod"]
    providers = {e["gomod"].split()[0].rsplit("/", 1)[1] for e in manifest["providers"]}
    assert {"envprovider", "fileprovider"} <= providers


# --------------------------------------------------------------------------- collector config


def used_by_the_configs() -> dict[str, set[str]]:
    """Component types the collector config and its schema overlay use."""
    main = used_component_types(load("otel-collector.yaml"))
    overlay = used_component_types(load("otel-collector.schema.yaml"))
    return {kind: main[kind] | overlay[kind] for kind in KINDS}


def test_ocb_manifest_lists_exactly_the_used_components():
    assert manifest_types(load("otelcol-builder.yaml")) == used_by_the_configs()


def test_the_schema_overlay_targets_the_contracts_schema():
    """The overlay reads every otel-train version under the names of this one (the
    schema URL its tracers and meters carry), before the batch processor."""
    from otel_train import contract as c

    overlay = load("otel-collector.schema.yaml")
    (target,) = overlay["processors"]["schema/otel_train"]["targets"]
    assert target == f"${{env:OTELCOL_OTEL_TRAIN_SCHEMA:-{c.SCHEMA_URL}}}"
    main = load("otel-collector.yaml")["service"]["pipelines"]
    for name, pipeline in overlay["service"]["pipelines"].items():
        processors = main[name]["processors"]
        assert pipeline["processors"] == [*processors[:-1], "schema/otel_train", processors[-1]]


def test_every_defined_component_is_wired_into_the_service():
    config = load("otel-collector.yaml")
    service = config["service"]
    wired = {"extensions": set(service.get("extensions") or [])}
    for kind in ("receivers", "processors", "exporters"):
        wired[kind] = {c for p in service["pipelines"].values() for c in p.get(kind) or []}
    for kind in KINDS:
        assert set(config.get(kind) or {}) == wired[kind], kind


def test_collector_pipelines():
    config = load("otel-collector.yaml")
    pipelines = config["service"]["pipelines"]
    assert set(pipelines) == {"traces", "metrics", "logs"}
    for pipeline in pipelines.values():
        assert pipeline["receivers"] == ["otlp"]
        assert pipeline["processors"][0] == "memory_limiter"
        assert pipeline["processors"][-1] == "batch"
    assert "otlp_grpc/jaeger" in pipelines["traces"]["exporters"]
    assert "otlp_http/prometheus" in pipelines["metrics"]["exporters"]
    # VictoriaLogs takes OTLP/HTTP protobuf at <base>/v1/logs; the exporter appends /v1/logs.
    assert "otlp_http/victorialogs" in pipelines["logs"]["exporters"]
    assert config["exporters"]["otlp_http/victorialogs"]["endpoint"].endswith(
        "/insert/opentelemetry}"
    )
    assert config["exporters"]["otlp_http/prometheus"]["endpoint"].endswith("/api/v1/otlp}")
    protocols = config["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":-0.0.0.0:4317}")
    assert protocols["http"]["endpoint"].endswith(":-0.0.0.0:4318}")


ENV_REF = re.compile(r"\$\{env:([A-Z0-9_]+)(?::-[^}]*)?\}")


def _endpoint_values(node, path=""):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("endpoint", "host", "port") and not isinstance(value, (dict, list)):
                yield f"{path}.{key}", str(value)
            else:
                yield from _endpoint_values(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _endpoint_values(value, f"{path}[{i}]")


@pytest.mark.parametrize("name", ["otel-collector.yaml", "jaeger.yaml"])
def test_every_address_is_env_substitutable(name):
    values = list(_endpoint_values(load(name)))
    assert values
    for where, value in values:
        assert ENV_REF.fullmatch(value), f"{name}{where} = {value!r} is not ${{env:VAR:-default}}"


@pytest.mark.parametrize("name", ["otel-collector.yaml", "jaeger.yaml"])
def test_stack_script_sets_every_address_variable(name, stack_module):
    """scripts/stack must set each address variable, or loopback runs would use compose defaults."""
    plan = stack_module.service_plan()
    service = "otelcol" if name == "otel-collector.yaml" else "jaeger"
    referenced = set()
    for _, value in _endpoint_values(load(name)):
        referenced.update(ENV_REF.findall(value))
    assert referenced <= set(plan[service]["env"]), referenced - set(plan[service]["env"])


def test_jaeger_config_shape():
    config = load("jaeger.yaml")
    service = config["service"]
    assert set(service["extensions"]) == {"jaeger_storage", "jaeger_query", "healthcheckv2"}
    traces = service["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and traces["exporters"] == ["jaeger_storage_exporter"]
    backends = config["extensions"]["jaeger_storage"]["backends"]
    store = config["extensions"]["jaeger_query"]["storage"]["traces"]
    assert "memory" in backends[store]
    assert config["exporters"]["jaeger_storage_exporter"]["trace_storage"] == store


# --------------------------------------------------------------------------- prometheus config


def test_prometheus_otlp_block():
    otlp = load("prometheus.yml")["otlp"]
    assert set(otlp["promote_resource_attributes"]) >= {
        "service.name",
        "service.instance.id",
        "service.namespace",
        "host.name",
        "otel_train.rank",
        "otel_train.local_rank",
        "otel_train.job",
    }
    assert otlp["keep_identifying_resource_attributes"] is True


def test_prometheus_scrape_job_marks_its_series():
    jobs = {j["job_name"]: j for j in load("prometheus.yml")["scrape_configs"]}
    job = jobs["otel-train-inprocess"]
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:9464"]
    marks = [
        r
        for r in job["relabel_configs"]
        if r.get("target_label") == "otel_train_source" and r.get("replacement") == "scrape"
    ]
    assert marks, 'scraped series must get otel_train_source="scrape" (double-counting rule)'


# --------------------------------------------------------------------------- with the binaries


def _run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


def _clean_env():
    """The environment without any address override, so the files' defaults are checked."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OTELCOL_", "JAEGER_"))}


def test_binaries_report_pinned_versions(stack_bins, versions):
    out = _run([stack_bins / "otelcol", "--version"])
    assert out.returncode == 0 and versions["OTELCOL_VERSION"] in out.stdout, out
    out = _run([stack_bins / "jaeger", "version"])
    assert out.returncode == 0 and versions["JAEGER_VERSION"] in out.stdout + out.stderr, out
    for tool in ("prometheus", "promtool"):
        out = _run([stack_bins / tool, "--version"])
        assert (
            out.returncode == 0
            and f"version {versions['PROMETHEUS_VERSION']}" in out.stdout + out.stderr
        ), out
    out = _run([stack_bins / "victoria-logs", "-version"])
    assert out.returncode == 0 and f"v{versions['VICTORIALOGS_VERSION']}" in out.stdout, out


def test_otelcol_validate(stack_bins):
    out = _run(
        [stack_bins / "otelcol", "validate", f"--config={DEPLOY / 'otel-collector.yaml'}"],
        env=_clean_env(),
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_otelcol_validate_with_the_schema_overlay(stack_bins):
    configs = [f"--config={DEPLOY / name}" for name in ("otel-collector.yaml",
                                                        "otel-collector.schema.yaml")]  # fmt: skip
    out = _run([stack_bins / "otelcol", "validate", *configs], env=_clean_env())
    assert out.returncode == 0, out.stdout + out.stderr


def test_otelcol_validate_with_loopback_addresses(stack_bins, stack_module):
    env = {**_clean_env(), **stack_module.service_plan()["otelcol"]["env"]}
    out = _run(
        [stack_bins / "otelcol", "validate", f"--config={DEPLOY / 'otel-collector.yaml'}"], env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_otelcol_has_exactly_the_used_components(stack_bins):
    """The built binary's component list (from `otelcol components`) is what the config uses."""
    out = _run([stack_bins / "otelcol", "components"])
    assert out.returncode == 0, out.stderr
    info = yaml.safe_load(out.stdout)
    built = {kind: {c["name"] for c in info.get(kind) or []} for kind in KINDS}
    used = used_by_the_configs()
    for kind in KINDS:
        # deprecated aliases (otlp -> otlp_grpc, otlphttp -> otlp_http) are not listed separately
        assert built[kind] == used[kind], kind


def test_jaeger_validate(stack_bins):
    out = _run(
        [stack_bins / "jaeger", "validate", f"--config={DEPLOY / 'jaeger.yaml'}"], env=_clean_env()
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_check_config(stack_bins):
    out = _run([stack_bins / "promtool", "check", "config", DEPLOY / "prometheus.yml"])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WARNING" not in out.stdout + out.stderr, out.stdout + out.stderr


def test_stack_moves_the_in_process_target_and_the_store_to_their_ports(
    stack_bins, stack_module, tmp_path
):
    # Prometheus cannot expand environment variables in its config: `up` renders a copy.
    dest = tmp_path / "run" / "prometheus-config" / "prometheus.yml"
    ports = {"TRAINING_METRICS": 19464, "THANOS_RECEIVE_WRITE": 29291}
    moved = stack_module.render_prometheus_config(DEPLOY / "prometheus.yml", dest, ports)
    assert moved == 2
    rendered, original = yaml.safe_load(dest.read_text()), load("prometheus.yml")
    jobs = {j["job_name"]: j for j in rendered["scrape_configs"]}
    assert jobs["otel-train-inprocess"]["static_configs"][0]["targets"] == ["127.0.0.1:19464"]
    jobs["otel-train-inprocess"]["static_configs"][0]["targets"] = ["127.0.0.1:9464"]
    (write,) = rendered["remote_write"]
    assert write["url"] == "http://127.0.0.1:29291/api/v1/receive"
    write["url"] = "http://127.0.0.1:19291/api/v1/receive"
    assert rendered == original  # nothing else changed
    # Its relative rule and target paths resolve from the copy: promtool loads the rules.
    out = _run([stack_bins / "promtool", "check", "config", dest])
    assert out.returncode == 0, out.stdout + out.stderr
    rule_files = len(list((DEPLOY / "prometheus" / "rules").glob("*.yml")))
    assert f"SUCCESS: {rule_files} rule files found" in out.stdout + out.stderr, out.stdout


def test_stack_validate_command(stack_bins):
    out = _run([REPO / "scripts" / "stack", "validate"], env=_clean_env())
    assert out.returncode == 0, out.stdout + out.stderr
