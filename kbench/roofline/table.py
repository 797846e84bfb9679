"""The table of ``kbench roofline``: one row of formatted figures per (model, context, hardware)."""
from __future__ import annotations

from typing import Iterable

from kbench.roofline.analysis import RooflineRow

TABLE_HEADERS = ("model", "context", "hardware", "weights GB", "KV/token KB", "KV/req GB", "1 req GB",
                 "prefill FLOP/B", "decode FLOP/B", "ridge", "devices/req", "reqs/device", "reqs/group",
                 "wall", "decode tok/s")


def _g(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def table_rows(rows: Iterable[RooflineRow]) -> list[list[str]]:
    out = []
    for r in rows:
        group = "" if r.requests_on_group is None else f"{r.requests_on_group} on {r.devices_per_request}"
        out.append([r.model, f"{r.context:,}", r.hardware, f"{r.weight_bytes / 1e9:.1f}",
                    f"{r.kv_bytes_per_token / 1e3:.2f}", f"{r.kv_bytes_per_request / 1e9:.2f}",
                    f"{r.one_request_bytes / 1e9:.1f}", _g(r.prefill_intensity), _g(r.decode_intensity, 3),
                    _g(r.ridge, 3), "" if r.devices_per_request is None else str(r.devices_per_request),
                    "" if r.requests_per_device is None else str(r.requests_per_device), group, r.wall,
                    _g(r.decode_tokens_per_s, 3)])
    return out
