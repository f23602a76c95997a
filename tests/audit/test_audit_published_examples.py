"""What Audit reads and finds on the frameworks' published examples (issue 25, cases 1-8; fixtures and their
sources in published_examples.py).

Each test names the case and what main (before this branch) read or reported where it differed.
"""

from __future__ import annotations

import json
from pathlib import Path

import published_examples as P
import pytest
import yaml

from gradian.audit import diagnose
from gradian.data.preference import preference_rows

PREF_CHECKS = ["D22", "D23", "D24", "D26", "D27"]


def _write(d: Path, name: str, text_or_rows) -> Path:
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text_or_rows, str):
        yaml.safe_load(text_or_rows)  # the fixture is valid YAML
        p.write_text(text_or_rows)
    else:
        p.write_text("".join(json.dumps(r) + "\n" for r in text_or_rows))
    return p


def _values(res) -> dict:
    return {k: v["value"] for k, v in res.config["values"].items()}


# ---------------------------------------------------------------------------------------------- case 1: data
def test_h4_ultrafeedback_rows_take_the_shared_turns_as_prompt(tmp_path):
    """HuggingFaceH4/ultrafeedback_binarized rows (string prompt, whole conversations, a 'messages' copy).
    main: read as axolotl chat rows, the prompt being 'messages' (which holds the chosen answer)."""
    rows = P.h4_ultrafeedback_rows()
    (ex, *_) = preference_rows(rows, tmp_path / "train_prefs.jsonl")
    assert ex.kind == "trl"
    assert ex.prompt == [rows[0]["chosen"][0]] and ex.chosen == [rows[0]["chosen"][1]]
    assert ex.rejected == [rows[0]["rejected"][1]]
    data = _write(tmp_path, "train_prefs.jsonl", rows)
    cfg = _write(tmp_path, "recipes/zephyr-7b-beta/dpo/config_qlora.yaml", P.AH_ZEPHYR_DPO_QLORA)
    res = diagnose(data=data, configs=[cfg], select=PREF_CHECKS)
    assert not res.findings, [f.message for f in res.findings]
    assert "D22" in res.passed and "D26" not in res.passed  # D26 needs >= 20 pairs: 12 here


@pytest.mark.parametrize(
    "rows,kind,config",
    [
        (P.axolotl_dpo_test_rows, "axolotl_chat", P.AX_DPO_LORA_8B),
        (P.argilla_ultrafeedback_rows, "trl", P.AX_ORPO_QLORA),
        (P.lf_dpo_en_demo_rows, "llamafactory_sharegpt", P.LF_QWEN3_LORA_DPO),
    ],
    ids=["axolotl_chat_template_default", "axolotl_chat_template_argilla", "llamafactory_dpo_en_demo"],
)
def test_framework_preference_rows_are_read(tmp_path, rows, kind, config):
    """Each framework's preference dataset shape is read as pairs whose responses are the assistant turn only."""
    rs = rows()
    exs = preference_rows(rs, tmp_path / "pref.jsonl")
    assert {e.kind for e in exs} == {kind}
    assert all("question" in e.prompt_text and e.chosen_text and e.rejected_text for e in exs)
    assert all("question" not in e.chosen_text for e in exs)  # the user turn is not part of the response
    res = diagnose(data=_write(tmp_path, "pref.jsonl", rs), configs=[_write(tmp_path, "c.yaml", config)])
    assert not [f for f in res.findings if f.id in PREF_CHECKS], [f.message for f in res.findings]
    # a broken copy (chosen == rejected) is found in each format
    bad = json.loads(json.dumps(rs))
    bad[3]["rejected"] = bad[3]["chosen"]
    res = diagnose(data=_write(tmp_path, "bad.jsonl", bad), select=["D22"])
    (f,) = res.by_id("D22")
    assert "bad.jsonl:4" in f.message


