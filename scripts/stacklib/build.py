"""scripts/stack, build.

Building the pinned binaries from the Go module proxy into the cache (`build`, `built`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .config import (
    BINARIES,
    OCB_MANIFEST,
    THANOS_TAGS,
    bin_dir,
    die,
    expected_stamps,
    log,
    missing_binaries,
    read_versions,
    write_stamp,
)

# ---------------------------------------------------------------------------
# build


def _go_env(gobin: Path) -> dict[str, str]:
    env = dict(os.environ)
    flags = env.get("GOFLAGS", "").split()
    for flag in ("-trimpath", "-buildvcs=false"):
        if flag not in flags:
            flags.append(flag)
    env["GOFLAGS"] = " ".join(flags)
    env["GOBIN"] = str(gobin)
    env.setdefault("CGO_ENABLED", "0")
    return env


def _run_step(
    what: str, cmd: list[str], *, env: dict[str, str], log_path: Path, cwd: Path | None = None
) -> None:
    """Run a (long) build command, printing a heartbeat; on failure show its output tail."""
    log(f"{what}: {' '.join(cmd)}")
    t0 = time.monotonic()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        next_beat = 30.0
        while proc.poll() is None:
            time.sleep(0.5)
            elapsed = time.monotonic() - t0
            if elapsed >= next_beat:
                log(f"  ... {what} still running ({elapsed:.0f}s)")
                next_beat += 30.0
    elapsed = time.monotonic() - t0
    if proc.returncode != 0:
        tail = log_path.read_text(errors="replace")[-4000:]
        print(tail, file=sys.stderr)
        die(f"{what} failed (exit {proc.returncode}) after {elapsed:.0f}s; full log: {log_path}")
    log(f"  {what} done in {elapsed:.0f}s")


def _check_runs(path: Path, args: list[str]) -> str:
    res = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60)
    text = (res.stdout + res.stderr).strip()
    if res.returncode != 0:
        die(f"{path} {' '.join(args)} failed (exit {res.returncode}): {text[-2000:]}")
    return text.splitlines()[0] if text else ""


VERSION_ARGS = {
    "otelcol": ["--version"],
    "jaeger": ["version"],
    "prometheus": ["--version"],
    "promtool": ["--version"],
    "thanos": ["--version"],
    "victoria-logs": ["-version"],
}


def _install(name: str, src: Path, stamp: str) -> None:
    dest = bin_dir() / name
    tmp = dest.with_name(f".{name}.new")
    shutil.copy2(src, tmp)
    tmp.chmod(0o755)
    tmp.replace(dest)
    first_line = _check_runs(dest, VERSION_ARGS[name])
    write_stamp(name, stamp)
    log(f"  installed {dest}: {first_line}")


def build_prometheus(v: dict[str, str], work: Path, stamps: dict[str, str]) -> None:
    gobin = work / "gobin"
    gobin.mkdir(exist_ok=True)
    mod = f"v{v['PROMETHEUS_GO_MODULE_VERSION']}"
    pkg = "github.com/prometheus/common/version"
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H:%M:%S")
    ldflags = (
        f"-s -w -X {pkg}.Version={v['PROMETHEUS_VERSION']} -X {pkg}.Revision=go-module-{mod}"
        f" -X {pkg}.Branch=HEAD -X {pkg}.BuildUser=otel-train-stack -X {pkg}.BuildDate={date}"
    )
    for name in ("prometheus", "promtool"):
        _run_step(
            f"build {name} {v['PROMETHEUS_VERSION']}",
            [
                "go",
                "install",
                f"-ldflags={ldflags}",
                f"github.com/prometheus/prometheus/cmd/{name}@{mod}",
            ],
            env=_go_env(gobin),
            log_path=work / f"{name}.log",
        )
        _install(name, gobin / name, stamps[name])


def _replace_directives(gomod_text: str) -> list[str]:
    """The `replace` directives of a go.mod, one `old => new` string each."""
    out: list[str] = []
    in_block = False
    for raw in gomod_text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if in_block:
            if line == ")":
                in_block = False
            elif line:
                out.append(line)
        elif line.startswith("replace ("):
            in_block = True
        elif line.startswith("replace "):
            out.append(line[len("replace ") :].strip())
    return out


def _build_with_replaces(
    name: str, module: str, mod: str, ldflags: str, work: Path, env: dict[str, str], tags: str = ""
) -> Path:
    """Build ``module``/cmd/``name`` at ``mod`` and return the binary's path.

    `go install pkg@version` refuses modules whose go.mod has replace directives
    (Jaeger's has one, Thanos's several). Build it from a throwaway module that requires
    it (as a tool) with the same replace directives instead.
    """
    res = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{mod}"],
        env=env,
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        die(f"go mod download {module}@{mod} failed: {res.stdout}{res.stderr}")
    info = json.loads(res.stdout)
    upstream_gomod = Path(info["GoMod"]).read_text()
    go_line = re.search(r"^go\s+(\S+)", upstream_gomod, re.M)
    moddir = work / f"{name}-module"
    moddir.mkdir(exist_ok=True)
    lines = [
        f"module otel-train.local/{name}-build",
        "",
        f"go {go_line.group(1) if go_line else '1.24'}",
        "",
    ]
    lines += [f"replace {r}" for r in _replace_directives(upstream_gomod)]
    (moddir / "go.mod").write_text("\n".join(lines) + "\n")
    _run_step(
        f"resolve {name} {mod} modules",
        ["go", "get", "-tool", f"{module}/cmd/{name}@{mod}"],
        env=env,
        cwd=moddir,
        log_path=work / f"{name}-get.log",
    )
    out = work / name
    _run_step(
        f"build {name} {mod}",
        [
            "go",
            "build",
            f"-tags={tags}",
            f"-ldflags={ldflags}",
            "-o",
            str(out),
            f"{module}/cmd/{name}",
        ],
        env=env,
        cwd=moddir,
        log_path=work / f"{name}.log",
    )
    return out


def build_jaeger(v: dict[str, str], work: Path, stamps: dict[str, str]) -> None:
    mod = f"v{v['JAEGER_GO_MODULE_VERSION']}"
    module = "github.com/jaegertracing/jaeger"
    pkg = f"{module}/internal/version"
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    ldflags = (
        f"-s -w -X {pkg}.latestVersion=v{v['JAEGER_VERSION']} -X {pkg}.commitSHA=go-module-{mod}"
        f" -X {pkg}.date={date}"
    )
    out = _build_with_replaces("jaeger", module, mod, ldflags, work, _go_env(work / "gobin"))
    _install("jaeger", out, stamps["jaeger"])


def build_thanos(v: dict[str, str], work: Path, stamps: dict[str, str]) -> None:
    mod = f"v{v['THANOS_VERSION']}"
    pkg = "github.com/prometheus/common/version"
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H:%M:%S")
    ldflags = (
        f"-s -w -X {pkg}.Version={v['THANOS_VERSION']} -X {pkg}.Revision=go-module-{mod}"
        f" -X {pkg}.Branch=HEAD -X {pkg}.BuildUser=otel-train-stack -X {pkg}.BuildDate={date}"
    )
    module = "github.com/thanos-io/thanos"
    # The tags of Thanos's own release build (.promu.yml). slicelabels is required: Thanos
    # casts Prometheus label sets to its protobuf labels in place, which is only valid for
    # the slice layout (without it `receive` panics serving its first Info call).
    env = _go_env(work / "gobin")
    out = _build_with_replaces("thanos", module, mod, ldflags, work, env, THANOS_TAGS)
    _install("thanos", out, stamps["thanos"])


def build_victorialogs(v: dict[str, str], work: Path, stamps: dict[str, str]) -> None:
    """VictoriaLogs's single binary (storage, OTLP ingest and LogsQL in one process), built
    as its release Makefile's `victoria-logs-pure` target does: CGO off (pure-Go zstd)."""
    gobin = work / "gobin"
    gobin.mkdir(exist_ok=True)
    mod = f"v{v['VICTORIALOGS_VERSION']}"
    pkg = "github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo"
    ldflags = f"-s -w -X {pkg}.Version=victoria-logs-{mod}"
    _run_step(
        f"build victoria-logs {mod}",
        [
            "go",
            "install",
            f"-ldflags={ldflags}",
            f"github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs@{mod}",
        ],
        env=_go_env(gobin),
        log_path=work / "victoria-logs.log",
    )
    _install("victoria-logs", gobin / "victoria-logs", stamps["victoria-logs"])


