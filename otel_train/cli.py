"""``otel-train`` command line: the demo run and small utilities.

Usage::

    otel-train demo                       # 300 steps of a tiny language model, tables on stderr
    otel-train demo --otlp-endpoint http://127.0.0.1:4318 --steps 1000
    otel-train telemetry                  # print the telemetry reference (docs/telemetry.md)
    otel-train replay RUN_DIR             # send a run record to a Collector (OTLP/HTTP)
    otel-train report RUN_DIR [-o FILE]   # one offline HTML page from a run record
    otel-train report --serve RUN_DIR     # the same page on 127.0.0.1, refreshed
    otel-train report --prometheus URL --jaeger URL --job JOB  # a job in a live stack
    otel-train timeline RUN_DIR -o F.json # traced steps for Perfetto / chrome://tracing
    otel-train compare A B [--fail-if-slower PCT]  # run B against run A (docs/compare.md)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from .runs import compare_cli
from .settings import ConfigError


def _demo_model(vocab: int, dim: int, seq: int) -> Any:
    import torch

    class TinyLM(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(vocab, dim)
            self.pos = torch.nn.Parameter(torch.zeros(seq, dim))
            layer = torch.nn.TransformerEncoderLayer(
                dim, nhead=4, dim_feedforward=4 * dim, batch_first=True, dropout=0.0
            )
            self.blocks = torch.nn.TransformerEncoder(
                layer, num_layers=2, enable_nested_tensor=False
            )
            self.head = torch.nn.Linear(dim, vocab)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq))

        def forward(self, input_ids: Any) -> Any:
            h = self.embed(input_ids) + self.pos[: input_ids.shape[1]]
            n = input_ids.shape[1]
            mask: Any = self.mask
            h = self.blocks(h, mask=mask[:n, :n], is_causal=True)
            return self.head(h)

    return TinyLM()


class _Corpus:
    """A synthetic token stream with structure a model can learn (repeating n-grams)."""

    def __init__(self, vocab: int, seq: int, n: int) -> None:
        import torch

        g = torch.Generator().manual_seed(0)
        base = torch.randint(0, vocab, (64,), generator=g)
        stream = base.repeat(n * (seq + 1) // 64 + 2)
        noise = torch.rand(stream.shape, generator=g) < 0.1
        stream[noise] = torch.randint(0, vocab, (int(noise.sum()),), generator=g)
        self.data = stream[: n * (seq + 1)].view(n, seq + 1)

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self.data[i]
        return {"input_ids": row[:-1], "labels": row[1:]}


def _demo_settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if args.every is not None:  # (else OTEL_TRAIN_CONSOLE_EVERY or the default)
        settings["console_every"] = args.every
    if args.otlp_endpoint:
        settings["otlp_endpoint"] = args.otlp_endpoint
    if args.prometheus_port is not None:
        settings["prometheus_port"] = args.prometheus_port
    if args.trace_all:
        settings["trace_steps"] = "all"
    if not {"OTEL_METRIC_EXPORT_INTERVAL", "OTEL_TRAIN_METRIC_EXPORT_INTERVAL"} & set(os.environ):
        # A short run: a snapshot a second gives its run record's report a curve to show.
        settings["metric_export_interval"] = 1.0
    return settings


def demo(args: argparse.Namespace) -> int:
    import torch

    import otel_train

    device = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    vocab, dim, seq, batch = 256, 64, 64, 16
    model = _demo_model(vocab, dim, seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    corpus: Any = _Corpus(vocab, seq, batch * 64)
    loader: Any = torch.utils.data.DataLoader(
        corpus, batch_size=batch, shuffle=True, drop_last=True
    )
    try:
        otel_train.instrument(model, optimizer=opt, dataloader=loader, **_demo_settings(args))
    except ConfigError as err:
        print(f"otel-train demo: {err}", file=sys.stderr)
        return 2
    sess = otel_train.session.current()
    where = []
    if sess is not None and sess.prometheus_address:
        host, port = sess.prometheus_address
        where.append(f"/metrics on http://{host}:{port}/metrics")
    if sess is not None and sess.exports_otlp:
        where.append("OTLP export on")
    print(
        f"otel-train demo: {args.steps} steps on {device}; " + ("; ".join(where) or "no exporters"),
        file=sys.stderr,
    )
    done = 0
    loss_fn = torch.nn.functional.cross_entropy
    while done < args.steps:
        for batch_ in loader:
            ids = batch_["input_ids"].to(device, non_blocking=True)
            labels = batch_["labels"].to(device, non_blocking=True)
            logits = model(ids)
            loss = loss_fn(logits.reshape(-1, vocab), labels.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
            otel_train.record(loss=loss.detach())
            done += 1
            if done >= args.steps:
                break
    if args.hold > 0:
        what = "/metrics" if sess is not None and sess.prometheus_address else "the process"
        print(f"otel-train demo: holding {what} for {args.hold:g} s", file=sys.stderr)
        time.sleep(args.hold)
    otel_train.shutdown()
    if sess is not None and sess.record is not None:
        cli = Path(sys.executable).with_name("otel-train")
        command = f"{cli if cli.exists() else 'otel-train'} report {sess.record.directory}"
        print(f"otel-train demo: run record in {sess.record.directory}\n"
              f"otel-train demo: its report page: {command}", file=sys.stderr)  # fmt: skip
    return 0


def _replay(args: argparse.Namespace) -> int:
    from .runs.replay import endpoint_from_env, replay

    endpoint = args.endpoint or endpoint_from_env()
    try:
        done = replay(args.run_dir, endpoint)
    except (OSError, RuntimeError) as err:
        print(f"otel-train replay: {err}", file=sys.stderr)
        return 1
    print(f"otel-train replay: {done.requests} requests from {done.files} files sent to {endpoint}")
    return 0


def _timeline(args: argparse.Namespace) -> int:
    from .runs import timeline

    try:
        print(f"otel-train timeline: wrote {timeline.write(args.run_dir, args.output)}")
    except (OSError, ValueError) as err:
        print(f"otel-train timeline: {err}", file=sys.stderr)
        return 1
    return 0


_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``6h``, ``2d`` in seconds (argparse's type for --last)."""
    unit = text[-1:] if text[-1:] in _SECONDS else "s"
    number = text[:-1] if text[-1:] in _SECONDS else text
    try:
        seconds = float(number) * _SECONDS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give seconds or 30m, 6h, 2d") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return seconds


