"""Benchmarks that print figures (never timed tests). See README, "Benchmarks"."""
