"""Per-rank identity on the resource, and the /metrics port policy for several ranks a node."""

from __future__ import annotations

import os
import socket
import urllib.request

import pytest
import torch

import otel_train
from otel_train import contract as c
from otel_train.export import resource
from otel_train.export.run_facts import run_facts
from otel_train.settings import ConfigError, Settings

LAUNCH_VARS = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "SLURM_PROCID",
    "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_JOB_ID", "SLURMD_NODENAME",
    "JOB_COMPLETION_INDEX", "K8S_POD_NAME", "K8S_NAMESPACE_NAME", "K8S_NODE_NAME",
    "K8S_JOB_NAME", "OTEL_TRAIN_RUN_ID", "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)


def attrs_of(
    settings: Settings | None = None,
    consumer: str | None = None,
    version: str | None = None,
    **env: str,
) -> dict[str, object]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        return dict(resource.build_resource(settings or Settings(), consumer, version).attributes)


def test_torchrun_variables() -> None:
    a = attrs_of(RANK="5", LOCAL_RANK="1", WORLD_SIZE="8", GROUP_RANK="2", TORCHELASTIC_RUN_ID="r1")
    assert a[c.RESOURCE_RANK.key] == 5
    assert a[c.RESOURCE_LOCAL_RANK.key] == 1
    assert a[c.RESOURCE_WORLD_SIZE.key] == 8
    assert a[c.RESOURCE_NODE_RANK.key] == 2
    assert a[c.RESOURCE_JOB.key] == "r1"
    assert a["host.name"] == socket.gethostname()


def test_slurm_variables() -> None:
    a = attrs_of(
        SLURM_PROCID="9", SLURM_LOCALID="3", SLURM_NTASKS="16", SLURM_NODEID="1",
        SLURM_JOB_ID="4242", SLURMD_NODENAME="gpu-node-07",
    )  # fmt: skip
    assert (a[c.RESOURCE_RANK.key], a[c.RESOURCE_LOCAL_RANK.key]) == (9, 3)
    assert (a[c.RESOURCE_WORLD_SIZE.key], a[c.RESOURCE_NODE_RANK.key]) == (16, 1)
    assert a[c.RESOURCE_JOB.key] == "4242"
    assert a["host.name"] == "gpu-node-07"


def test_kubernetes_variables() -> None:
    a = attrs_of(
        RANK="3", JOB_COMPLETION_INDEX="1", K8S_POD_NAME="train-1-abc", K8S_NAMESPACE_NAME="ml",
        K8S_NODE_NAME="node-a", K8S_JOB_NAME="train",
    )  # fmt: skip
    assert a[c.RESOURCE_NODE_RANK.key] == 1
    assert a["k8s.pod.name"] == "train-1-abc"
    assert a["k8s.namespace.name"] == "ml"
    assert a["k8s.node.name"] == a["host.name"] == "node-a"
    assert a[c.RESOURCE_JOB.key] == "train"  # the job name is the run id when nothing else is


def test_static_rendezvous_run_id_none_is_no_job_id() -> None:
    a = attrs_of(TORCHELASTIC_RUN_ID="none", SLURM_JOB_ID="77")
    assert a[c.RESOURCE_JOB.key] == "77"
    assert c.RESOURCE_JOB.key not in attrs_of(TORCHELASTIC_RUN_ID="none")


def test_run_id_setting_wins_over_the_launchers() -> None:
    a = attrs_of(OTEL_TRAIN_RUN_ID="exp-7", TORCHELASTIC_RUN_ID="r1", SLURM_JOB_ID="1")
    assert a[c.RESOURCE_JOB.key] == "exp-7"


def test_every_resource_attribute_is_in_the_contract() -> None:
    a = attrs_of(
        Settings(role="generator"),
        "sidecar",
        "9.9",
        RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", GROUP_RANK="0", TORCHELASTIC_RUN_ID="r",
        K8S_POD_NAME="p", K8S_NAMESPACE_NAME="n", K8S_NODE_NAME="x", K8S_JOB_NAME="j",
    )  # fmt: skip
    ours = set(a) - {"telemetry.sdk.language", "telemetry.sdk.name", "telemetry.sdk.version"}
    assert ours == {spec.key for spec in c.RESOURCE_ATTRIBUTES}


