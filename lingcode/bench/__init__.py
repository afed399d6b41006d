"""Benchmarks, not tests: `lingcode bench` (decode speed, decode.py) and `lingcode bench NAME` (NAME.py with main(args)), on real parts."""
