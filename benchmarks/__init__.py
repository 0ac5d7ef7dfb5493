"""Benchmarks for flytekitplugins-ddlscale: measured speed, request cost and overhead.

Run everything with ``python -m benchmarks`` (``--quick`` for a short run,
``--only NAME`` for one benchmark). Each benchmark module exposes ``NAME``,
``TITLE`` and ``run(quick) -> BenchResult``; the runner writes
``benchmarks/results/<NAME>.json``, ``summary.md`` and plots.
"""