def test_own_sdk_resource_carries_the_run_facts_known_at_start() -> None:
    """The record's run facts but the compile state (known later), on the resource of
    otel-train's own SDK: where the telemetry goes and names stay off it."""
    settings = Settings.resolve({"trace_steps": "all", "otlp_endpoint": "http://u:p@h:4318",
                                 "run_dir": "/data/runs", "service_name": "svc"})  # fmt: skip
    a = attrs_of(settings, "thread", "9.9")
    facts = run_facts(settings, "9.9", compiled=True)
    assert (
        {k: a[k] for k in facts if k in a}
        == {
            c.RUN_TORCH_VERSION.key: torch.__version__,
            c.RUN_VERSION.key: "9.9",
            c.RUN_SETTINGS.key: "trace_steps='all'",
        }
        == {k: facts[k] for k in facts if k != c.RUN_TORCH_COMPILE.key}
    )
    assert not any("u:p@h" in str(v) or "/data/runs" in str(v) for v in a.values())
    assert attrs_of(Settings(), "thread", "9.9")[c.RUN_SETTINGS.key] == ""
    # An SDK otel-train did not build (no version given) carries none of them.
    assert not {spec.key for spec in c.START_FACTS} & set(attrs_of(settings))


def test_instance_id_is_unique_per_rank_and_stable_for_a_restarted_rank() -> None:
    ids = [
        attrs_of(RANK=str(r), TORCHELASTIC_RUN_ID="job")["service.instance.id"] for r in range(4)
    ]
    assert len(set(ids)) == 4
    again = attrs_of(RANK="2", TORCHELASTIC_RUN_ID="job")["service.instance.id"]
    assert again == ids[2]
    other_job = attrs_of(RANK="2", TORCHELASTIC_RUN_ID="job2")["service.instance.id"]
    assert other_job != ids[2]


def test_instance_id_without_a_job_is_random_per_process() -> None:
    assert attrs_of(RANK="0")["service.instance.id"] != attrs_of(RANK="0")["service.instance.id"]


def test_a_forked_child_gets_its_own_instance_id() -> None:
    parent = attrs_of(RANK="1", TORCHELASTIC_RUN_ID="job")["service.instance.id"]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            os.environ.update(RANK="1", TORCHELASTIC_RUN_ID="job")
            child = resource.build_resource(Settings()).attributes["service.instance.id"]
            os.write(write, str(child).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        child_id = f.read()
    os.waitpid(pid, 0)
    assert child_id and child_id != parent


@pytest.mark.parametrize(
    ("policy", "local", "expected"),
    [
        ("offset", "0", 9464),
        ("offset", "3", 9467),
        ("first", "0", 9464),
        ("first", "2", None),
        ("all", "2", 9464),
    ],
)
def test_metrics_port_policy(
    monkeypatch: pytest.MonkeyPatch, policy: str, local: str, expected: int | None
) -> None:
    monkeypatch.setenv("LOCAL_RANK", local)
    assert resource.metrics_port(Settings(prometheus_ranks=policy)) == expected


def test_bad_policy_names_the_setting_and_accepted_values() -> None:
    with pytest.raises(ConfigError) as raised:
        Settings.resolve({"prometheus_ranks": "every"})
    msg = str(raised.value)
    assert "prometheus_ranks" in msg and "'offset'" in msg and "'first'" in msg


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_local_ranks_serve_side_by_side_with_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    base = _free_port()
    with socket.socket() as rank0:  # local rank 0 holds the base port
        rank0.bind(("127.0.0.1", base))
        rank0.listen(1)
        monkeypatch.setenv("LOCAL_RANK", "1")
        otel_train.instrument(torch.nn.Linear(2, 2), prometheus_port=base, console="off")
        try:
            address = otel_train.session.current().prometheus_address  # type: ignore[union-attr]
            assert address is not None and address[1] == base + 1
            with urllib.request.urlopen(f"http://127.0.0.1:{base + 1}/metrics", timeout=5) as r:
                assert r.status == 200
        finally:
            otel_train.shutdown()


def test_same_port_policy_clash_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as other_rank:
        other_rank.bind(("127.0.0.1", 0))
        other_rank.listen(1)
        port = other_rank.getsockname()[1]
        monkeypatch.setenv("LOCAL_RANK", "1")
        model = torch.nn.Linear(2, 2)
        with pytest.raises(ConfigError) as raised:
            otel_train.instrument(model, prometheus_port=port, prometheus_ranks="all")
        msg = str(raised.value)
        assert "already in use" in msg and "prometheus_ranks='all'" in msg and "'first'" in msg
        assert otel_train.session.current() is None


def test_first_policy_serves_nothing_on_other_local_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    otel_train.instrument(torch.nn.Linear(2, 2), prometheus_ranks="first", console="off")
    try:
        assert otel_train.session.current().prometheus_address is None  # type: ignore[union-attr]
    finally:
        otel_train.shutdown()
