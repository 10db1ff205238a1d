"""Benchmarks: each prints its figure next to its target, measured in one run."""
