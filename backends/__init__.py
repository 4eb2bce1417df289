"""Compute layer: the MLX backend, the numpy float64 reference and the demo engines. No Qt."""
