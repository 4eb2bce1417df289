"""Recording real engine runs (llama.cpp, mlx-lm) as captures."""
