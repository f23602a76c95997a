"""Run axolotl, LLaMA-Factory or torchtune on their own configs, as their training commands prepare data.

Not a test module: ``tests/data/test_frameworks_real.py`` runs it in a subprocess whose ``PYTHONPATH`` holds one
framework's installed package (``make frameworks``: ``.venv/frameworks/<name>``), so the framework and the pins it
needs (LLaMA-Factory's older TRL) never enter the test process.

    python framework_run.py CASES.json OUT.json

``CASES.json`` is a list of ``{"name", "framework", "config": path, "save_tokenizer": folder or null, "train":
bool, "quant_out": path or null}``. For each case the framework reads its own config file and prepares its training
set the way its training command does (``train``: LLaMA-Factory then trains, ``llamafactory.train.tuner.run_exp``,
and torchtune runs its ``lora_finetune_single_device`` recipe as ``tune run`` does, each leaving its output folder;
``quant_out``: axolotl or LLaMA-Factory writes there the 4-bit config its model loader builds):

* **axolotl 0.19.0**: ``axolotl.cli.config.load_cfg`` (config validation and normalisation) and
  ``axolotl.common.datasets.load_datasets`` (``prepare_datasets``: loading, the prompt strategy, dropping rows out of
  ``sequence_len``); the tokenizer as ``axolotl.loaders.load_tokenizer`` leaves it (its ``chat_template`` set from
  the config) is what axolotl's trainer saves beside the adapter.
* **LLaMA-Factory 0.9.5**: ``llamafactory.hparams.get_train_args`` on the YAML's mapping, ``load_tokenizer``,
  ``get_template_and_fix_tokenizer`` and ``get_dataset(stage="sft")``, as ``llamafactory-cli train`` (``run_sft``);
  the fixed tokenizer is the one its trainer saves.
* **torchtune 0.6.1**: ``torchtune.config.instantiate`` of the recipe's ``tokenizer`` and ``dataset`` sections, as
  its LoRA recipes' ``_setup_data``; a sample's ``tokens`` / ``labels``.

* **axolotl 0.19.0's and LLaMA-Factory 0.9.5's trainers** (``"framework": "axolotl-packed"`` /
  ``"llamafactory-packed"``, ``packed_out``: a folder): their packed batches and each one's gradient,
  :func:`axolotl_packed`, :func:`llamafactory_packed` (tests/data/test_framework_packing.py; ``make frameworks``
  puts axolotl's trainer's own pins in ``.venv/frameworks/axolotl-train``).
* **torchtune 0.6.1's LoRA recipe** on a ``packed: true`` dataset (``"framework": "torchtune-packed"``): its packed
  batches and each step's gradient, :func:`torchtune_packed` (tests/data/test_framework_packing.py); and unpacked
  (``"torchtune-steps"``): the rows each optimizer step took, :func:`torchtune_steps`
  (tests/data/test_framework_visits.py); LLaMA-Factory's trainer likewise (``"llamafactory-steps"``,
  :func:`llamafactory_steps`).

``OUT.json``: ``{name: {"rows": [[input_ids, labels], ...]}}`` in the framework's order, or ``{"error": text}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _ints(xs) -> list[int]:
    return [int(x) for x in xs]


def axolotl(case: dict) -> list:
    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets
    from axolotl.loaders import load_tokenizer

    cfg = load_cfg(case["config"])
    if case.get("save_tokenizer"):
        load_tokenizer(cfg).save_pretrained(case["save_tokenizer"])
    ds = load_datasets(cfg=cfg).train_dataset
    if case.get("quant_out"):  # the BitsAndBytesConfig its model loader builds (loaders/model.py)
        from axolotl.loaders.model import ModelLoader

        loader = ModelLoader(cfg, load_tokenizer(cfg))
        loader._set_quantization_config()
        _write_quant(case["quant_out"], loader.model_kwargs["quantization_config"], cfg.torch_dtype)
    return [[_ints(r["input_ids"]), _ints(r["labels"])] for r in ds]


def _draw_lora_b(model) -> None:
    """Every LoRA B (PEFT's ``lora_B``, torchtune's ``lora_b``) drawn from N(0, 0.05²), seed 0, as a trained
    adapter's: at the zero B both start from, every A gradient is zero."""
    import torch

    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_b" in name.lower():
                p.normal_(std=0.05)


