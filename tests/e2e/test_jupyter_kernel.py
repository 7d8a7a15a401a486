"""The console in a real Jupyter kernel (issue 25 item 1): ``ipykernel`` and
``jupyter_client`` from PyPI (the test extra), a kernel of this interpreter started from
a kernel spec of its own, and one cell that instruments a short loop with the sidecar
printing: the cell's output holds the table and the run summary, each once (the kernel's
``sys.stderr`` is its stream object, not the process's descriptor, which ipykernel
captures too: printed both ways they would show twice).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

CELL = textwrap.dedent("""
    import torch, otel_train
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    otel_train.instrument(model, optimizer=opt, dataloader=loader, console_every=2,
                          prometheus=False, run_dir={run_dir!r})
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    print("sidecar:", otel_train.session.current().feeder is not None)
    print("in time:", otel_train.shutdown())
""")


def _kernel(tmp_path: Path) -> KernelManager:
    """A kernel of this interpreter (not whatever "python3" spec the machine has)."""
    spec = tmp_path / "kernels" / "otel-train-test"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "t",
                                                  "language": "python"}))  # fmt: skip
    specs = KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])
    return KernelManager(kernel_name="otel-train-test", kernel_spec_manager=specs)


def _run_cell(km: KernelManager, code: str) -> tuple[dict[str, Any], str]:
    """(the execute reply's content, the cell's stream output)."""
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        msg_id = kc.execute(code)
        text = []
        while True:
            msg = kc.get_iopub_msg(timeout=180)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                text.append(content["text"])
            elif kind == "error":
                text.append("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                break
        reply = kc.get_shell_msg(timeout=60)
        return reply["content"], "".join(text)
    finally:
        kc.stop_channels()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # (jupyter_client's, zmq's)
def test_a_cell_shows_the_table_and_the_summary_once(tmp_path: Path) -> None:
    km = _kernel(tmp_path)
    km.start_kernel(cwd=str(tmp_path))
    try:
        reply, text = _run_cell(km, CELL.format(run_dir=str(tmp_path / "runs")))
    finally:
        km.shutdown_kernel(now=True)
    assert reply["status"] == "ok", text
    assert "sidecar: True" in text and "in time: True" in text, text
    assert text.count("otel-train  steps 0-1") == 1, text
    assert text.count("otel-train  steps 2-3") == 1, text
    assert text.count("otel-train run summary: 4 steps, wall clock ") == 1, text
    summary = text[text.index("run summary") :]
    assert "% wall" in summary and "\nforward " in summary and "\nbackward " in summary
