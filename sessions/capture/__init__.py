"""Capture files: the HDF5 format, the hardened reader, the writer, and the safety checks an untrusted file passes before it is read."""
