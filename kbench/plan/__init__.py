"""Serving plans from model shapes, hardware profiles and measured kernel rates (`kbench plan`, docs/plan.md).

* :mod:`kbench.plan.inputs`: workloads, interconnect profiles, SLO and price arguments;
* :mod:`kbench.plan.measured`: attention and decode rates from result files, interpolated in sequence length;
* :mod:`kbench.plan.model`: prefill and decode times, KV capacity, pools, TTFT/TPOT, goodput, cost, energy;
* :mod:`kbench.plan.report`: tables, the sensitivity to assumed efficiencies, the Pareto plot.
"""
from __future__ import annotations
