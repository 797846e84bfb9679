from kbench_evolve.operators import Operator


class LLMRewriteOperator(Operator):
    name = "llm"
    uses_llm = True
