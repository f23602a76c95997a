"""Training configs, normalised into one typed view: :class:`TrainConfig`.

Readers for what a practitioner actually has:

==================  ======================================================================
format              recognised by
==================  ======================================================================
``trl``             TRL ``SFTConfig`` (+ ``ModelConfig`` from a ``trl sft --config`` YAML):
                    ``max_length``, ``max_seq_length``, ``packing``, ``completion_only_loss`` ...
``hf``              HF ``TrainingArguments`` JSON/YAML (``training_args.to_json_string()``)
``axolotl``         axolotl YAML: ``base_model``, ``sequence_len``, ``micro_batch_size``, ``adapter`` ...
``llamafactory``    LLaMA-Factory YAML: ``stage``, ``finetuning_type``, ``cutoff_len``, ``template`` ...
``llamafactory_v1`` LLaMA-Factory v1 YAML: ``model``, ``peft_config``, ``cutoff_len``, ``micro_batch_size`` ...
``torchtune``       torchtune YAML: ``_component_`` entries (``model``, ``tokenizer``, ``dataset``,
                    ``loss`` ...); a dataset builder's own defaults count (``alpaca_dataset``
                    trains on the prompt unless ``train_on_input: false``)
``gradian``         the ``training_config.yaml`` that ``gradian train`` writes (TRL names)
``peft``            PEFT ``adapter_config.json`` (or the adapter folder; its README's
                    "Framework versions" give library versions)
==================  ======================================================================

Every value records where it came from (``"axolotl.yaml: lora_r"``, or
``"default (TRL SFTConfig)"`` when the file left it unset and the trainer's
default applies), so a finding can cite the field. Several configs merge
(e.g. a TRL YAML and the adapter's ``adapter_config.json``): a value set
explicitly beats a default; two different explicit values are kept as the
first and recorded in :attr:`TrainConfig.conflicts`.

The training *stage* is read too (:attr:`TrainConfig.stage`): LLaMA-Factory's
``stage`` (``pt``, ``sft``, ``rm``, ``dpo``, ``kto``), axolotl's ``rl:``, torchtune's
loss and dataset components, TRL's preference and RL fields. Checks whose rule
is for SFT are skipped for other stages, with the reason.

Numbers are coerced (YAML 1.1 reads ``2e-4`` as a string); a value that is
not a number where one is needed is a :class:`GradianUserError` naming the
file and field. A number that is impossible for its field (a negative
learning rate, zero epochs, ``lora_r: 0``) is kept and reported by check C19.
Files are read through :mod:`gradian.safeio` (regular files only, size and
nesting limits). An HF Trainer's ``training_args.bin`` is a pickle: it is read statically
(:mod:`.training_args`: its opcodes parsed, nothing imported or called), never unpickled.

Layout: :mod:`.model` (:class:`TrainConfig`), :mod:`.reader` (file loading, aliases, typed access, format
detection, merging, defaults), :mod:`.hf_args` (the HF TrainingArguments field table TRL, LLaMA-Factory and
axolotl share), and one module per format (``trl``, ``hf``, ``axolotl``, ``llamafactory``, ``llamafactory_v1``,
``torchtune``, ``peft``, ``gradian_train``), each with its keys, field table, defaults and fix-ups in a
``FORMAT``. A new trainer format is one new module defining ``FORMAT``.
"""

from gradian.audit.config.model import META_FIELDS, STAGE_KINDS, TrainConfig
from gradian.audit.config.reader import (
    ALIASES,
    BY_GRADIAN_TRAIN,
    GRADIAN_TRAIN_HEADER,
    Format,
    Reader,
    apply_defaults,
    canonical_key,
    detect_config_format,
    formats,
    load_config,
    merge_into,
    read_config,
    read_mapping,
)

__all__ = [
    "ALIASES",
    "BY_GRADIAN_TRAIN",
    "GRADIAN_TRAIN_HEADER",
    "META_FIELDS",
    "STAGE_KINDS",
    "Format",
    "Reader",
    "TrainConfig",
    "apply_defaults",
    "canonical_key",
    "detect_config_format",
    "formats",
    "load_config",
    "merge_into",
    "read_config",
    "read_mapping",
]
