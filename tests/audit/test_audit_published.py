"""Configs modelled on each framework's published examples (tests/audit/published_configs.py): what the readers
take from them (dataset components' own defaults, training stages, the LLaMA-Factory v1 layout, TRL's
full-fine-tuning default) and what the checks then say."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import published_configs as P  # noqa: E402

from gradian.audit import diagnose, load_config  # noqa: E402
from gradian.audit.checks_config import _model_billions  # noqa: E402
from gradian_testlib import write_jsonl  # noqa: E402


def _cfg(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    p.write_text(P.ALL[name])
    return p


def _skip_reason(res, cid: str) -> str:
    return next(s.reason for s in res.skipped if s.id == cid)


# ---------------------------------------------------------------------- axolotl
def _alpaca_rows(copies: int, variant=lambda s: s) -> list[dict]:
    rows = [
        {
            "id": f"r{k}",
            "instruction": f"Name the capital of country number {k}.",
            "output": f"It is city number {k}, on river {k % 7}.",
        }
        for k in range(60)
    ]
    return rows + [
        {"id": f"dup{k}", "instruction": variant(rows[k]["instruction"]), "output": rows[k]["output"]}
        for k in range(copies)
    ]


def test_axolotl_exact_dedup_is_read_and_d11_does_not_advise_it(tmp_path):
    cfg = _cfg(tmp_path, "axolotl_sft_dedup.yml")
    c = load_config(cfg)
    assert c.dedup_exact is True and c.source("dedup_exact") == "axolotl_sft_dedup.yml: dataset_exact_deduplication"
    exact = write_jsonl(tmp_path / "exact.jsonl", _alpaca_rows(10))
    # byte-identical copies: axolotl drops them, so D11 has nothing to say
    assert "D11" in diagnose(data=exact, configs=[cfg], select=["D11"]).passed
    # ... while without the setting the same data warns and advises it
    (f,) = diagnose(data=exact, select=["D11"]).by_id("D11")
    assert "dataset_exact_deduplication" in f.fix
    # copies that differ in case survive the exact deduplication: still reported, with another fix
    cased = write_jsonl(tmp_path / "cased.jsonl", _alpaca_rows(10, variant=str.upper))
    (f,) = diagnose(data=cased, configs=[cfg], select=["D11"]).by_id("D11")
    assert "survive" in f.message and "dataset_exact_deduplication: true" not in f.fix


def test_axolotl_rl_switches_off_the_sft_rules(tmp_path):
    cfg = _cfg(tmp_path, "axolotl_dpo.yml")
    c = load_config(cfg)
    assert (c.stage, c.stage_kind, c.source("stage")) == ("dpo", "preference", "axolotl_dpo.yml: rl")
    # the example evaluates 4 times an epoch (evals_per_epoch: 4): axolotl's eval_strategy steps
    assert (c.eval_strategy, c.source("eval_strategy")) == ("steps", "axolotl_dpo.yml: evals_per_epoch")
    res = diagnose(configs=[cfg])
    for cid in ("C01", "C08", "C11"):
        assert _skip_reason(res, cid).startswith("not applicable: a dpo run (axolotl_dpo.yml: rl)")
    # the SFT learning-rate ceiling (C02) does not judge it either: C20 does, with the preference ranges
    assert _skip_reason(res, "C02").startswith("not applicable: a dpo run") and "C20" in res.passed
    assert "C05" in res.passed  # the generic rules still run


# ---------------------------------------------------------------------- LLaMA-Factory
def test_llamafactory_dpo_low_lr_is_not_called_too_low(tmp_path):
    cfg = _cfg(tmp_path, "llamafactory_dpo.yaml")
    c = load_config(cfg)
    assert (c.stage, c.learning_rate, c.is_lora) == ("dpo", 5e-6, True)
    res = diagnose(configs=[cfg])
    assert not res.by_id("C01") and "a dpo run" in _skip_reason(res, "C01")


def test_llamafactory_pt_turns_packing_on(tmp_path):
    cfg = _cfg(tmp_path, "llamafactory_pt.yaml")
    c = load_config(cfg)
    assert c.stage_kind == "pretraining" and c.packing is True and "stage" in c.source("packing")
    res = diagnose(configs=[cfg])
    assert "a pt run" in _skip_reason(res, "C08") and "a pt run" in _skip_reason(res, "C12")


def test_llamafactory_v1_is_not_read_as_axolotl(tmp_path):
    cfg = _cfg(tmp_path, "llamafactory_v1_sft.yaml")
    c = load_config(cfg)
    assert c.formats == ["llamafactory_v1"] and c.trainer == "llamafactory"
    assert (c.finetuning, c.lora_r, c.lora_alpha, c.max_length, c.learning_rate, c.max_steps) == (
        "lora",
        16,
        32.0,
        2048,
        1e-4,
        10,
    )
    assert c.source("lora_r") == "llamafactory_v1_sft.yaml: peft_config.r"
    assert c.num_epochs == 3 and c.source("num_epochs") == "default (LLaMA-Factory v1)"
    res = diagnose(configs=[cfg])
    assert any("does not say its stage" in n for n in res.notes)
    assert "C02" in res.passed  # 1e-4 on LoRA is fine (as axolotl, the run was called a full fine-tune at 1e-4)


# ---------------------------------------------------------------------- TRL
def test_trl_cli_config_without_use_peft_is_a_full_fine_tune(tmp_path):
    cfg = _cfg(tmp_path, "trl_cli.yaml")
    c = load_config(cfg)
    assert c.finetuning == "full" and c.source("finetuning").startswith("default (TRL ModelConfig")
    (f,) = diagnose(configs=[cfg], select=["C02"]).by_id("C02")
    assert f.severity == "warning" and "full fine-tuning" in f.message
    # an SFTConfig dump (no model/dataset names) says nothing about LoRA: still unknown
    dump = tmp_path / "sft.json"
    dump.write_text(json.dumps({"output_dir": "out", "learning_rate": 1e-4, "max_length": 512}))
    assert load_config(dump).finetuning is None


# ---------------------------------------------------------------------- torchtune
def test_torchtune_alpaca_dataset_trains_on_the_prompt(tmp_path):
    cfg = _cfg(tmp_path, "torchtune_qwen2_5_1_5b.yaml")
    c = load_config(cfg)
    assert c.train_on_inputs is True and "alpaca_cleaned_dataset" in c.source("train_on_inputs")
    assert not c.is_default("train_on_inputs")
    assert _model_billions(c.base_model) == 1.5
    res = diagnose(configs=[cfg])
    (f,) = res.by_id("C08")
    assert "the loss covers the prompt" in f.message
    (lr,) = res.by_id("C02")
    assert lr.evidence["model_billions"] == 1.5
    # train_on_input: false in the dataset entry beats the builder's default
    off = tmp_path / "off.yaml"
    off.write_text(P.TORCHTUNE_QWEN.replace("  packed: False\n", "  packed: False\n  train_on_input: false\n"))
    assert load_config(off).train_on_inputs is False and not diagnose(configs=[off]).by_id("C08")


def test_torchtune_dpo_loss_is_a_preference_stage(tmp_path):
    cfg = _cfg(tmp_path, "torchtune_dpo.yaml")
    c = load_config(cfg)
    assert c.stage == "dpo" and c.source("stage") == "torchtune_dpo.yaml: loss._component_"
    assert "a dpo run" in _skip_reason(diagnose(configs=[cfg]), "C01")


@pytest.mark.parametrize(
    "name,size",
    [
        ("qwen2_5_1_5b", 1.5),
        ("torchtune.models.qwen2_5.lora_qwen2_5_1_5b_instruct", 1.5),
        ("lora_llama3_2_1b", 1),
        ("llama3_1_8b", 8),
        ("qwen3_0_6b", 0.6),
        ("llama3_2_vision_11b", 11),
        ("Qwen/Qwen2.5-1.5B-Instruct", 1.5),
        ("meta-llama/Meta-Llama-3.1-8B", 8),
        ("mistralai/Mistral-7B-v0.1", 7),
        ("gemma2_27b", 27),
        ("mistralai/Mixtral-8x7B-v0.1", 56),
        ("EleutherAI/pythia-2.8b", 2.8),
        ("HuggingFaceTB/SmolLM2-135M", None),
        ("microsoft/phi-2", None),
    ],
)
def test_model_size_from_name(name, size):
    assert _model_billions(name) == size


# ---------------------------------------------------------------------- gradian train's own file
def test_gradian_train_config_is_read_as_final_turn_masking(tmp_path):
    """gradian train supervises the final assistant turn of a 'messages' row; its training_config.yaml says so,
    and C08 no longer reads it as TRL training every turn (a real TRL config still warns)."""
    from gradian.trainconfig import TrainSpec, write_train_config

    cfg = tmp_path / "training_config.yaml"
    write_train_config(TrainSpec(), cfg, base="HuggingFaceTB/SmolLM2-135M-Instruct")
    msgs = write_jsonl(
        tmp_path / "chat.jsonl",
        [
            {
                "id": f"m{k}",
                "messages": [
                    {"role": "user", "content": f"What is {k} plus {k}?"},
                    {"role": "assistant", "content": f"It is {2 * k}."},
                ],
            }
            for k in range(50)
        ],
    )
    c = load_config(cfg)
    assert c.messages_loss == "final_assistant_turn" and c.trainer == "trl"
    assert "C08" in diagnose(data=msgs, configs=[cfg], select=["C08"]).passed
    trl = tmp_path / "trl.yaml"
    trl.write_text(
        "\n".join(line for line in cfg.read_text().splitlines() if not line.startswith(("messages_loss", "#")))
    )  # the same run written by TRL
    assert diagnose(data=msgs, configs=[trl], select=["C08"]).by_id("C08")


def test_a_training_config_from_an_older_gradian_train_is_recognised_by_its_header(tmp_path):
    """Adapters trained before messages_loss was written still say who wrote them (the header line)."""
    from gradian.trainconfig import TrainSpec, write_train_config

    cfg = tmp_path / "training_config.yaml"
    write_train_config(TrainSpec(), cfg)
    cfg.write_text("\n".join(ln for ln in cfg.read_text().splitlines() if not ln.startswith("messages_loss")) + "\n")
    assert cfg.read_text().startswith("# gradian train:")
    c = load_config(cfg)
    assert c.messages_loss == "final_assistant_turn" and "written by gradian train" in c.source("messages_loss")
    assert c.formats == ["gradian"] and c.trainer == "trl"