def test_llamafactory_kto_demo_rows_are_kto(tmp_path):
    """LLaMA-Factory's data/kto_en_demo.json names its tag column 'label' (dataset_info.json: kto_tag=label).
    main: read as SFT 'messages' rows, the undesirable answers counted as training targets."""
    rows = P.lf_kto_en_demo_rows(10, 2)
    exs = preference_rows(rows, tmp_path / "kto.jsonl")
    assert {e.kind for e in exs} == {"llamafactory_kto"} and [e.label for e in exs].count(False) == 2
    cfg = _write(tmp_path, "qwen3_lora_kto.yaml", P.LF_QWEN3_LORA_KTO)
    res = diagnose(data=_write(tmp_path, "kto.jsonl", rows), configs=[cfg], select=["D27"])
    (f,) = res.by_id("D27")
    assert "10 desirable and 2 undesirable" in f.message
    res = diagnose(data=_write(tmp_path, "kto_ok.jsonl", P.lf_kto_en_demo_rows(6, 6)), configs=[cfg], select=["D27"])
    assert "D27" in res.passed


def test_axolotl_kto_desirable_weight_is_read(tmp_path):
    """axolotl examples/llama-3/qlora-1b-kto.yaml sets kto_desirable_weight 0.2. main: D27 assumed weights 1.0."""
    cfg = _write(tmp_path, "qlora-1b-kto.yaml", P.AX_KTO_QLORA_1B)
    assert _values(diagnose(configs=[cfg]))["desirable_weight"] == 0.2
    balanced = _write(tmp_path, "kto.jsonl", P.trl_kto_rows(6, 6))
    (f,) = diagnose(data=balanced, configs=[cfg], select=["D27"]).by_id("D27")
    assert "weighted ratio 0.20" in f.message and "qlora-1b-kto.yaml: kto_desirable_weight" in f.message
    assert f.evidence["desirable_weight"] == 0.2
    skewed = _write(tmp_path, "kto5.jsonl", P.trl_kto_rows(30, 6))  # 5:1 rows, weighted 0.2 x 30 / 6 = 1.0
    assert "D27" in diagnose(data=skewed, configs=[cfg], select=["D27"]).passed
    assert diagnose(data=skewed, select=["D27"]).by_id("D27")  # without the config: weights 1.0, ratio 5


# ---------------------------------------------------------------------------------------------- case 2: stages
STAGES = [  # (fixture, file name, stage, beta, learning_rate, C20 result)
    ("AH_ZEPHYR_DPO_QLORA", "recipes/zephyr-7b-beta/dpo/config_qlora.yaml", "dpo", 0.01, 5e-6, "passed"),
    ("AH_SMOLLM2_DPO_MIXTURE", "recipes/smollm2/dpo/config.yaml", "dpo", 0.5, 1e-6, "passed"),
    ("AH_SMOLLM3_APO", "recipes/smollm3/dpo/apo.yaml", "dpo", 0.05, 1e-6, "passed"),
    ("AH_ZEPHYR_ORPO", "recipes/zephyr-141b-A35b/orpo/config_full.yaml", "orpo", 0.05, 5e-6, "passed"),
    ("AX_DPO_LORA_8B", "examples/llama-3/instruct-dpo-lora-8b.yml", "dpo", None, 2e-4, "passed"),
    ("AX_ORPO_QLORA", "examples/mistral/orpo/mistral-qlora-orpo.yml", "orpo", 0.1, 2e-4, "passed"),
    ("AX_KTO_QLORA_1B", "examples/llama-3/qlora-1b-kto.yaml", "kto", 0.5, 2e-4, "passed"),
    ("LF_QWEN3_LORA_DPO", "examples/train_lora/qwen3_lora_dpo.yaml", "dpo", 0.1, 5e-6, "passed"),
    ("LF_QWEN3_LORA_KTO", "examples/train_lora/qwen3_lora_kto.yaml", "kto", 0.1, 5e-6, "passed"),
    ("TT_LLAMA31_8B_LORA_DPO", "recipes/configs/llama3_1/8B_lora_dpo.yaml", "dpo", 0.1, 5e-4, "passed"),
]


