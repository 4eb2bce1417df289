"""Headless subcommands of `parity-xray` that need nothing but the domain layer (report, validate, import)."""
