"""Security defaults against the real Collector: OTLP over TLS with headers from the
standard ``OTEL_EXPORTER_OTLP_*`` variables; ``/metrics`` on loopback unless opted in;
no secret from headers or the environment in spans, metrics, logs or ``/metrics``.

Certificates are made at test time (a throwaway CA and a server certificate for
127.0.0.1) with ``cryptography``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import certifi
from collector_helpers import job_env, metric_points, step_indices, wait_for
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HEADER_SECRET = "s3cr3t-header-9f2c41"
ENV_SECRET = "s3cr3t-env-7d1e08"


def make_certs(where: Path) -> tuple[Path, Path, Path]:
    """(ca.pem, server.pem, server.key): a CA and a server certificate for 127.0.0.1."""
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "otel-train test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = where / "ca.pem", where / "server.pem", where / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


JOB = textwrap.dedent("""
    import json, logging, time, urllib.request
    import torch, otel_train

    logging.basicConfig(level=logging.DEBUG)   # every log line any library writes
    model = torch.nn.Linear(8, 2)
    x = torch.randn(4, 8)
    session = otel_train.configure(prometheus=True, prometheus_port=0)
    for _ in range(20):
        with otel_train.step(samples=4):
            with otel_train.phase("forward"):
                model(x).sum().backward()
        otel_train.record(loss=1.0)
        time.sleep(0.02)
    time.sleep(1.0)
    host, port = session.prometheus_address
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert otel_train.shutdown(), "shutdown missed its deadline"
    print(json.dumps({"host": host, "metrics": body}))
""")


def test_otlp_over_tls_with_headers_and_no_secret_leaks(collector: Any, tmp_path: Path) -> None:
    ca, cert, key = make_certs(tmp_path)
    collector.tls = (cert, key)
    collector.start()
    assert collector.endpoint.startswith("https://")
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = job_env(
        collector.endpoint,
        OTEL_EXPORTER_OTLP_CERTIFICATE=str(ca),
        OTEL_EXPORTER_OTLP_HEADERS=f"authorization=Bearer%20{HEADER_SECRET},x-team=ml",
        TRAINING_API_KEY=ENV_SECRET,
        # Set on many machines for other tools; requests lets it override the OTLP CA.
        REQUESTS_CA_BUNDLE=certifi.where(),
        OTEL_TRAIN_CONSOLE="stderr",  # the run summary too
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    wait_for(lambda: len(step_indices(collector.output())) >= 20, "20 step spans over TLS")
    wait_for(lambda: metric_points(collector.output(), "otel_train.steps"), "metrics over TLS")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["host"] == "127.0.0.1"  # /metrics on loopback by default
    assert "otel_train_steps" in result["metrics"]
    seen = {
        "collector (every span, attribute, resource and data point)": collector.output(),
        "the job's logs at DEBUG": done.stderr,
        "/metrics": result["metrics"],
    }
    for where, text in seen.items():
        for secret in (HEADER_SECRET, ENV_SECRET):
            assert secret not in text, f"{secret} leaked into {where}"
    assert "Bearer" not in collector.output()
