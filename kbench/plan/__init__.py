"""Serving plans from model shapes, hardware profiles and measured kernel rates (`kbench plan`, docs/plan.md).

* :mod:`kbench.plan.inputs`: workloads (mix, arrivals, prefix caching, turns), traces, interconnects, SLO, prices;
* :mod:`kbench.plan.measured`: attention and decode rates from result files (decode by batch x KV heads), power;
* :mod:`kbench.plan.model`: the step model (prefill, decode, mixed iterations, all-reduces, pipeline stages),
  KV capacity and the mean-value screen of aggregated and disaggregated pools;
* :mod:`kbench.plan.simulate`: the iteration-level simulation of one plan (tail latencies, SLO attainment);
* :mod:`kbench.plan.search`: from the screen to simulated plans (one instance's capacity, pools, verification);
* :mod:`kbench.plan.report`: tables, the sensitivity to assumed efficiencies, the Pareto and latency plots;
* :mod:`kbench.plan.validation`: the grid against NVIDIA's aiconfigurator (recorded answers, optional live run).
"""
from __future__ import annotations
