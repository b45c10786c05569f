"""Benchmarks (figures go in the README; nothing here is a pass/fail test)."""
