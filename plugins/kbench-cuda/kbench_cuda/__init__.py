"""kbench-cuda: a first-party kbench plugin, built exactly as a third party would build one."""
