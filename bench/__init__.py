"""Benchmarks of asupervisor's local backend against TorchX 0.7.0 and bare baselines.

Run everything with ``bash scripts/bench`` (``--quick`` for a smoke run); see
``docs/benchmarks.md`` for the latest results and how they were measured.
"""
