"""An example third-party kbench plugin."""
