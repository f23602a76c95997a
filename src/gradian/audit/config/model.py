"""The config model: :class:`TrainConfig`, one typed view of a training run's settings, whatever file they came from."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

#: What each training stage name means for the checks (see :attr:`TrainConfig.stage_kind`).
STAGE_KINDS = {
    "sft": "sft",
    "pt": "pretraining",
    "pretrain": "pretraining",
    "pretraining": "pretraining",
    "cpt": "pretraining",
    "dpo": "preference",
    "ipo": "preference",
    "kto": "preference",
    "orpo": "preference",
    "simpo": "preference",
    "cpo": "preference",
    "rm": "preference",
    "reward": "preference",
    "bco": "preference",
    "nca": "preference",
    "ppo": "rl",
    "grpo": "rl",
    "gdpo": "rl",
    "rloo": "rl",
    "online_dpo": "rl",
    "gkd": "rl",
}


#: fields whose value is a set of names: two files listing the same names in another order agree
UNORDERED_FIELDS = frozenset({"lora_target_modules"})


def same_value(name: str, a: Any, b: Any) -> bool:
    """Whether two files' values of ``name`` agree: equal, or (:data:`UNORDERED_FIELDS`) the same names in
    another order (``["q_proj", "v_proj"]`` and ``["v_proj", "q_proj"]``).
    """
    if a == b:
        return True
    if name in UNORDERED_FIELDS and isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return sorted(map(str, a)) == sorted(map(str, b))
    return False


@dataclass
class TrainConfig:
    """One view of a training run's settings, whatever file format they came from.

    Unknown values are ``None``. :meth:`source` gives the field each value came from.
    ``finetuning`` is ``"lora"``, ``"qlora"``, ``"full"`` or ``"freeze"`` (LLaMA-Factory's freeze tuning: the last
    few layers trained in full, the rest frozen; not LoRA, not a full fine-tune either).
    ``train_on_inputs`` True means the loss covers the prompt (axolotl ``train_on_inputs``,
    LLaMA-Factory ``train_on_prompt``, torchtune ``train_on_input``, TRL ``completion_only_loss=false``).
    ``max_length`` None with a known trainer means the trainer does not truncate.
    ``stage`` is the training stage (``sft``, ``pt``, ``dpo``, ``kto``, ``orpo``, ``rm``, ``grpo`` ...;
    None: not said, SFT assumed); ``dedup_exact`` True when the trainer drops exact duplicate rows
    (axolotl ``dataset_exact_deduplication``); ``messages_loss`` ``"final_assistant_turn"`` when
    the loss of a ``messages`` row covers its final assistant turn only (``gradian train``).
    """

    trainer: str | None = None
    base_model: str | None = None
    finetuning: str | None = None
    learning_rate: float | None = None
    num_epochs: float | None = None
    max_steps: int | None = None
    micro_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    total_batch_size: int | None = None
    warmup_steps: float | None = None
    warmup_ratio: float | None = None
    lr_scheduler: str | None = None
    max_grad_norm: float | None = None
    max_length: int | None = None
    truncation: str | None = None
    packing: bool | None = None
    packing_strategy: str | None = None
    padding_free: bool | None = None
    attn_implementation: str | None = None
    completion_only_loss: bool | None = None
    assistant_only_loss: bool | None = None
    train_on_inputs: bool | None = None
    dataset_text_field: str | None = None
    response_template: str | None = None
    instruction_template: str | None = None
    data_collator: str | None = None
    lora_r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_target_modules: Any = None
    lora_target_linear: bool | None = None
    use_rslora: bool | None = None
    use_dora: bool | None = None
    modules_to_save: list[str] | None = None
    trainable_token_indices: Any = None
    load_in_4bit: bool | None = None
    #: a 4-bit base's scheme: bitsandbytes' quant type (``nf4`` / ``fp4``), double quantisation, the method
    #: (LLaMA-Factory ``quantization_method``: ``bnb``, ``hqq`` ...) and the dtype the base was loaded in
    quant_type: str | None = None
    double_quant: bool | None = None
    quant_method: str | None = None
    load_dtype: str | None = None
    load_in_8bit: bool | None = None
    bnb_4bit_compute_dtype: str | None = None
    bf16: bool | None = None
    fp16: bool | None = None
    eval_strategy: str | None = None
    eval_steps: float | None = None
    save_strategy: str | None = None
    save_steps: float | None = None
    load_best_model_at_end: bool | None = None
    val_set_size: float | None = None
    has_eval_dataset: bool | None = None
    group_by_length: bool | None = None
    #: the train sampler's inputs (HF ``TrainingArguments``; :mod:`gradian.audit.hf_order`)
    seed: int | None = None
    data_seed: int | None = None
    dataloader_drop_last: bool | None = None
    train_sampling_strategy: str | None = None
    use_seedable_sampler: bool | None = None
    #: torchtune's recipe: ``shuffle`` (its sampler's; seed 0 always) and ``max_steps_per_epoch``
    shuffle: bool | None = None
    max_steps_per_epoch: int | None = None
    #: LLaMA-Factory: ``max_samples`` (each dataset cut to its first N rows) and ``disable_shuffling`` (rows in order)
    max_samples: int | None = None
    disable_shuffling: bool | None = None
    #: the train set shuffled once by ``datasets``' ``shuffle(seed=seed)`` before the sampler (axolotl
    #: ``shuffle_merged_datasets``, default true; TRL ``shuffle_dataset``, default false); axolotl's
    #: ``min_sample_len`` (shorter rows dropped), ``curriculum_sampling`` (rows in order) and ``dataset_shard_num``
    shuffle_dataset: bool | None = None
    min_sample_len: int | None = None
    curriculum_sampling: bool | None = None
    dataset_shards: int | None = None
    chat_template: str | None = None
    chat_template_path: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    added_tokens: list[str] | None = None
    datasets: list[dict[str, Any]] | None = None
    stage: str | None = None
    #: the dataset splits the run trains on, each ``{"dataset", "split", "from"}`` (TRL ``dataset_train_split``,
    #: alignment-handbook ``dataset_mixture.datasets[].split``, axolotl ``datasets[].split``)
    train_splits: list[dict[str, Any]] | None = None
    beta: float | None = None
    loss_type: str | None = None
    max_prompt_length: int | None = None
    #: KTO's per-label loss weights (TRL KTOConfig desirable_weight / undesirable_weight, axolotl
    #: kto_desirable_weight / kto_undesirable_weight, LLaMA-Factory kto_chosen_weight / kto_rejected_weight)
    desirable_weight: float | None = None
    undesirable_weight: float | None = None
    ref_model: str | None = None
    #: adapters the run starts from, in order (LLaMA-Factory ``adapter_name_or_path``: all but the last are merged
    #: into the base, the last is resumed as the trained adapter unless ``create_new_adapter``)
    init_adapters: list[str] | None = None
    create_new_adapter: bool | None = None
    #: TRL DPOConfig's TR-DPO switch (the reference is mixed with the policy every ``ref_model_sync_steps``), and its
    #: fixed-reference precompute
    sync_ref_model: bool | None = None
    precompute_ref_log_probs: bool | None = None
    dedup_exact: bool | None = None
    messages_loss: str | None = None
    #: where the run trained (torchtune ``device``: ``cpu``, ``cuda`` ...), and what its checkpoints hold: torchtune
    #: ``save_adapter_weights_only`` (False: the merged model beside the adapter) and its HF checkpointer's
    #: ``model_type`` (``QWEN2``, ``LLAMA3`` ...: how it converts weights to HF's layout)
    device: str | None = None
    save_adapter_weights_only: bool | None = None
    checkpoint_model_type: str | None = None

    paths: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    version_sources: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ access
    def source(self, name: str) -> str | None:
        """Where ``name``'s value came from (``"file: field"`` or ``"default (...)"``), or None."""
        return self.sources.get(name)

    def is_default(self, name: str) -> bool:
        """True when ``name``'s value is the trainer's default (the file left it unset)."""
        s = self.sources.get(name)
        return s is not None and s.startswith("default")

    def cite(self, *names: str) -> dict[str, Any]:
        """``{name: {"value": v, "from": source}}`` for evidence."""
        return {n: {"value": getattr(self, n), "from": self.sources.get(n)} for n in names}

    @property
    def stage_kind(self) -> str:
        """``sft`` (also when no stage is said), ``pretraining``, ``preference``, ``rl`` or ``other``."""
        if not self.stage:
            return "sft"
        return STAGE_KINDS.get(self.stage.lower(), "other")

    @property
    def is_lora(self) -> bool | None:
        """True for LoRA or QLoRA, False for full fine-tuning, None when unknown."""
        if self.finetuning is None:
            return None
        return self.finetuning in ("lora", "qlora")

    @property
    def trains_every_message_turn(self) -> bool:
        """True when the loss of a ``messages`` row covers every turn, user turns included: TRL without
        ``assistant_only_loss`` (and not ``gradian train``, whose loss is the final assistant turn).
        """
        return self.trainer == "trl" and not self.assistant_only_loss and self.messages_loss != "final_assistant_turn"

    def effective_batch(self, world_size: int = 1) -> int | None:
        """Sequences per optimiser step: micro batch x grad accumulation x devices."""
        if self.total_batch_size and not (self.micro_batch_size and self.gradient_accumulation_steps):
            return self.total_batch_size
        if self.micro_batch_size is None:
            return None
        return self.micro_batch_size * (self.gradient_accumulation_steps or 1) * world_size

    def set(self, name: str, value: Any, where: str, *, default: bool = False) -> None:
        """Set ``name`` from ``where``; explicit values beat defaults; explicit conflicts are recorded."""
        if value is None:
            return
        cur = getattr(self, name)
        cur_src = self.sources.get(name)
        if cur is None or (cur_src or "").startswith("default") and not default:
            setattr(self, name, value)
            self.sources[name] = where
        elif not default and not same_value(name, cur, value) and not (cur_src or "").startswith("default"):
            self.conflicts.append(f"{name}: {cur!r} ({cur_src}) vs {value!r} ({where}); using the first")

    def to_dict(self) -> dict[str, Any]:
        """JSON view: ``paths``, ``formats``, ``values`` (``{name: {"value", "from"}}``), ``conflicts``, ``notes``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in META_FIELDS:
                continue
            v = getattr(self, f.name)
            if v is not None:
                out[f.name] = {"value": v, "from": self.sources.get(f.name)}
        return {
            "paths": list(self.paths),
            "formats": list(self.formats),
            "values": out,
            "conflicts": list(self.conflicts),
            "notes": list(self.notes),
        }


#: TrainConfig fields that describe where the values came from, not a setting.
META_FIELDS = ("paths", "formats", "sources", "conflicts", "notes", "versions", "version_sources")
