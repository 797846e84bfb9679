"""`kbench serve`: kbench's judge behind an HTTP API for many clients (RL rollout workers, evolvers).

Tasks (an op, a suite, a baseline, the held-out policy) live on the server; clients send kernel source for a
task id and get a per-stage report and a reward. Evaluations are queued in SQLite and survive a killed server.
The plugin module (:mod:`kbench_serve.plugin`) imports nothing heavy; FastAPI and uvicorn load when serving.
See docs/serve.md.
"""
__version__ = "0.1.0"
