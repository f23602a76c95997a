"""The base model's spec (:class:`ModelSpec`), torch-free: what a run.json records and :mod:`gradian.runfile` checks.

Loading the model it names is :mod:`gradian.models.load`'s (which imports torch).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from gradian.defaults import DEVICE, DTYPE
from gradian.errors import GradianUserError

#: The dtypes a base model can be loaded in (:data:`gradian.models.load.DTYPES` maps them to torch's).
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
#: the 4-bit schemes a QLoRA run's base is reproduced in (bitsandbytes' quant type, ``-dq``: double quantisation)
QUANT_NAMES = ("nf4", "nf4-dq", "fp4", "fp4-dq")


@dataclass(frozen=True)
class ModelSpec:
    """Which base model and how to load it. Serialised into the manifest."""

    base: str
    dtype: str = DTYPE
    device: str = DEVICE
    trust_remote_code: bool = False
    gguf_file: str | None = None
    #: a QLoRA run's 4-bit scheme (:data:`QUANT_NAMES`): the base is loaded as its trainer quantised it
    #: (:mod:`gradian.models.quant`); None: the base as stored
    quantize: str | None = None
    #: the dtype the trainer loaded the base in before quantising it (None: the dtype its config.json names)
    quantize_from: str | None = None

    def __post_init__(self) -> None:
        from gradian.validate import check_bool, check_choice, where

        if not isinstance(self.base, str) or not self.base.strip():
            raise GradianUserError(
                "base must name a model folder or an HF id",
                where=where("--base", "ModelSpec", "base"),
                fix="pass a local model folder or a cached HF id",
            )
        check_choice(self.dtype, DTYPE_NAMES, "ModelSpec", "dtype", flag="--dtype")
        check_device(self.device)
        check_bool(self.trust_remote_code, "ModelSpec", "trust_remote_code", flag="--trust-remote-code")
        if self.gguf_file is not None and not isinstance(self.gguf_file, str):
            raise GradianUserError(
                "gguf_file must be a file name",
                where=where(None, "ModelSpec", "gguf_file"),
                fix="pass the .gguf file's name inside the base folder",
            )

        if self.quantize is not None:
            check_choice(self.quantize, QUANT_NAMES, "ModelSpec", "quantize", flag="--base-quant")
        if self.quantize_from is not None:
            check_choice(self.quantize_from, DTYPE_NAMES, "ModelSpec", "quantize_from")

    def to_dict(self) -> dict[str, Any]:
        """The fields; ``quantize`` / ``quantize_from`` only when set (a base loaded as stored keeps its manifest)."""
        d = asdict(self)
        for k in ("quantize", "quantize_from"):
            if d[k] is None:
                del d[k]
        return d


_DEVICE = re.compile(r"^(cpu|mps|auto|cuda(:\d+)?)$")


def check_device(name: Any, flag: str = "--device", owner: str = "ModelSpec") -> str:
    """``cpu``, ``cuda``, ``cuda:N``, ``mps`` or ``auto``; anything else is a user error (availability is
    checked when the model is loaded, by :func:`resolve_device`).
    """
    from gradian.validate import where

    if not isinstance(name, str) or not _DEVICE.match(name):
        shown = repr(name) if len(repr(name)) < 40 else repr(name)[:39] + "…"
        raise GradianUserError(
            f"unknown device {shown}", where=where(flag, owner, "device"), fix="use cpu, cuda, cuda:N, mps or auto"
        )
    return name
