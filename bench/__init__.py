"""Benchmarks (figures go in docs/performance.md; nothing here is a pass/fail test)."""
