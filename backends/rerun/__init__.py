"""Live recomputation of one op or segment through MLX from captured inputs."""