@pytest.mark.parametrize("name,fname,stage,beta,lr,c20", STAGES, ids=[s[0] for s in STAGES])
def test_preference_stage_read_from_the_published_config(tmp_path, name, fname, stage, beta, lr, c20):
    """Stage, beta and learning rate as each framework spells them; the SFT learning-rate rules (C01/C02) are not
    applied. C20 passes every published example: its LoRA DPO/KTO range reaches 5e-4 (axolotl ships 2e-4,
    torchtune 5e-4, the handbook and LLaMA-Factory 5e-6; main warned above 1e-4); ORPO has no reference model and
    gets SFT's range (main: C20 warned on axolotl's LoRA ORPO at 2e-4).
    torchtune's DPOLoss beta: main did not read it."""
    cfg = _write(tmp_path, fname, getattr(P, name))
    res = diagnose(configs=[cfg])
    v = _values(res)
    assert (v["stage"], v.get("beta"), v["learning_rate"]) == (stage, beta, lr)
    assert not res.by_id("C01") and not res.by_id("C02") and "C01" not in res.passed
    if c20 == "passed":
        assert "C20" in res.passed, [f.message for f in res.by_id("C20")]
    else:
        (f,) = res.by_id("C20")
        assert f.severity == "warning" and f"learning_rate={lr:g}" in f.message


def test_orpo_default_learning_rate_without_the_files_own(tmp_path):
    """The zephyr-141b ORPO recipe sets learning_rate 5e-6 (main's fixture had dropped it); without it, ORPOConfig's
    default 1e-6 applies, not SFTConfig's 2e-5."""
    text = "\n".join(x for x in P.AH_ZEPHYR_ORPO.splitlines() if not x.startswith("learning_rate:")) + "\n"
    cfg = _write(tmp_path, "recipes/zephyr-141b-A35b/orpo/config_full.yaml", text)
    v = diagnose(configs=[cfg]).config["values"]
    assert (v["learning_rate"]["value"], v["learning_rate"]["from"]) == (1e-6, "default (TRL ORPOConfig)")


# ---------------------------------------------------------------------------------------------- case 3: template
def test_trl_training_template_from_chat_template_path(tmp_path, world):
    """TRL's own trl/chat_templates/qwen3_training.jinja (a {%- generation %} block) named by chat_template_path
    serves assistant_only_loss; the tokenizer's own template (no block) does not."""
    trl = pytest.importorskip("trl")
    jinja = Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja"
    if not jinja.is_file():
        pytest.skip("this trl has no chat_templates/qwen3_training.jinja")
    cfg = _write(tmp_path, "sft.yaml", P.TRL_SFT_ASSISTANT_ONLY.format(path=jinja))
    res = diagnose(configs=[cfg], tokenizer=world.tok, select=["C09"])
    assert "C09" in res.passed, [f.message for f in res.by_id("C09")]
    assert "qwen3_training.jinja" in res.config["values"]["chat_template_path"]["value"]
    no_path = P.TRL_SFT_ASSISTANT_ONLY.replace("chat_template_path: {path}\n", "")
    res = diagnose(configs=[_write(tmp_path, "sft2.yaml", no_path)], tokenizer=world.tok, select=["C09"])
    assert res.by_id("C09")


def test_handbook_recipe_installs_its_own_template(tmp_path):
    """alignment-handbook recipes carry chat_template: as a literal (zephyr's <|user|>/<|assistant|> template)."""
    cfg = _write(tmp_path, "recipes/zephyr-141b-A35b/orpo/config_full.yaml", P.AH_ZEPHYR_ORPO)
    v = _values(diagnose(configs=[cfg]))
    assert v["chat_template"] == P.AH_ZEPHYR_ORPO_CHAT_TEMPLATE


# ---------------------------------------------------------------------------------------------- case 5: splits
def test_handbook_mixtures_that_train_on_test_splits(tmp_path):
    """The new handbook layout concatenates every mixture entry (src/alignment/data.py get_dataset): the zephyr SFT
    QLoRA recipe trains on ultrachat_200k test_sft and the SmolLM2 DPO recipe on ultrafeedback test_prefs."""
    cfg = _write(tmp_path, "recipes/zephyr-7b-beta/sft/config_qlora.yaml", P.AH_ZEPHYR_SFT_QLORA_MIXTURE)
    (f,) = diagnose(configs=[cfg], select=["C21"]).by_id("C21")
    assert "'test_sft' split of HuggingFaceH4/ultrachat_200k" in f.message
    assert f.evidence["from"] == "config_qlora.yaml: dataset_mixture.datasets[1].split"
    cfg = _write(tmp_path, "recipes/smollm2/dpo/config.yaml", P.AH_SMOLLM2_DPO_MIXTURE)
    (f,) = diagnose(configs=[cfg], select=["C21"]).by_id("C21")
    assert "'test_prefs' split of HuggingFaceH4/ultrafeedback_binarized" in f.message


