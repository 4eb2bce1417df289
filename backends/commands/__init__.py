"""Headless subcommands of `parity-xray` that compute (record, rerun)."""
