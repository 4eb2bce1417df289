"""`parity-xray doctor`: what a run needs on this machine, and the exact fix for what is missing (no Qt in-process)."""
