"""Launch a ShinkaEvolve search (pip install kbench[shinka]) with kbench as the fitness function.

    cd examples/shinka && OPENAI_API_KEY=... python run_evo.py

Written against shinka-evolve 0.0.7 (ShinkaEvolveRunner, EvolutionConfig, LocalJobConfig, DatabaseConfig);
evaluate.py is the whole contract between the two: ShinkaEvolve runs it once per candidate.
"""
from shinka.core import EvolutionConfig, ShinkaEvolveRunner
from shinka.database import DatabaseConfig
from shinka.launch import LocalJobConfig

TASK = """You improve a CPU attention kernel written with NumPy, scored by kbench. The file defines
attention(q, k, v, out, *, causal, scale): q is (batch, seqlen_q, heads_q, head_dim), k and v are
(batch, seqlen_kv, heads_kv, head_dim) with heads_q a multiple of heads_kv; causal masking is aligned
bottom-right. Write the result into out (fp32 is checked to a relative L2 error of 1e-5). NumPy only; no
module-level state, caches, threads left running or library attention: kbench refuses them, and any failed
case scores 0. Make it faster."""

if __name__ == "__main__":
    runner = ShinkaEvolveRunner(
        evo_config=EvolutionConfig(task_sys_msg=TASK, num_generations=20, init_program_path="initial.py",
                                   results_dir="results_shinka", llm_models=["gpt-4o-mini"], use_text_feedback=True,
                                   embedding_model=None),
        job_config=LocalJobConfig(eval_program_path="evaluate.py"),
        db_config=DatabaseConfig(),
        # one evaluation at a time: concurrent kbench runs on the same cores would time each other
        max_evaluation_jobs=1,
    )
    runner.run()
