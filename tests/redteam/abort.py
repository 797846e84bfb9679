"""Crash: abort the process (SIGABRT), as a failed assertion in native code would."""
import os


def attention(q, k, v, out, *, causal, scale):
    os.abort()