def _lora_recipe():
    """The path of torchtune's ``lora_finetune_single_device`` recipe, which ``tune run`` runs."""
    from pathlib import Path

    import torchtune

    return Path(torchtune.__file__).parents[1] / "recipes" / "lora_finetune_single_device.py"


def _packed_steps(trainer, model, out) -> None:
    """For each batch of a trainer's train dataloader, one ``training_step`` (its ``compute_loss`` and backward, as
    its training loop runs it), writing the batch (``batches.json``) and the LoRA gradients
    (``grad_<step>.safetensors``) into ``out``, beside the adapter they were taken at. Before the first step
    ``lora_B`` is drawn from N(0, 0.05²) (seed 0), as a trained adapter's: at PEFT's zero ``lora_B`` every ``lora_A``
    gradient is zero. No optimizer step is taken.
    """
    import torch
    from safetensors.torch import save_file

    _draw_lora_b(model)
    model.save_pretrained(out)
    trainer.current_gradient_accumulation_steps = 1  # Trainer's loop sets it; the loop is not run
    batches, it = [], iter(trainer.get_train_dataloader())
    while True:
        samples, n_items = trainer.get_batch_samples(it, 1, torch.device("cpu"))
        if not samples:
            break
        model.zero_grad()
        trainer.training_step(model, samples[0], n_items)
        grads = {n: p.grad.detach().contiguous() for n, p in model.named_parameters() if p.grad is not None}
        save_file(grads, os.path.join(out, f"grad_{len(batches)}.safetensors"))
        keep = ("input_ids", "labels", "position_ids")  # LLaMA-Factory's 4D mask is not needed to compare
        batches.append({k: v.tolist() for k, v in samples[0].items() if k in keep})
    with open(os.path.join(out, "batches.json"), "w") as f:
        json.dump(batches, f)


def axolotl_packed(case: dict) -> list:
    """axolotl's own trainer on a ``sample_packing`` config: ``axolotl.train.setup_model_and_trainer`` (its model
    loader and patches, its multipack sampler and collator), then :func:`_packed_steps` into ``case["packed_out"]``.
    """
    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets
    from axolotl.train import setup_model_and_trainer

    cfg = load_cfg(case["config"])
    meta = load_datasets(cfg=cfg)
    trainer, model, *_ = setup_model_and_trainer(cfg, meta)
    _packed_steps(trainer, model, case["packed_out"])
    return [[_ints(r["input_ids"]), _ints(r["labels"])] for r in meta.train_dataset]


def _record_steps(trainer, model) -> list:
    """Watch ``trainer``'s training: a forward pre-hook records the padded rows of every micro-batch the model trains
    on, and a callback groups them by the optimizer step that took them. Returns the list of steps it fills."""
    from transformers import TrainerCallback

    pending: list = []
    steps: list = []

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(list(pending))
            pending.clear()

    def record(_module, _args, kwargs):
        if model.training:
            pending.extend(kwargs["input_ids"].tolist())

    trainer.add_callback(Steps())
    model.register_forward_pre_hook(record, with_kwargs=True)
    return steps


def _train_and_record(trainer, model, rows: list, pad: int, out: str) -> None:
    """Train (``train()``, ``save_model()``, ``save_state()``: the run folder a user has), watched by
    :func:`_record_steps`, and write ``{"rows": the train set's input_ids in order, "pad", "steps"}`` to ``out``."""
    steps = _record_steps(trainer, model)
    trainer.train()
    trainer.save_model()
    trainer.save_state()
    with open(out, "w") as f:
        json.dump({"rows": rows, "pad": int(pad), "steps": steps}, f)


