"""Checks of what a trainer saves: whether the adapter (or merged model) it leaves on disk is the model it trained.

A fine-tune that "got worse" is sometimes a fine-tune read back wrong. These rules come from running the trainers
themselves (tests/data/test_frameworks_real.py trains with torchtune 0.6.1's own LoRA recipe and compares what it
saved with what it trained).
"""

from __future__ import annotations

from gradian.audit.checks_config import _lora_config
from gradian.audit.context import AuditContext
from gradian.audit.registry import Hit, NotApplicable, check

#: torchtune checkpointer ``model_type`` values whose base weights it converts to HF's layout without Llama's q/k
#: permutation (``qwen2_tune_to_hf`` maps names only), while its PEFT export permutes every q/k ``lora_B``
_UNPERMUTED_TYPES = ("QWEN2",)
_QK = ("q_proj", "k_proj")


# ---------------------------------------------------------------------- C23
@check("C23", requires=("config",), severity="error", rank=30)
def saved_model_is_not_trained_model(ctx: AuditContext) -> list[Hit]:
    """A torchtune run saves an adapter or model that is not the one it trained.

    Rule: a torchtune LoRA run whose PEFT adapter permutes q_proj/k_proj lora_B for a model converted without
    Llama's rotary permutation (checkpointer model_type QWEN2: error); a torchtune DoRA run (use_dora: true), whose
    PEFT adapter_config.json omits use_dora and, for a model converted with the permutation, keeps the q/k
    magnitudes in torchtune's rotary order (error); or one on device cpu with more than one epoch that saves merged
    weights (save_adapter_weights_only false, its default), which merges the adapter into the live base weights at
    every epoch's save (warning)

    Fix: evaluate the adapter as torchtune trained it: load its adapter_model.pt, or un-permute the PEFT file's q/k
    lora_B rows (view(H, 2, d/2, r).transpose(1, 2); Gradian does so when adapter_model.pt is beside it); for DoRA
    add use_dora: true to adapter_config.json and (Llama-style models) permute the q/k lora_magnitude_vector rows,
    view(H, d/2, 2).transpose(1, 2) (Gradian does both when adapter_model.pt is beside it); train on a GPU, or set
    save_adapter_weights_only: true, so that later epochs do not train on merged weights

    Source: torchtune 0.6.1 training/checkpointing/_checkpointer.py (FullModelHFCheckpointer.save_checkpoint →
    convert_weights.tune_to_peft_adapter_weights / tune_to_peft_adapter_config; qwen2_tune_to_hf; tune_to_hf),
    recipes/lora_finetune_single_device.py
    (save_checkpoint: v.cpu(), get_merged_lora_ckpt adds in place), both run in tests/data/test_frameworks_real.py
    """
    c = _lora_config(ctx)
    if c.trainer != "torchtune":
        raise NotApplicable(f"a {c.trainer or 'unknown'} run (the rules are torchtune's)")
    hits = []
    targets = c.lora_target_modules if isinstance(c.lora_target_modules, list) else []
    qk = sorted({m for m in targets if m in _QK})
    kind = (c.checkpoint_model_type or "").upper()
    if kind in _UNPERMUTED_TYPES and qk:
        hits.append(
            Hit(
                "error",
                f"torchtune writes this {kind} adapter's {'/'.join(qk)} lora_B rows permuted for Llama's rotary "
                "layout in adapter_model.safetensors: PEFT loading that file (and what reads it: vLLM, lm-eval's "
                "peft=) runs another model than the one trained",
                {
                    "value": qk,
                    "threshold": "no q_proj/k_proj in a QWEN2 PEFT export",
                    **c.cite("checkpoint_model_type", "lora_target_modules"),
                },
                fix="evaluate the adapter as torchtune trained it: load adapter_model.pt (torchtune's names), or "
                "un-permute the PEFT file's q/k lora_B rows, view(H, 2, d/2, r).transpose(1, 2) (Gradian does so "
                "when adapter_model.pt is beside it); or leave q_proj/k_proj out of lora_attn_modules",
            )
        )
    if c.use_dora:
        llama = kind not in _UNPERMUTED_TYPES and qk
        hits.append(
            Hit(
                "error",
                "torchtune writes this DoRA adapter's adapter_config.json without use_dora, so PEFT loading it (vLLM, "
                "lm-eval's peft=, a merge) drops the trained magnitudes and runs plain LoRA"
                + (
                    f"; and its {'/'.join(qk)} magnitudes stay in torchtune's rotary order while the base's rows are "
                    "converted to HF's"
                    if llama
                    else ""
                ),
                {
                    "value": True,
                    "threshold": "use_dora in the PEFT export's adapter_config.json",
                    **c.cite("use_dora", "checkpoint_model_type", "lora_target_modules"),
                },
                fix="evaluate the adapter as torchtune trained it: add use_dora: true to its adapter_config.json"
                + (
                    " and permute the q/k lora_magnitude_vector rows as the base's, view(H, d/2, 2).transpose(1, 2)"
                    if llama
                    else ""
                )
                + " (Gradian does so when adapter_model.pt is beside it), or load adapter_model.pt",
            )
        )
    epochs = c.num_epochs
    if (c.device or "").lower() == "cpu" and epochs is not None and epochs > 1 and c.save_adapter_weights_only is False:
        hits.append(
            Hit(
                "warning",
                "on device cpu torchtune merges the adapter into the live base weights at each epoch's save: "
                f"epoch{'s 2..' if epochs > 2 else ' '}{int(epochs)} trained on W + ΔW of the epochs before, and "
                "the adapters saved after epoch_0/ do not reproduce the model trained",
                {
                    "value": "cpu",
                    "threshold": "gpu, or save_adapter_weights_only: true",
                    **c.cite("device", "num_epochs", "save_adapter_weights_only"),
                },
                fix="set save_adapter_weights_only: true (or train on a GPU, where the merge works on a copy) and "
                "train again; until then only epoch_0/ is a model that was trained",
            )
        )
    return hits
