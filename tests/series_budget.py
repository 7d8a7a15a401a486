"""How many series one rank may send to Prometheus: the budgets that the stack tests count
against and that the docs quote (docs/scale.md, "Derived figures, and the series
budget"; tests/unit/test_docs_facts.py keeps the docs' figures equal to these).

Issue 16 brought a GPU-shaped rank (4 phases, one user scalar) to 30 series; the hang
watch's three gauges (issue 23) make 33, and the torch.compile gauge (issue 39: a live
job's run facts) 34. A DDP rank adds its collectives' histogram, one series per op and
process group: 37. The deprecated aliases of renamed metrics are sent
beside them for one release and are not counted.
"""

from __future__ import annotations

SERIES_PER_RANK = 34
SERIES_PER_DDP_RANK = 37
# What a GPU rank adds that a CPU test run cannot send: each of 4 phases' allocated and
# reserved peaks, and the device's memory limit.
CUDA_ONLY_SERIES = 2 * 4 + 1
