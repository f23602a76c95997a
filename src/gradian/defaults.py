"""The defaults that several commands share, each stated once (issue 26: one default per concept).

A flag that two commands both take means the same thing in both, so it has one default, read from here by the
specs and the CLI options (``tests/test_cli_defaults.py`` walks the CLI and fails when a same-named option has
two defaults, with a commented allowlist for the flags that mean different things in different commands).
Torch-free: the bottom layer (``docs/architecture.md``); the device resolver itself is
:func:`gradian.models.load.resolve_device`, which needs torch.
"""

from __future__ import annotations

#: Truncate a rendered row to this many tokens (keep the start). TRL 1.16's ``SFTConfig.max_length`` default, so
#: a run whose config does not say is read as TRL trained it; ``gradian train`` (without a config saying
#: otherwise), ``index``, ``attribute`` and ``evaluate`` all use it. A run's own config (``--config``, or the
#: ``training_config.yaml`` beside the adapter) beats it. Batches are padded to their longest row, not to this.
MAX_LENGTH = 1024

#: Where models load and train: ``auto`` is CUDA if available, else MPS, else CPU
#: (:func:`gradian.models.load.resolve_device`); a run records the device it resolved to.
DEVICE = "auto"

#: The models' dtype.
DTYPE = "float32"
