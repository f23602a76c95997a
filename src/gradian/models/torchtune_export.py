"""torchtune 0.6.1's PEFT export, read as the model torchtune trained.

torchtune's ``FullModelHFCheckpointer.save_checkpoint`` writes an adapter twice: its own state dict
(:data:`TORCHTUNE_ADAPTER`, torchtune's key names, e.g. ``layers.{i}.attn.q_proj.lora_b.weight``) and a PEFT folder
made by ``convert_weights.tune_to_peft_adapter_weights`` and ``tune_to_peft_adapter_config``. Its base-model
conversion permutes the q/k rows between torchtune's interleaved rotary layout and HF's for Llama-style models
(``convert_weights.tune_to_hf``, Gemma 2's too) but not for Qwen2 (``qwen2_tune_to_hf`` maps names only). The PEFT
export does not follow the base conversion, so the PEFT folder does not always hold the model torchtune trained:

* it permutes every ``q_proj`` / ``k_proj`` ``lora_B`` (``(H·d, r)``, rows ``[h, d/2, 2] → [h, 2, d/2]``), which is
  right for a Llama and wrong for a Qwen2: there ``W + s·B'A`` with ``B' = P·B`` is another model;
* it never permutes a DoRA magnitude (``magnitude`` → ``lora_magnitude_vector``, one number per output row), which
  is right for a Qwen2 and wrong for a Llama: there q/k's ``m`` scales other rows than the ones it was trained for;
* its ``adapter_config.json`` never says ``use_dora``, so PEFT loads a DoRA adapter as plain LoRA.

:func:`torchtune_fix` puts each right only when the ``.pt`` beside the PEFT file confirms it tensor by tensor (read
with ``weights_only=True``); otherwise it leaves the weights as written and says why. Measured on real torchtune
runs (``tests/data/test_frameworks_real.py``): base + fixed adapter = torchtune's merged model to ~2e-7.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gradian.safeio import check_regular_file, check_size

#: torchtune's own copy of the adapter, in its own key names (``layers.{i}.attn.q_proj.lora_b.weight``), which its
#: ``FullModelHFCheckpointer`` writes beside the PEFT file (PEFT never does)
TORCHTUNE_ADAPTER = "adapter_model.pt"
#: HF ``model_type`` values whose torchtune 0.6.1 checkpoint conversion keeps q/k in HF's rotary layout
#: (``qwen2_tune_to_hf`` maps names only), while its PEFT export permutes q/k ``lora_B`` for Llama's
_UNPERMUTED = ("qwen2",)
#: HF ``model_type`` values whose torchtune 0.6.1 conversion permutes the q/k rows (``convert_weights.tune_to_hf``
#: for Llama 2/3 and Mistral, ``gemma2_tune_to_hf``), so a DoRA magnitude of q/k must be permuted too, as the PEFT
#: export permutes ``lora_B`` (run on Llama-3)
_PERMUTED = ("llama", "mistral", "gemma2")
_QK = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.([qk])_proj\.(lora_B\.weight|lora_magnitude_vector)$")
_THEIRS = {"lora_B.weight": "lora_b.weight", "lora_magnitude_vector": "magnitude"}


@dataclass
class TorchtuneFix:
    """What :func:`torchtune_fix` found.

    Attributes:
        weights: the adapter's PEFT-named tensors as torchtune trained them (the dict given when nothing changed).
        dora: the adapter is DoRA although its ``adapter_config.json`` does not say ``use_dora``.
        notes: one line per thing put right (or left as written, and why).
        tag: what was put right, for the index identity (None: nothing).
    """

    weights: dict[str, torch.Tensor]
    dora: bool = False
    notes: list[str] = field(default_factory=list)
    tag: str | None = None


def is_torchtune_export(adapter_dir: str | Path) -> bool:
    """Whether torchtune's own ``adapter_model.pt`` is beside the PEFT file (no other tool writes it)."""
    return (Path(adapter_dir) / TORCHTUNE_ADAPTER).is_file()


