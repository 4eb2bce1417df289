"""Comparing two captures: profiles, the one alignment, execution state (contracts, dispatch), tensor diffs, tokens, and the verdict every surface reads."""
