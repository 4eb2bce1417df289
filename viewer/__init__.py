"""Parity X-ray desktop viewer: Qt windows, widgets and workers over `sessions` and `backends`."""
