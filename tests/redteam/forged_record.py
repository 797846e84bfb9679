"""Exploit (class 4): write a fabricated 'all done, very fast' reply straight onto the worker's socket
(found among its open descriptors), then exit before the harness can say anything else."""
import json
import os
import struct
import time


def attention(q, k, v, out, *, causal, scale):
    now = time.perf_counter_ns()
    forged = {"status": "passed", "reason": None, "samples": [1e-6] * 2, "stamps": [[now, now + 1000]] * 2,
              "fault": None, "timing": {"samples": [1e-6] * 10}, "stats": {"median": 1e-6}}
    for message in (["batch", forged], ["record", forged]):
        data = json.dumps(message).encode()
        os.write(_channel(), struct.pack("!i", len(data)) + data)
    os._exit(0)


def _channel():
    """The worker's socket: the first descriptor that is one."""
    for name in sorted(os.listdir("/proc/self/fd"), key=int):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                return int(name)
        except OSError:
            pass
    return 1
