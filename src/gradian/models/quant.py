"""A QLoRA run's base, quantised as its trainer quantised it: the weights its adapter was trained on.

QLoRA trains the adapter on a base whose linear layers transformers replaced by bitsandbytes' 4-bit ones
(``BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=..., bnb_4bit_use_double_quant=...)``): each weight
``W`` (out, in) is stored as codes and read back as ``Ŵ = dequantize_4bit(quantize_4bit(W))`` (blocks of 64
numbers, one absmax each; NF4 or FP4 codes; with double quantisation the absmaxes themselves 8-bit, in blocks of
256). The trained model is ``Ŵ + s·BA``, not ``W + s·BA``: on the test model the full-precision base's logits are
0.056 away from the 4-bit model's.

:func:`quantize_base` puts ``Ŵ`` in place of ``W`` in every module transformers quantises (every ``nn.Linear``
but the ones its ``get_keys_to_not_convert`` keeps: the output embedding, tied weights, the last module), computed
by bitsandbytes' own ``quantize_4bit`` / ``dequantize_4bit`` from ``W`` in the dtype the trainer loaded the base in
(``source_dtype``). The model then stays an ordinary float model: hooks, per-example gradients and every engine
work on it unchanged, in Gradian's own dtype. ``tests/models/test_quant.py`` holds each ``Ŵ`` equal to the weight
of transformers' own 4-bit load, and the logits to its.

Names (:data:`gradian.models.spec.QUANT_NAMES`): ``"nf4"``, ``"nf4-dq"`` (double quantisation), ``"fp4"``, ``"fp4-dq"``.
"""

from __future__ import annotations

from typing import Any

import torch

from gradian.errors import GradianUserError

#: bitsandbytes' block size for 4-bit weights in transformers' ``Linear4bit`` (``Params4bit(blocksize=64)``)
BLOCKSIZE = 64


def parse_quant(name: str) -> tuple[str, bool]:
    """``"nf4-dq"`` → ``("nf4", True)``."""
    kind, _, dq = name.partition("-")
    return kind, dq == "dq"


def _converted(model: torch.nn.Module) -> tuple[list[tuple[str, torch.nn.Linear]], list[str]]:
    """The linear layers transformers quantises, and the names it keeps in full precision: its own
    ``get_keys_to_not_convert`` (output embedding, tied weights, last module) matched by its own
    ``should_convert_module`` (a prefix up to a module boundary, a regex, or a suffix).
    """
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    keep = sorted(get_keys_to_not_convert(model))
    layers = [
        (n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and should_convert_module(n, keep)
    ]
    return layers, keep


def quantize_base(model: torch.nn.Module, name: str, source_dtype: torch.dtype) -> dict[str, Any]:
    """Replace every quantised layer's weight ``W`` by ``dequantize_4bit(quantize_4bit(W))``, in place.

    Args:
        model: the base causal LM (float weights, any dtype).
        name: one of :data:`gradian.models.spec.QUANT_NAMES`.
        source_dtype: the dtype the trainer loaded the base in before quantising (``Ŵ`` is computed from ``W`` in it
            and returned in it, as bitsandbytes does, then cast to the model's dtype).

    Returns:
        ``{"scheme": name, "layers": k, "kept": [names left in full precision], "source_dtype": str}`` for the
        manifest.

    Raises:
        GradianUserError: bitsandbytes is not installed.
    """
    try:
        import bitsandbytes.functional as bnbf
    except ImportError:
        raise GradianUserError(
            f"the run trained on a 4-bit base ({name}) and reproducing it needs bitsandbytes, which is not installed",
            where="training setup: base quantisation",
            fix="pip install 'gradian[qlora]' (bitsandbytes), or pass --base-quant none to use the full-precision base",
        ) from None
    kind, dq = parse_quant(name)
    layers, keep = _converted(model)
    with torch.no_grad():
        for _, mod in layers:
            w = mod.weight
            src = w.detach().to("cpu", source_dtype)
            q, state = bnbf.quantize_4bit(src, blocksize=BLOCKSIZE, quant_type=kind, compress_statistics=dq)
            w.copy_(bnbf.dequantize_4bit(q, state).to(w.device, w.dtype))
    return {"scheme": name, "layers": len(layers), "kept": keep, "source_dtype": str(source_dtype).split(".")[-1]}
