"""Entry point of the kbench-cuda plugin (group `kbench`). Imports nothing heavy at import time."""
from __future__ import annotations