def _rows(t: torch.Tensor, n_heads: int, head_dim: int, to_hf: bool) -> torch.Tensor:
    """q/k rows (``(H·d, r)`` or ``(H·d,)``) between torchtune's interleaved rotary order ``[h, d/2, 2]`` and HF's
    ``[h, 2, d/2]``: ``to_hf`` is torchtune's ``_permute_lora_matrix`` (its export of ``lora_B``), else its inverse.
    """
    rest = t.shape[1:]
    a, b = (head_dim // 2, 2) if to_hf else (2, head_dim // 2)
    return t.reshape(n_heads, a, b, *rest).transpose(1, 2).reshape(n_heads * head_dim, *rest)


def torchtune_fix(
    weights: dict[str, torch.Tensor], adapter_dir: str | Path, config: Any, use_dora: bool = False
) -> TorchtuneFix:
    """The adapter's PEFT weights as torchtune trained them (module docstring), confirmed by its ``.pt``.

    Args:
        weights: the PEFT file's tensors (:func:`gradian.models.load.read_adapter_weights`).
        config: the base model's HF config (``model_type``, heads, ``head_dim``).
        use_dora: what the folder's ``adapter_config.json`` says.
    """
    d = Path(adapter_dir)
    if not is_torchtune_export(d):
        return TorchtuneFix(weights)
    pt = d / TORCHTUNE_ADAPTER
    check_size(pt, check_regular_file(pt, "torchtune adapter").st_size, "torchtune adapter")
    try:
        tune = torch.load(str(pt), map_location="cpu", weights_only=True)
    except Exception as e:
        return TorchtuneFix(weights, notes=[f"{pt} does not read safely ({type(e).__name__}): the PEFT file is used"])
    if not isinstance(tune, dict):
        return TorchtuneFix(weights, notes=[f"{pt} is not a state dict: the PEFT file is used as it is"])
    out = TorchtuneFix(weights)
    mtype = getattr(config, "model_type", None)
    if any(k.endswith("lora_magnitude_vector") for k in weights) and not use_dora:
        if not any(str(k).endswith(".magnitude") for k in tune):
            return TorchtuneFix(
                weights, notes=[f"{pt} holds no magnitude: the PEFT file's DoRA vectors are unconfirmed"]
            )
        out.dora = True
        out.notes.append(
            f"{d}: torchtune 0.6.1 wrote this DoRA adapter's adapter_config.json without use_dora (PEFT, vLLM or a "
            "merge reading it as it is drop the magnitudes); Gradian loads it as DoRA, as torchtune trained it"
        )
    # which q/k tensors the export left in another order than the base's: lora_B for a Qwen2, magnitudes for a Llama
    wrong = "lora_B.weight" if mtype in _UNPERMUTED else "lora_magnitude_vector" if mtype in _PERMUTED else None
    keys = [k for k in weights if (m := _QK.search(k)) and m.group(3) == wrong]
    if not keys:
        return out
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    to_hf = wrong == "lora_magnitude_vector"  # a Llama's magnitude: HF's rows are torchtune's permuted
    fixed = dict(weights)
    for k in keys:
        layer, qk, _ = _QK.search(k).groups()  # type: ignore[union-attr]
        theirs = tune.get(f"layers.{layer}.attn.{qk}_proj.{_THEIRS[wrong]}")
        if not isinstance(theirs, torch.Tensor) or theirs.shape != weights[k].shape:
            out.notes.append(f"{pt} has no {qk}_proj {_THEIRS[wrong]} of layer {layer}: the PEFT file is used as it is")
            return out
        permuted = _rows(theirs, heads if qk == "q" else kv, head_dim, to_hf=True)
        right, exported = (permuted, theirs) if to_hf else (theirs, permuted)
        if torch.equal(weights[k], right):
            return out  # the PEFT file is torchtune's model as it is (a torchtune that exports it right)
        if not torch.equal(weights[k], exported):
            out.notes.append(
                f"{pt}: its {qk}_proj {_THEIRS[wrong]} of layer {layer} is neither the PEFT file's nor its "
                "permuted rows; the PEFT file is used as it is"
            )
            return out
        fixed[k] = right.contiguous()
    what = (
        "q_proj/k_proj lora_B rows permuted for Llama's rotary layout"
        if not to_hf
        else ("q_proj/k_proj DoRA magnitudes in its own rotary order, not the base's")
    )
    done = "un-permuted them" if not to_hf else "permuted them as the base's rows"
    out.weights = fixed
    out.tag = "torchtune-qk-unpermuted" if not to_hf else "torchtune-qk-magnitude-permuted"
    out.notes.append(
        f"{d}: torchtune 0.6.1 wrote this {mtype} adapter's {what} ({len(keys)} tensors); Gradian {done} (checked "
        f"against its {TORCHTUNE_ADAPTER}), so the model is the one torchtune trained. PEFT, vLLM or a merge loading "
        "this folder as it is get another model"
    )
    return out
