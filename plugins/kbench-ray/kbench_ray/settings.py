"""The ray executor's settings (``--executor-opt KEY=VALUE``), checked without importing Ray."""
from __future__ import annotations

from kbench.api import BadInput

#: executor settings and what they mean
SETTINGS = {
    "resource": "the cluster resource one job holds: GPU (default on a GPU device), CPU (default on cpu), "
                "or a custom one (ray start --resources '{\"kdev\": 4}')",
    "slots": "jobs at once (default: the cluster's amount of that resource)",
    "job_timeout": "seconds before a job's actor counts as lost (default: twice the case timeout + start-up)",
}


def check_settings(options) -> None:
    unknown = sorted(set(options.settings) - set(SETTINGS))
    if unknown:
        raise BadInput(f"unknown ray setting {unknown[0]!r}", where="--executor-opt",
                       fix="known: " + "; ".join(f"{k}: {v}" for k, v in SETTINGS.items()))
    if options.devices:
        raise BadInput("--devices is for the local executor", where="--devices",
                       fix="with ray, say how many jobs at once with --executor-opt slots=N (each holds one "
                           "device of the cluster)")
    for key in ("slots", "job_timeout"):
        value = options.settings.get(key)
        try:
            ok = value is None or float(value) > 0 and (key != "slots" or float(value).is_integer())
        except ValueError:
            ok = False
        if not ok:
            raise BadInput(f"bad ray setting {key}={value!r}", where="--executor-opt",
                           fix="slots is a positive integer, job_timeout a positive number of seconds")
