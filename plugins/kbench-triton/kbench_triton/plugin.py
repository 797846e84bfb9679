"""Entry point of the kbench-triton plugin (group `kbench`). Imports nothing heavy at import time."""
from __future__ import annotations
