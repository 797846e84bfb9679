from kbench_evolve.operators import Operator


class AgentOperator(Operator):
    name = "agent"
    uses_llm = True
