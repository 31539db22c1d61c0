"""Shared test support: byte builders and peer-process harnesses (no tests here)."""
