"""A library's refusal of a case is a skip with the library's words (kbench.unsupported.Unsupported).

cuDNN cannot run here (no GPU); its graph is replaced by a stand-in that raises what the frontend raises
at each step, so that the mapping (refusal -> Unsupported, out-of-memory and our own bugs -> errors) is
tested. On a GPU, tests/test_torch_backends.py runs the real graphs.
"""
from __future__ import annotations

import pickle
import types

import pytest

from kbench.api import Unsupported
from kbench_torch.cudnn_backend import plan


class GraphNotSupported(Exception):
    """Stands for the frontend's ``cudnn.cudnnGraphNotSupportedError`` (a pybind exception class)."""


CUDNN = types.SimpleNamespace(cudnnGraphNotSupportedError=GraphNotSupported,
                              heur_mode=types.SimpleNamespace(A="A", FALLBACK="FALLBACK"))


class StandInGraph:
    """Records the steps the frontend's pygraph is taken through; raises ``failure`` at step ``fail_at``."""

    def __init__(self, fail_at: str | None = None, failure: BaseException | None = None) -> None:
        self.fail_at, self.failure, self.steps = fail_at, failure, []

    def _step(self, name: str, *args) -> None:
        self.steps.append((name, *args))
        if name == self.fail_at:
            raise self.failure

    def validate(self):
        self._step("validate")

    def build_operation_graph(self):
        self._step("build_operation_graph")

    def create_execution_plans(self, modes):
        self._step("create_execution_plans", tuple(modes))

    def check_support(self):
        self._step("check_support")

    def build_plans(self):
        self._step("build_plans")


def test_a_supported_graph_goes_through_every_step_in_order():
    graph = StandInGraph()
    plan(graph, CUDNN)
    assert graph.steps == [("validate",), ("build_operation_graph",), ("create_execution_plans", ("A", "FALLBACK")),
                           ("check_support",), ("build_plans",)]


@pytest.mark.parametrize("step", ["check_support", "build_plans"])
def test_check_support_and_build_plans_failures_are_refusals(step):
    message = "[cudnn_frontend] Error: No valid engine configs for SDPA_FWD: head_dim 136 unsupported"
    with pytest.raises(Unsupported) as info:
        plan(StandInGraph(step, RuntimeError(message)), CUDNN)
    assert str(info.value) == f"cuDNN does not support this case: RuntimeError: {message}"


def test_graph_not_supported_at_validation_is_a_refusal_other_validation_errors_are_not():
    with pytest.raises(Unsupported, match="GraphNotSupported: sdpa: s_q > s_kv with bottom-right causal"):
        plan(StandInGraph("validate", GraphNotSupported("sdpa: s_q > s_kv with bottom-right causal")), CUDNN)
    with pytest.raises(TypeError, match="bad stride"):  # our own mistake building the graph: an error record
        plan(StandInGraph("validate", TypeError("bad stride")), CUDNN)


def test_out_of_memory_while_building_plans_stays_an_error():
    with pytest.raises(RuntimeError, match="CUDNN_STATUS_ALLOC_FAILED"):
        plan(StandInGraph("build_plans", RuntimeError("CUDNN_STATUS_ALLOC_FAILED: out of memory")), CUDNN)


def test_a_frontend_without_the_refusal_class_still_maps_plan_failures():
    old = types.SimpleNamespace(heur_mode=CUDNN.heur_mode)
    with pytest.raises(Unsupported):
        plan(StandInGraph("check_support", RuntimeError("not supported")), old)


def test_unsupported_crosses_a_process_boundary_with_its_message():
    exc = Unsupported("FlashAttention 3", "RuntimeError: FlashAttention only supports head dimension at most 256\n")
    again = pickle.loads(pickle.dumps(exc))
    assert type(again) is Unsupported and again.library == "FlashAttention 3"
    assert str(again) == str(exc) == ("FlashAttention 3 does not support this case: RuntimeError: FlashAttention "
                                      "only supports head dimension at most 256")
