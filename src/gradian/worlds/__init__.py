"""The worked example's world generator: a real fine-tune whose culprits we planted.

* :func:`build_world` / :class:`WorldSpec` / :class:`World`: data, eval and ground truth
  (:mod:`gradian.worlds.builder`; the spec in :mod:`gradian.worlds.spec`).
* :func:`materialise_smollm2`: SmolLM2-135M-Instruct as an HF folder in the cache
  (:mod:`gradian.worlds.smollm2`).
* :func:`build_tiny_base`: the tiny variant's base, pretrained in seconds (:mod:`gradian.worlds.tiny`).
* :class:`~gradian.worlds.knobs.WorldKnobs`: the axes a world may vary (:mod:`gradian.worlds.knobs`), and
  :func:`~gradian.worlds.family.build_family`: the family of worlds built from them (:mod:`gradian.worlds.family`).
"""

from gradian.worlds.builder import build_world
from gradian.worlds.smollm2 import materialise_smollm2
from gradian.worlds.spec import World, WorldSpec, default_train_spec
from gradian.worlds.tiny import TinyBaseSpec, build_tiny_base

__all__ = [
    "World",
    "WorldSpec",
    "build_world",
    "default_train_spec",
    "materialise_smollm2",
    "TinyBaseSpec",
    "build_tiny_base",
]
