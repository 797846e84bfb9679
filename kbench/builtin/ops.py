"""Default plugin: the core's ops."""
from __future__ import annotations

import kbench
from kbench.ops.attention import AttentionOp
from kbench.ops.decode import DecodeAttentionOp
from kbench.ops.varlen import VarlenAttentionOp


@kbench.hookimpl
def kbench_register_ops(registry):
    registry.add_op(AttentionOp())
    registry.add_op(DecodeAttentionOp())
    registry.add_op(VarlenAttentionOp())