def axolotl_steps(case: dict) -> list:
    """axolotl 0.19's own trainer on an unpacked config (``axolotl.train.setup_model_and_trainer``: its dataset
    preparation, model loader, sampler and collator), trained and watched (:func:`_train_and_record`, into
    ``case["steps_out"]``); tests/data/test_framework_visits.py."""
    from axolotl.cli.config import load_cfg
    from axolotl.common.datasets import load_datasets
    from axolotl.train import setup_model_and_trainer

    cfg = load_cfg(case["config"])
    meta = load_datasets(cfg=cfg)
    trainer, model, tok, *_ = setup_model_and_trainer(cfg, meta)
    rows = [_ints(r["input_ids"]) for r in meta.train_dataset]
    _train_and_record(trainer, trainer.model, rows, tok.pad_token_id, case["steps_out"])
    return rows


def _llamafactory_trainer(case: dict, callbacks=None):
    """LLaMA-Factory's own SFT trainer for ``case["config"]``, built as its ``run_sft`` builds it
    (``train/sft/workflow.py``: its dataset, ``load_model``, ``SFTDataCollatorWith4DAttentionMask``,
    ``CustomSeq2SeqTrainer``): ``(trainer, model, its train dataset, its tokenizer)``."""
    import yaml
    from llamafactory.data import SFTDataCollatorWith4DAttentionMask, get_dataset, get_template_and_fix_tokenizer
    from llamafactory.extras.constants import IGNORE_INDEX
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer
    from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer

    with open(case["config"]) as f:
        raw = yaml.safe_load(f)
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(raw)
    tm = load_tokenizer(model_args)
    tok = tm["tokenizer"]
    template = get_template_and_fix_tokenizer(tok, data_args)
    dm = get_dataset(template, model_args, data_args, training_args, stage="sft", **tm)
    model = load_model(tok, model_args, finetuning_args, training_args.do_train)
    collator = SFTDataCollatorWith4DAttentionMask(
        template=template,
        model=model,
        pad_to_multiple_of=8,
        label_pad_token_id=IGNORE_INDEX if data_args.ignore_pad_token_for_loss else tok.pad_token_id,
        block_diag_attn=model_args.block_diag_attn,
        neat_packing=data_args.neat_packing,
        attn_implementation=getattr(model.config, "_attn_implementation", None),
        compute_dtype=model_args.compute_dtype,
        **tm,
    )
    trainer = CustomSeq2SeqTrainer(
        model=model, args=training_args, finetuning_args=finetuning_args, data_collator=collator, gen_kwargs={},
        callbacks=callbacks, **dm, **tm,
    )  # fmt: skip
    return trainer, model, dm["train_dataset"], tok


def llamafactory_packed(case: dict) -> list:
    """LLaMA-Factory's own trainer on a ``packing`` / ``neat_packing`` config (:func:`_llamafactory_trainer`), then
    :func:`_packed_steps` into ``case["packed_out"]``.
    """
    trainer, model, _, _ = _llamafactory_trainer(case)
    _packed_steps(trainer, model, case["packed_out"])
    return []


def llamafactory_steps(case: dict) -> list:
    """LLaMA-Factory's own trainer on an unpacked SFT config (:func:`_llamafactory_trainer`), trained and watched
    (:func:`_train_and_record`, into ``case["steps_out"]``; tests/data/test_framework_visits.py).
    """
    trainer, model, train, tok = _llamafactory_trainer(case)
    _train_and_record(trainer, model, [_ints(r["input_ids"]) for r in train], tok.pad_token_id, case["steps_out"])
    return []


def _write_quant(path: str, q, load_dtype) -> None:
    """A BitsAndBytesConfig's 4-bit scheme and the dtype the base is loaded in, as JSON."""
    with open(path, "w") as f:
        json.dump(
            {
                "quant_type": q.bnb_4bit_quant_type,
                "double_quant": q.bnb_4bit_use_double_quant,
                "load_dtype": str(load_dtype).split(".")[-1],
            },
            f,
        )


