"""The GPU's input generator is the judge's: the kernel source, compiled as host C++, draws NumPy's values."""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from kbench.api import philox_lanes, philox_source
from kbench_cuda.generate import FILL, device_source

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
    u64 n = strtoull(argv[1], 0, 10), stream = strtoull(argv[2], 0, 10);
    u64 k0 = strtoull(argv[3], 0, 10), k1 = strtoull(argv[4], 0, 10);
    static unsigned short table[65536];
    for (int i = 0; i < 65536; ++i) table[i] = (unsigned short)i;  /* the identity: the output is the lanes */
    unsigned short* out = (unsigned short*)malloc(n * 2);
    for (u64 b = 0; b * 16 < n; ++b) kb_fill_block<unsigned short>(out, table, n, b, stream, k0, k1);
    fwrite(out, 2, n, stdout);
    return 0;
}
"""


@pytest.fixture(scope="module")
def host_build(tmp_path_factory):
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to build the generator's source on the host")
    d = tmp_path_factory.mktemp("generate")
    (d / "gen.cpp").write_text(philox_source() + FILL + HARNESS)
    subprocess.run([compiler, "-O2", "-std=c++14", "-DKBENCH_HOST_ONLY", str(d / "gen.cpp"), "-o", str(d / "gen")],
                   check=True, capture_output=True, timeout=120)
    return d / "gen"


@pytest.mark.parametrize("n, stream, key", [
    (1, 0, (0, 0)),
    (1001, 3, (2**63 + 12345, 987654321)),   # not a multiple of 16: the last block is partial
    (4096, 7, (2**64 - 1, 2**64 - 1)),       # the key words at their largest (wrap-around of the key bump)
])
def test_the_kernels_philox_and_lanes_equal_numpys(host_build, n, stream, key):
    out = subprocess.run([str(host_build), str(n), str(stream), str(key[0]), str(key[1])], capture_output=True,
                         check=True, timeout=60).stdout
    assert np.array_equal(np.frombuffer(out, dtype=np.uint16), philox_lanes(key, stream, 0, n))


def test_the_device_source_defines_a_kernel_per_element_width():
    source = device_source()
    for bits in (8, 16, 32, 64):
        assert f"kb_generate_u{bits}(" in source
    assert "__umul64hi" in source  # the device's 64-bit high multiply, where the host uses __int128
