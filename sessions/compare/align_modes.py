"""How records are paired, by name: without the alignment code, so a command line can offer the
modes before numpy and h5py are imported (`report` starts the disk first)."""

AUTO = "auto"
CALLS = "calls"
POSITIONS = "positions"
ALIGN_MODES = (AUTO, CALLS, POSITIONS)
"""How records are paired: by the same forward calls (both runs cut the prompt alike), or by token
position (docs/profiles.md, "Alignment modes"); auto picks calls when both runs made the same calls."""
