"""A TRL ``SFTTrainer`` run on two CPU processes (``torchrun --nproc-per-node 2``, gloo), for
tests/attribute/test_visits.py: the run folder a two-device user has, whose ``trainer_state.json`` tells Gradian how
many devices read the rows. Each process writes the padded rows of every micro-batch it trained on to
``ROOT/seen-<rank>.json``.

    python -m torch.distributed.run --standalone --nproc-per-node=2 trl_ddp_run.py ROOT

``ROOT`` holds ``base/`` (a tiny model and its tokenizer) and ``train.jsonl`` (chat rows); the run goes to
``ROOT/out``. Not a test module.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if __name__ == "__main__":
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    root = Path(sys.argv[1])
    rows = [json.loads(x) for x in (root / "train.jsonl").read_text().splitlines() if x.strip()]
    tok = AutoTokenizer.from_pretrained(root / "base")
    args = SFTConfig(
        output_dir=str(root / "out"), per_device_train_batch_size=2, max_steps=5, save_strategy="steps", save_steps=2,
        report_to=[], use_cpu=True, seed=0, logging_steps=1, learning_rate=1e-3, dataset_num_proc=None,
    )  # fmt: skip
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(root / "base"),
        args=args,
        train_dataset=Dataset.from_list([{"messages": r["messages"]} for r in rows]),
        processing_class=tok,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    seen: list[list[int]] = []  # the padded rows of every micro-batch this process trained on

    def record(_module, _args, kwargs):
        if trainer.model.training:
            seen.append(kwargs["input_ids"].tolist())

    trainer.model.register_forward_pre_hook(record, with_kwargs=True)
    trainer.train()
    trainer.save_model(str(root / "out"))
    (root / f"seen-{trainer.args.process_index}.json").write_text(json.dumps(seen))