@pytest.mark.parametrize(
    "name", ["AH_ZEPHYR_DPO_QLORA", "AH_SMOLLM3_APO", "AH_ZEPHYR_ORPO"], ids=["dataset_splits", "apo", "orpo"]
)
def test_handbook_configs_that_do_not(tmp_path, name):
    """The old layout's dataset_splits names train and eval splits (test_prefs evaluates, it is not trained on);
    smollm3's split names hold no test; the ORPO recipe trains on dataset_train_split: train."""
    res = diagnose(configs=[_write(tmp_path, "c.yaml", getattr(P, name))], select=["C21"])
    assert "C21" in res.passed, [f.message for f in res.by_id("C21")]


# ---------------------------------------------------------------------------------------------- case 6: mapping
def test_axolotl_docs_custom_instruct_format(tmp_path):
    """axolotl's documented custom format names 'input' as the instruction field and leaves field_input empty.
    main: the row's 'input' was read both as the instruction and as the input (the prompt doubled)."""
    from gradian.audit.config.axolotl import apply_mapping, custom_mapping
    from gradian.audit.config.reader import load_config

    rows = P.axolotl_custom_rows()
    data = _write(tmp_path, "data.jsonl", rows)
    cfg = _write(tmp_path, "ax.yml", P.AX_CUSTOM_INSTRUCT)
    mapping, where = custom_mapping(load_config([cfg]), str(data))
    assert where == "ax.yml: datasets[0].type" and mapping["field_input"] is None
    assert apply_mapping(rows[:1], mapping) == [{"prompt": "What is 0 times 3?", "completion": "0 times 3 is 0."}]
    res = diagnose(data=data, configs=[cfg], select=["D01", "C08", "D08"])
    assert {"D01", "C08", "D08"} <= set(res.passed), [f.message for f in res.findings]


# ---------------------------------------------------------------------------------------------- case 7: freeze
@pytest.mark.parametrize(
    "name,lr", [("LF_LLAMA3_FREEZE_SFT", 1e-4), ("LF_V1_FREEZE_SFT", 2e-5)], ids=["llama_pro_freeze", "v1_freeze"]
)
def test_llamafactory_freeze_examples(tmp_path, name, lr):
    """finetuning_type: freeze (and v1's peft_config.name: freeze) is freeze tuning, whose LoRA-like range applies:
    no C02 at the example's own learning rate."""
    res = diagnose(configs=[_write(tmp_path, "freeze.yaml", getattr(P, name))], select=["C01", "C02"])
    v = _values(res)
    assert (v["finetuning"], v["learning_rate"]) == ("freeze", lr)
    assert "C02" in res.passed, [f.message for f in res.by_id("C02")]


# ---------------------------------------------------------------------------------------------- case 1: LF columns
def _lf_tree(tmp_path: Path, config: str, files: dict[str, list], info: dict) -> tuple[Path, Path]:
    """A LLaMA-Factory checkout: examples/train_lora/<config>, data/dataset_info.json and data files (JSON lists)."""
    root = tmp_path / "LLaMA-Factory"
    (root / "data").mkdir(parents=True)
    (root / "data" / "dataset_info.json").write_text(json.dumps(info))
    for name, rows in files.items():
        (root / "data" / name).write_text(json.dumps(rows))
    cfg = root / "examples" / "train_lora" / "config.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(config)
    return root, cfg


