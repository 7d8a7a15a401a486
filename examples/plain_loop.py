"""A plain PyTorch training loop, instrumented with one call.

Run::

    python examples/plain_loop.py

Prints a phase table every 8 steps and the run summary at the end, serves /metrics
on a free port while it runs, and exports over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT
is set (for example http://127.0.0.1:4318), as the service OTEL_SERVICE_NAME names, else
"plain-loop" (``default_service_name``).
"""

from __future__ import annotations

import torch

import otel_train


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.utils.data.TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)

    session = otel_train.configure(
        prometheus_port=0, console_every=8, default_service_name="plain-loop"
    )
    if session.prometheus_address:
        host, port = session.prometheus_address
        print(f"metrics: http://{host}:{port}/metrics")
    # One call: data / forward / backward / optimizer phases, steps at each optimizer step.
    otel_train.instrument(model, optimizer=opt, dataloader=loader)

    for _epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            otel_train.record(loss=loss)

    otel_train.shutdown()  # prints "otel-train run summary", flushes exports


if __name__ == "__main__":
    main()