def build_otelcol(v: dict[str, str], work: Path, stamps: dict[str, str]) -> None:
    gobin = work / "gobin"
    gobin.mkdir(exist_ok=True)
    ocb = f"v{v['OCB_VERSION']}"
    _run_step(
        f"build the collector builder (ocb) {ocb}",
        ["go", "install", f"go.opentelemetry.io/collector/cmd/builder@{ocb}"],
        env=_go_env(gobin),
        log_path=work / "ocb.log",
    )
    out_dir = work / "otelcol-dist"
    text = OCB_MANIFEST.read_text()
    rendered, n = re.subn(r"(?m)^(\s+output_path:).*$", lambda m: f"{m.group(1)} {out_dir}", text)
    if n != 1:
        die(f"{OCB_MANIFEST}: expected one dist.output_path line, found {n}")
    manifest = work / "otelcol-builder.yaml"
    manifest.write_text(rendered)
    _run_step(
        f"build otelcol {v['OTELCOL_VERSION']} with ocb",
        [str(gobin / "builder"), f"--config={manifest}"],
        # ocb makes an (unused) default output dir under $TMPDIR: keep it inside `work`
        env={**_go_env(gobin), "TMPDIR": str(work)},
        log_path=work / "otelcol.log",
    )
    _install("otelcol", out_dir / "otelcol", stamps["otelcol"])


