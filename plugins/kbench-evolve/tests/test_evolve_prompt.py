"""What the model is told: the brief names the device, roofs, substrate, tolerances, budgets, tool costs and
the champion; memory is capped; Anthropic requests carry cache_control breakpoints, others are untouched."""
from __future__ import annotations

from kbench_evolve.engine import Budget, Spent, VariationContext
from kbench_evolve.fitness import Evaluator
from kbench_evolve.knowledge import KnowledgeBase
from kbench_evolve.llm import uses_cache_control, with_cache_control
from kbench_evolve.prompt import SYSTEM, brief, fence, memory_text


def test_the_brief_states_what_the_model_would_otherwise_guess(pm, lineage):
    lineage.write_memory("- first idea: bigger tiles\n")
    ev = Evaluator(pm, lineage.current_suite(), lineage.scratch("runs"), device="cpu", rounds=3)
    ctx = VariationContext(pm, lineage, ev, Budget(iterations=4, max_steps=30, max_bench_calls=50),
                           Spent(iterations=1, steps=5, bench_calls=8), {}, "agent", knowledge=KnowledgeBase())
    text = brief(ctx)
    champ = lineage.champion()
    assert "device cpu" in text and "compute roofs" in text and "memory bandwidth" in text
    assert "Substrate: numpy (the kernel receives NumPy arrays" in text
    assert "fp32 1e-5, fp16 1e-3, bf16 1e-2" in text
    assert "25 steps left in this variation" in text and "3 variations left" in text and "42 kbench runs left" in text
    assert "submit = 3 kbench runs" in text and "benchmark = 1 kbench run" in text
    assert fence(champ.source, f"the champion {champ.label}'s source") in text  # inside the fence, whole
    assert all(case in text for case in champ.scores)
    assert "SUBSTRATE = \"numpy\"" in text  # the kernel-file contract from the knowledge base
    assert "- first idea: bigger tiles" in text
    assert "GIVE UP:" in SYSTEM and "<<<<<<< SEARCH" in SYSTEM and ">>>>>>> REPLACE" in SYSTEM


def test_memory_is_capped_newest_notes_whole_older_ones_by_first_line():
    notes = "".join(f"- note {i}: " + "detail " * 40 + f"\n  second line {i}\n" for i in range(200))
    text = memory_text(notes, cap=6000)
    assert len(text) < 6000 + 400
    assert "note 199: detail" in text and "second line 199" in text  # newest whole
    assert "second line 3\n" not in text and "older notes" in text


def test_cache_control_marks_the_stable_prefix_and_the_newest_message_for_anthropic_only():
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "brief"},
            {"role": "assistant", "content": "a"}, {"role": "user", "content": "newest"}]
    out = with_cache_control(msgs)
    marked = [i for i, m in enumerate(out) if isinstance(m["content"], list)]
    assert marked == [0, 1, 3]
    assert out[3]["content"][0] == {"type": "text", "text": "newest", "cache_control": {"type": "ephemeral"}}
    assert msgs[0]["content"] == "sys"  # the stored conversation stays plain
    assert uses_cache_control("anthropic/claude-sonnet-4-5") and not uses_cache_control("openai/gpt-4.1")
