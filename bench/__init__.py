"""Benchmarks: side-by-side ratios measured in one run (never timed assertions in tests)."""
