"""The benchmark harness (`make bench`, `python -m bench.run`). See bench/run.py."""