def _report(p: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from .runs import report

    if (args.run_dir is None) == (args.prometheus is None):
        p.error("give a run directory, or --prometheus URL --job JOB (a live stack)")
    if args.prometheus is None and (args.jaeger or args.job):
        p.error("--jaeger and --job go with --prometheus")
    if args.prometheus is not None and not args.job:
        p.error("--prometheus needs --job (the job label: the service name)")
    if args.against is not None and (args.run_dir is None or args.serve):
        p.error("--against goes with a run directory, written (not --serve)")

    def live(refresh_s: int | None = None) -> str:
        return report.render_live(args.prometheus, args.jaeger, args.job, args.last, refresh_s)

    try:
        if not args.serve and args.run_dir is not None:
            done = report.write(args.run_dir, args.output, against=args.against)
            print(f"otel-train report: wrote {done}")
            return 0
        if not args.serve:
            out = Path(args.output or f"report-{args.job.replace('/', '_')}.html")
            out.write_text(live(), encoding="utf-8")
            print(f"otel-train report: wrote {out}")
            return 0
        server, thread = report.serve(args.run_dir, args.port, None if args.run_dir else live)
    except (OSError, ValueError) as err:
        print(f"otel-train report: {err}", file=sys.stderr)
        return 1
    host, port = str(server.server_address[0]), server.server_address[1]
    print(f"otel-train report: serving http://{host}:{port}/ (Ctrl-C stops)", flush=True)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="otel-train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser(
        "demo", help="train a tiny model with otel-train on (CPU, or GPU if present)"
    )
    d.add_argument("--steps", type=int, default=300)
    d.add_argument("--every", type=int, default=None,
                   help="console table every N steps (default: console_every)")  # fmt: skip
    d.add_argument("--otlp-endpoint", default=None, help="e.g. http://127.0.0.1:4318")
    d.add_argument("--prometheus-port", type=int, default=None, help="default 9464; 0 = any")
    d.add_argument("--trace-all", action="store_true", help="trace every step")
    d.add_argument("--hold", type=float, default=0.0, help="keep /metrics up N s after training")
    d.add_argument("--cpu", action="store_true", help="stay on the CPU even with CUDA")
    sub.add_parser("telemetry", help="print the telemetry reference (Markdown)")
    compare_cli.add_parser(sub, _duration)
    r = sub.add_parser("replay", help="send a run record (otel-train-runs/...) to a Collector")
    r.add_argument("run_dir", help="a run directory otel-train wrote")
    r.add_argument("--endpoint", default=None,
                   help="OTLP/HTTP base URL (default: OTEL_EXPORTER_OTLP_ENDPOINT, else "
                   "http://127.0.0.1:4318)")  # fmt: skip
    p = sub.add_parser("report", help="write (or serve) the HTML report of a run record, "
                       "or of a job in a live stack")  # fmt: skip
    p.add_argument("run_dir", nargs="?", help="a run directory otel-train wrote")
    p.add_argument("-o", "--output", default=None,
                   help="default RUN_DIR/report.html (live: report-<job>.html)")  # fmt: skip
    p.add_argument("--serve", action="store_true", help="serve it on 127.0.0.1 instead")
    p.add_argument("--against", metavar="RUN_DIR", help="add a section comparing it with this run")
    p.add_argument("--port", type=int, default=8150, help="with --serve (0: any free port)")
    p.add_argument("--prometheus", metavar="URL", help="read JOB from this Prometheus instead")
    p.add_argument("--jaeger", metavar="URL", help="with --prometheus: traces from this Jaeger")
    p.add_argument("--job", help="with --prometheus: the job label (namespace/service)")
    p.add_argument("--last", type=_duration, default=3600.0,
                   help="with --prometheus: how far back (30m, 6h, 2d; default 1h)")  # fmt: skip
    t = sub.add_parser("timeline", help="the traced steps as a Chrome trace (Perfetto)")
    t.add_argument("run_dir", help="a run directory otel-train wrote")
    t.add_argument("-o", "--output", default=None, help="default RUN_DIR/steps.json")
    args = parser.parse_args(argv)
    if args.command == "compare":
        return compare_cli.main(args)
    if args.command == "timeline":
        return _timeline(args)
    if args.command == "demo":
        return demo(args)
    if args.command == "replay":
        return _replay(args)
    if args.command == "report":
        return _report(p, args)
    from .contract import render_markdown

    sys.stdout.write(render_markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
