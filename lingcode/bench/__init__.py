"""Benchmarks (`lingcode bench NAME`): each NAME.py has main(args), run on real parts; not tests."""
