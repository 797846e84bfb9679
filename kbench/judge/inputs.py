"""Input keys from the run's secret: what the worker is sent (keys, never the secret) and what the judge
regenerates to verify an output (kbench.ops.inputs)."""
from __future__ import annotations

import hashlib
import hmac
from typing import Mapping

import numpy as np

from kbench.ops.inputs import RegeneratedInputs


class InputSource:
    """The input keys of one case: HMAC-SHA256 of the run's secret, the case id, a purpose and a counter.

    A key reveals nothing about the secret or about any other key, so a worker that sees the keys of its
    calls cannot compute the inputs of calls it has not been sent yet. ``nonce``: a job's own (an untrusted
    kernel's: kbench.judge.judge), so the same (case, purpose, counter) judged again in the run (rounds) gets other
    inputs and a kernel keeping outputs by input content never sees an input twice. Without one, every backend of
    a case, and every round, gets the same keys (trusted libraries: the inputs drawn once, kbench.ops.inputs).
    """

    def __init__(self, secret: bytes, op, case, nonce: bytes = b"") -> None:
        self.secret, self.op, self.case, self.nonce = secret, op, case, nonce
        self.specs = op.input_specs(case)

    def key(self, purpose: str, index: int) -> tuple[int, int]:
        msg = f"{self.case.id}\x00{purpose}\x00{index}".encode() + (b"\x00" + self.nonce if self.nonce else b"")
        digest = hmac.new(self.secret, msg, hashlib.sha256).digest()
        return int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:16], "little")

    def inputs(self, key: tuple[int, int]) -> Mapping[str, np.ndarray]:
        """The inputs a call with ``key`` received, regenerated here (lazily, input by input)."""
        if self.specs is None:
            return self.op.make_inputs(self.case, key)
        return RegeneratedInputs(self.specs, key)

    def slot_bytes(self) -> int:
        """Device bytes of one call's inputs and twice its outputs (the buffers and their shadows)."""
        if self.specs is not None:
            inputs = sum(spec.nbytes for spec in self.specs.values())
        else:
            inputs = sum(a.nbytes for a in self.op.make_inputs(self.case, 0).values())
        item = self.op.output_dtype(self.case).itemsize
        outputs = sum(int(np.prod(s, dtype=np.int64)) * item for s in self.op.output_shapes(self.case).values())
        return int(inputs + 2 * outputs)
