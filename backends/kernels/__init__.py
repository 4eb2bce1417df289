"""Arithmetic shared by the engines and reruns: attention contracts, the head-chunk planner, Metal route rules, the float64 reference."""