def test_llamafactory_dataset_info_columns_are_read(tmp_path):
    """The config's dataset entry in data/dataset_info.json renames the columns and sharegpt tags: a custom
    preference set with its own names is read. main: "unknown row format (fields: better, dialog, worse)"."""
    from gradian.errors import GradianUserError

    info = {
        **P.LF_DATASET_INFO,
        "my_prefs": {
            "file_name": "my_prefs.json",
            "ranking": True,
            "formatting": "sharegpt",
            "columns": {"messages": "dialog", "chosen": "better", "rejected": "worse"},
            "tags": {"role_tag": "speaker", "content_tag": "text", "user_tag": "client", "assistant_tag": "agent"},
        },
    }
    rows = [
        {
            "dialog": [{"speaker": "client", "text": f"{q} (question {i})"}],
            "better": {"speaker": "agent", "text": good},
            "worse": {"speaker": "agent", "text": bad},
        }
        for i, (q, good, bad) in enumerate(P.QA)
    ]
    cfg_text = P.LF_QWEN3_LORA_DPO.replace("dataset: dpo_en_demo", "dataset: my_prefs")
    root, cfg = _lf_tree(tmp_path, cfg_text, {"my_prefs.json": rows}, info)
    data = root / "data" / "my_prefs.json"
    res = diagnose(data=data, configs=[cfg], select=["D22"])
    assert "D22" in res.passed, [f.message for f in res.findings]
    assert res.inputs["data"]["formats"] == {"llamafactory_sharegpt": len(rows)}
    bad = json.loads(json.dumps(rows))
    bad[2]["worse"] = bad[2]["better"]
    (root / "data" / "my_prefs.json").write_text(json.dumps(bad))
    (f,) = diagnose(data=data, configs=[cfg], select=["D22"]).by_id("D22")
    assert "my_prefs.json[2]" in f.message
    with pytest.raises(GradianUserError, match="unknown row format"):
        diagnose(data=data, select=["D22"])  # without the config, the names are unknown


def test_llamafactory_kto_demo_through_dataset_info(tmp_path):
    """kto_en_demo through its dataset_info.json entry (messages + kto_tag=label, role/content tags)."""
    rows = P.lf_kto_en_demo_rows(10, 2)
    root, cfg = _lf_tree(tmp_path, P.LF_QWEN3_LORA_KTO, {"kto_en_demo.json": rows}, P.LF_DATASET_INFO)
    res = diagnose(data=root / "data" / "kto_en_demo.json", configs=[cfg], select=["D27"])
    assert res.inputs["data"]["formats"] == {"llamafactory_kto": 12}
    (f,) = res.by_id("D27")
    assert "10 desirable and 2 undesirable" in f.message


# ---------------------------------------------------------------------------------------------- case 1: axolotl fields
def test_axolotl_preference_field_names_are_read(tmp_path):
    """axolotl's user_defined.default mapping and chat_template.default's field_messages/field_chosen/field_rejected
    name the row fields. main: rows under other names were refused ("unknown row format")."""
    from gradian.errors import GradianUserError

    rows = [
        {"sys": "Be brief.", "question_text": f"{q} (question {i})", "good": good, "bad": bad}
        for i, (q, good, bad) in enumerate(P.QA)
    ]
    cfg = P.AX_USER_DEFINED_DPO
    for k, v in (("prompt", "question_text"), ("system", "sys"), ("chosen", "good"), ("rejected", "bad")):
        cfg = cfg.replace(f'field_{k}: "{k}"', f'field_{k}: "{v}"')
    data = _write(tmp_path, "prefs.jsonl", rows)
    res = diagnose(data=data, configs=[_write(tmp_path, "dpo.yml", cfg)], select=["D22", "D23"])
    assert res.inputs["data"]["formats"] == {"trl": len(rows)} and {"D22", "D23"} <= set(res.passed)
    with pytest.raises(GradianUserError, match="unknown row format"):
        diagnose(data=data, select=["D22"])
    # the docs' own mapping (default names) reads default-named rows as before
    plain = [
        {"system": r["sys"], "prompt": r["question_text"], "chosen": r["good"], "rejected": r["bad"]} for r in rows
    ]
    res = diagnose(data=_write(tmp_path, "p2.jsonl", plain), configs=[_write(tmp_path, "d.yml", P.AX_USER_DEFINED_DPO)])
    assert res.inputs["data"]["formats"] == {"trl": len(rows)}
    # chat_template.default with its own field names
    chat = [
        {"dialog": r["conversation"], "preferred": r["chosen"], "dispreferred": r["rejected"]}
        for r in P.axolotl_dpo_test_rows()
    ]
    ax = (
        P.AX_DPO_LORA_8B.replace("field_messages: conversation", "field_messages: dialog")
        .replace("field_chosen: chosen", "field_chosen: preferred")
        .replace("field_rejected: rejected", "field_rejected: dispreferred")
    )
    res = diagnose(data=_write(tmp_path, "chat.jsonl", chat), configs=[_write(tmp_path, "ax.yml", ax)], select=["D22"])
    assert res.inputs["data"]["formats"] == {"axolotl_chat": len(chat)} and "D22" in res.passed
