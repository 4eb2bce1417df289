"""Bit-level numerics: logical dtypes and their storage, ULP distance, one element's fields, GGML quantized blocks."""
