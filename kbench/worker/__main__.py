"""``python -m kbench.worker FD``: a worker serving the judge over the socket FD (kbench.worker.main)."""
import sys

from kbench.worker.main import main

main(sys.argv)
