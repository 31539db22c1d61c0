"""Benchmarks of stargate-router against HAProxy / nginx and a direct connection (``python -m bench``)."""