def llamafactory(case: dict) -> list:
    import yaml
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    with open(case["config"]) as f:
        raw = yaml.safe_load(f)
    model_args, data_args, training_args, _, _ = get_train_args(raw)
    tm = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tm["tokenizer"], data_args)
    if case.get("save_tokenizer"):
        tm["tokenizer"].save_pretrained(case["save_tokenizer"])
    ds = get_dataset(template, model_args, data_args, training_args, stage="sft", **tm)["train_dataset"]
    rows = [[_ints(r["input_ids"]), _ints(r["labels"])] for r in ds]
    if case.get("quant_out"):  # the BitsAndBytesConfig its model loader builds (model_utils/quantization.py)
        from llamafactory.model.model_utils.quantization import configure_quantization
        from transformers import AutoConfig

        kw: dict = {}
        configure_quantization(
            AutoConfig.from_pretrained(model_args.model_name_or_path), tm["tokenizer"], model_args, True, kw
        )
        _write_quant(case["quant_out"], kw["quantization_config"], model_args.compute_dtype)
    if case.get("train"):  # llamafactory-cli train: its output folder as a user's run leaves it
        from llamafactory.train.tuner import run_exp

        run_exp(raw)
    return rows


def torchtune(case: dict) -> list:
    from omegaconf import OmegaConf
    from torchtune import config

    cfg = OmegaConf.load(case["config"])
    tok = config.instantiate(cfg.tokenizer)
    ds = config.instantiate(cfg.dataset, tok)
    rows = [[_ints(s["tokens"]), _ints(s["labels"])] for s in ds]
    if case.get("train"):  # tune run lora_finetune_single_device --config CONFIG: its output folder
        import runpy

        recipe = str(_lora_recipe())
        argv, sys.argv = sys.argv, [recipe, "--config", case["config"]]
        try:
            runpy.run_path(recipe, run_name="__main__")
        except SystemExit as e:  # the recipe ends with sys.exit(recipe_main())
            if e.code not in (None, 0):
                raise RuntimeError(f"the recipe exited with {e.code}") from None
        finally:
            sys.argv = argv
    return rows


def torchtune_packed(case: dict) -> list:
    """torchtune's own LoRA recipe (``lora_finetune_single_device``) on a config whose dataset is ``packed: true``:
    its ``setup`` (model, ``PackedDataset``, ``padded_collate_packed``) and its ``train`` loop, with two things
    changed: ``lora_b`` is drawn from N(0, 0.05²) (seed 0) after setup, and the optimizer's ``step`` records each
    step's gradients instead of stepping, so every batch is taken at the adapter the recipe saves at the epoch's end
    (``epoch_0/``). Each batch (before ``_loss_step`` pops its labels) goes to ``batches.json`` as ``input_ids``,
    ``position_ids`` (its ``input_pos``) and ``labels``; each step's gradients (already scaled by the recipe's
    ``1 / num_tokens``) go to ``grad_<step>.safetensors``, named and laid out as the checkpointer writes the
    adapter (``tune_to_peft_adapter_weights``), in ``case["packed_out"]`` (the config's ``output_dir``).
    """
    import runpy

    from omegaconf import OmegaConf
    from safetensors.torch import save_file
    from torchtune.models.convert_weights import tune_to_peft_adapter_weights

    cls = runpy.run_path(str(_lora_recipe()), run_name="recipe")["LoRAFinetuneRecipeSingleDevice"]
    cfg = OmegaConf.load(case["config"])
    assert cfg.gradient_accumulation_steps == 1, "one batch per step: grad_<step> is the batch's gradient"
    recipe = cls(cfg=cfg)
    recipe.setup(cfg=cfg)
    _draw_lora_b(recipe._model)
    hf = recipe._checkpointer._config
    out, batches, loss_step = case["packed_out"], [], recipe._loss_step

    def record_batch(batch):
        keys = {"tokens": "input_ids", "input_pos": "position_ids", "labels": "labels"}
        batches.append({ours: batch[theirs].tolist() for theirs, ours in keys.items()})
        return loss_step(batch)

    def record_step(*args, **kwargs):  # in place of the optimizer's step: the weights stay where they were
        grads = {n: p.grad.detach().clone() for n, p in recipe._model.named_parameters() if p.grad is not None}
        grads = tune_to_peft_adapter_weights(
            grads, num_heads=hf["num_attention_heads"], num_kv_heads=hf["num_key_value_heads"],
            dim=hf["hidden_size"], head_dim=hf.get("head_dim", None),
        )  # fmt: skip
        save_file(
            {k: v.contiguous() for k, v in grads.items()}, os.path.join(out, f"grad_{len(batches) - 1}.safetensors")
        )

    recipe._loss_step, recipe._optimizer.step = record_batch, record_step
    recipe.train()
    recipe.cleanup()
    with open(os.path.join(out, "batches.json"), "w") as f:
        json.dump(batches, f)
    return []


