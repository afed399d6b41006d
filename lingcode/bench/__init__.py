"""Benchmarks (`lingcode bench ...`): scripted workloads against a running daemon, with results as files.

Not tests: they measure time, so they run by hand and their results are committed under
bench/results/. Each benchmark is one module here, imported lazily by lingcode.cli.
"""
