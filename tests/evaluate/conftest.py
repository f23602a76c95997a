"""The Evaluate tests' fixtures, from the tiny Evaluate world (``eval_world.py``)."""

from eval_world import _one_thread, eval_world, world_tok  # noqa: F401