def torchtune_steps(case: dict) -> list:
    """torchtune's own LoRA recipe (``lora_finetune_single_device``), its ``setup`` and ``train`` loop unchanged but
    watched: the padded token rows of every micro-batch ``_loss_step`` trains on, grouped by the optimizer step that
    took them (recorded as ``step`` is called, before it runs), the number of steps taken when each epoch's
    checkpoint is saved, and the micro-batches left unstepped at the end; written to ``case["steps_out"]`` as
    ``{"rows": the dataset's tokens in its order, "pad": the pad id, "steps", "saves", "left"}``
    (tests/data/test_framework_visits.py).
    """
    import runpy

    from omegaconf import OmegaConf

    cls = runpy.run_path(str(_lora_recipe()), run_name="recipe")["LoRAFinetuneRecipeSingleDevice"]
    cfg = OmegaConf.load(case["config"])
    recipe = cls(cfg=cfg)
    recipe.setup(cfg=cfg)
    pending: list = []
    steps: list = []
    saves: list = []
    loss_step, step, save = recipe._loss_step, recipe._optimizer.step, recipe.save_checkpoint

    def record_batch(batch):
        pending.extend(batch["tokens"].tolist())
        return loss_step(batch)

    def record_step(*args, **kwargs):
        steps.append(list(pending))
        pending.clear()
        return step(*args, **kwargs)

    def record_save(epoch):
        saves.append(len(steps))
        return save(epoch=epoch)

    recipe._loss_step, recipe._optimizer.step, recipe.save_checkpoint = record_batch, record_step, record_save
    recipe.train()
    recipe.cleanup()
    rows = [_ints(s["tokens"]) for s in recipe._dataloader.dataset]
    with open(case["steps_out"], "w") as f:
        json.dump({"rows": rows, "pad": int(recipe._tokenizer.pad_id), "steps": steps, "saves": saves,
                   "left": pending}, f)  # fmt: skip
    return []


RUNNERS = {
    "axolotl": axolotl,
    "axolotl-packed": axolotl_packed,
    "axolotl-steps": axolotl_steps,
    "llamafactory": llamafactory,
    "llamafactory-packed": llamafactory_packed,
    "torchtune": torchtune,
    "torchtune-packed": torchtune_packed,
    "torchtune-steps": torchtune_steps,
    "llamafactory-steps": llamafactory_steps,
}


def main(cases_path: str, out_path: str) -> None:
    with open(cases_path) as f:
        cases = json.load(f)
    out = {}
    for case in cases:
        try:
            out[case["name"]] = {"rows": RUNNERS[case["framework"]](case)}
        except Exception:  # the test reports the framework's own error for the case
            out[case["name"]] = {"error": traceback.format_exc(limit=-3)}
    with open(out_path, "w") as f:
        json.dump(out, f)
    sys.stdout.flush()
    os._exit(0)  # axolotl leaves worker processes and a telemetry thread that can hold a normal exit


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