BUILDERS = {
    "prometheus": build_prometheus,
    "promtool": build_prometheus,
    "jaeger": build_jaeger,
    "otelcol": build_otelcol,
    "thanos": build_thanos,
    "victoria-logs": build_victorialogs,
}


def cmd_build(args: argparse.Namespace) -> int:
    if shutil.which("go") is None:
        die("`go` is not on PATH; the stack binaries are built from the Go module proxy")
    v = read_versions()
    stamps = expected_stamps(v)
    bin_dir().mkdir(parents=True, exist_ok=True)
    wanted = args.components or ["otelcol", "jaeger", "prometheus", "thanos", "victoria-logs"]
    for name in wanted:
        if name not in BUILDERS:
            die(f"unknown component {name!r} (choose from {', '.join(BUILDERS)})")
    todo = missing_binaries()
    t_all = time.monotonic()
    done: set = set()
    for name in wanted:
        builder = BUILDERS[name]
        if builder in done:
            continue
        group = [n for n, b in BUILDERS.items() if b is builder]
        if not args.force and not any(n in todo for n in group):
            for n in group:
                log(f"{n}: up to date ({stamps[n]})")
            continue
        work = Path(tempfile.mkdtemp(prefix=f"otel-train-build-{name}-"))
        try:
            builder(v, work, stamps)
        finally:
            if not args.keep_work:
                shutil.rmtree(work, ignore_errors=True)
            else:
                log(f"  build dir kept: {work}")
        done.add(builder)
    log(f"build finished in {time.monotonic() - t_all:.0f}s; binaries in {bin_dir()}")
    return 0


def cmd_built(args: argparse.Namespace) -> int:
    missing = missing_binaries()
    for name in BINARIES:
        print(f"{name}: {'MISSING - ' + missing[name] if name in missing else 'ok'}")
    return 1 if missing else 0
