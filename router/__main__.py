"""``python -m router`` is the same as the ``stargate-router`` console script."""

from router.cli import entrypoint

entrypoint()
