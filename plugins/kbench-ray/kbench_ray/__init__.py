"""kbench-ray: ``kbench run SUITE --executor ray [--address ADDR]`` (docs/scale-out.md)."""
