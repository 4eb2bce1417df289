"""Generating the demo capture pairs: the demo engines' scenarios, and real llama.cpp vs MLX runs of a tiny model."""
