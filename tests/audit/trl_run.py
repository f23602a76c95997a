"""A real TRL SFTTrainer output folder, built in-test (tiny Llama from config, trained tokenizer).

``build_trl_run(root)`` runs TRL's ``SFTTrainer`` for two epochs (``save_strategy="epoch"``) with a LoRA
adapter, ``assistant_only_loss=True`` and ``chat_template_path`` pointing at a ``.jinja`` file whose
``{% generation %}`` block holds ``<|im_end|>``. The folder is whatever TRL writes:
``OUT/adapter_model.safetensors``, ``OUT/adapter_config.json``, ``OUT/chat_template.jinja``, ``OUT/training_args.bin``
(the ``SFTConfig``, pickled) and the tokenizer files at the top, ``OUT/checkpoint-N/`` (``trainer_state.json`` ...)
per epoch; no ``trainer_state.json`` at the top (``Trainer.save_model`` does not write one).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

#: ChatML with a {% generation %} block that covers the end-of-turn token and the newline after it (as TRL's
#: own training templates do, e.g. qwen3_training.jinja), and a default system turn when the row has none (as
#: Qwen2.5's template does): it renders rows differently from the base tokenizer's template, so a test can tell
#: which of the two the gradients used
DEFAULT_SYSTEM = "You are a helpful assistant."
TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>\\n' }}{% endgeneration %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_trl_run(root: Path, tok, record: list | None = None, **over) -> dict:
    """Train for 2 epochs with TRL and return the paths a user has: base, output, data, eval, template, config
    (and ``tok``, the base tokenizer object; ``args_dict``, TRL's own ``args.to_dict()`` as JSON). ``over`` changes
    ``SFTConfig`` fields; a value None leaves the field at TRL's default (e.g. ``assistant_only_loss=None,
    max_length=None``: a run with TRL's own defaults). ``record``: gets, per forward pass of the training, the
    indices of the rows in its batch (a forward pre-hook reads the ``(i)`` each row's question ends with)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from gradian.models.tiny import tiny_model

    torch.manual_seed(0)
    root.mkdir(parents=True, exist_ok=True)
    base_dir, out = root / "base", root / "out"
    model = tiny_model(tok, "llama", seed=0)
    model.save_pretrained(base_dir)
    tok.save_pretrained(base_dir)
    tpl = root / "chatml.jinja"
    tpl.write_text(TEMPLATE)
    rows = [
        {
            "id": f"r{i}",
            "messages": [
                {"role": "user", "content": f"What is the capital of France? ({i})"},
                {"role": "assistant", "content": "The capital of France is Paris."},
            ],
        }
        for i in range(8)
    ]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = root / "eval.jsonl"
    ev.write_text(
        json.dumps(
            {
                "id": "e0",
                "prompt": "What is the capital of France? (0)",
                "answer": "Paris",
                "metric": "contains",
                "capability": "geo",
            }
        )
        + "\n"
    )
    args = dict(
        output_dir=str(out),
        num_train_epochs=2,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="epoch",
        report_to=[],
        assistant_only_loss=True,
        chat_template_path=str(tpl),
        max_length=128,
        use_cpu=True,
        seed=0,
    )
    args = {k: v for k, v in {**args, **over}.items() if v is not None}
    cfg = root / "sft_config.json"
    cfg.write_text(json.dumps(args))
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**args),
        train_dataset=Dataset.from_list([{"messages": r["messages"]} for r in rows]),
        processing_class=copy.deepcopy(tok),  # TRL sets chat_template_path's template on it: the fixture stays as is
        peft_config=LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM"
        ),
    )
    if record is not None:
        import re

        def hook(_module, _args, kwargs):  # the rows of each micro-batch the model trains on
            texts = tok.batch_decode(kwargs["input_ids"])
            record.append([int(re.search(r"France\? \((\d+)\)", t).group(1)) for t in texts])

        trainer.model.register_forward_pre_hook(hook, with_kwargs=True)
    trainer.train()
    trainer.save_model(str(out))
    # what TRL itself says its arguments are (enums as values, *_token fields hidden): what a static read of the
    # training_args.bin it saved must give, without unpickling it
    args_dict = root / "args_to_dict.json"
    args_dict.write_text(json.dumps(trainer.args.to_dict(), default=str))
    return {
        "base": base_dir,
        "out": out,
        "data": data,
        "eval": ev,
        "template": tpl,
        "config": cfg,
        "tok": tok,
        "args_dict": args_dict,
    }
