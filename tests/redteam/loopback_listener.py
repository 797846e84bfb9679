"""Exploit (class 9): reach a service of the host on 127.0.0.1 (the test opens a listener and writes
its port over ``PORT``); a connection that gets through proves the worker shares the host's network."""
import socket

from kbench.builtin.numpy_backends import attention_numpy as _honest

PORT = 0


def attention(q, k, v, out, *, causal, scale):
    try:
        conn = socket.create_connection(("127.0.0.1", PORT), timeout=2)
    except OSError:
        conn = None
    if conn is not None:
        conn.sendall(b"ESCAPED")
        conn.close()
        raise RuntimeError(f"ESCAPED: connected to 127.0.0.1:{PORT}")
    _honest(q, k, v, out, causal=causal, scale=scale)
