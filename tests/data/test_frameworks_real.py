"""axolotl 0.19.0, LLaMA-Factory 0.9.5 and torchtune 0.6.1 themselves, on their own config files, against Gradian.

Each framework runs in a subprocess (tests/data/framework_run.py) with its installed package on ``PYTHONPATH``
(``make frameworks``: ``.venv/frameworks/<name>``): its own config reader and data preparation produce the rows it
trains on, ``(input_ids, labels)``. Gradian reads the same config file, the same training file and the tokenizer the
framework saves beside its adapter (axolotl and LLaMA-Factory), as ``gradian attribute --config ... --adapter ...``
does, and tokenises. A row is equal when its input_ids are equal and its targets agree after the first position; a
row the framework dropped (axolotl: longer than ``sequence_len``) is equal when Gradian's has no supervised token.

Each case states how many rows are equal and what the setup lists as not reproduced, so a row that differs is never
silent: where Gradian does not reproduce the framework's rule, ``unreproduced`` says so and the notes name it.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from framework_parity import FACTS, rows

from gradian.data.formats import load_examples
from gradian.data.setup import setup_from_files
from gradian.data.tokenize import IGNORE_INDEX, tokenize_example

FW = Path(__file__).resolve().parents[2] / ".venv" / "frameworks"
RUNNER = Path(__file__).with_name("framework_run.py")
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
PHI_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
#: the special tokens torchtune 0.6.1's Llama3Tokenizer looks up (models/llama3/_tokenizer.py)
LLAMA3_TT_TOKENS = LLAMA3_TOKENS + [
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|image|>",
]


def alpaca() -> list[dict]:
    return [
        {
            "id": f"a{i}",
            "instruction": f"Name the capital of {c}.",
            "input": "Answer briefly." if i % 2 else "",
            "output": f"It is {k}.",
        }
        for i, (c, k) in enumerate(FACTS)
    ]


def sharegpt() -> list[dict]:
    """LLaMA-Factory's default sharegpt rows: ``conversations`` of ``{"from": "human" / "gpt", "value"}``."""
    names = {"user": "human", "assistant": "gpt"}
    return [
        {"id": r["id"], "conversations": [{"from": names[m["role"]], "value": m["content"]} for m in r["messages"]]}
        for r in rows(2, system=False)
    ]


def text() -> list[dict]:
    return [{"id": f"t{i}", "text": f"The capital of {c} is {k}."} for i, (c, k) in enumerate(FACTS)]


DATA = {
    "chat": rows(2),
    "chat_nosys": rows(1, system=False),
    "alpaca": alpaca(),
    "sharegpt": sharegpt(),
    "text": text(),
}


def ax(name, data, extra=None, ds=None, kind="chat_template", equal=4, unrep=(), cut=False):
    """An axolotl case: its config's keys; ``cut``: ``sequence_len`` cuts or drops every row."""
    return dict(
        name=name,
        framework="axolotl",
        data=data,
        extra=extra or {},
        ds=ds or {},
        kind=kind,
        equal=equal,
        unrep=unrep,
        base="base",
        cut=cut,
    )


def lf(name, data, extra=None, equal=4, unrep=(), base="base"):
    return dict(name=name, framework="llamafactory", data=data, extra=extra or {}, equal=equal, unrep=unrep, base=base)


def tt(name, data, tok=None, equal=4, unrep=(), cut=False, family="qwen2", ds=None):
    """A torchtune case; ``cut``: ``max_seq_len`` cuts every row before its answer (no supervised token left);
    ``family``: its tokenizer builder (``qwen2``: vocab.json / merges.txt; ``llama3``: a tiktoken file)."""
    base = "base" if family == "qwen2" else "base_llama3_tt"
    return dict(
        name=name,
        framework="torchtune",
        data=data,
        tok=tok or {},
        equal=equal,
        unrep=unrep,
        base=base,
        cut=cut,
        family=family,
        ds=ds or {},
    )


CASES = [
    ax("axolotl defaults", "chat"),
    ax("axolotl rows without a system turn", "chat_nosys"),
    ax("axolotl chat_template: chatml (its own)", "chat", {"chat_template": "chatml"}),
    ax("axolotl train_on_inputs", "chat", {"train_on_inputs": True}),
    ax("axolotl train_on_eos none", "chat", ds={"train_on_eos": "none"}),
    ax("axolotl roles_to_train [assistant, user]", "chat", ds={"roles_to_train": ["assistant", "user"]}),
    ax("axolotl type alpaca", "alpaca", kind="alpaca"),
    ax("axolotl type completion (text rows)", "text", kind="completion"),
    ax("axolotl type alpaca, train_on_inputs", "alpaca", {"train_on_inputs": True}, kind="alpaca"),
    ax("axolotl sequence_len 40 (every row dropped)", "chat", {"sequence_len": 40}, unrep=(), cut=True),
    ax(
        "axolotl sequence_len 40, excess_length_strategy truncate",
        "chat",
        {"sequence_len": 40, "excess_length_strategy": "truncate"},
        unrep=(),
        cut=True,
    ),
    lf("LLaMA-Factory qwen (defaults)", "chat"),
    lf("LLaMA-Factory qwen, rows without a system turn", "chat_nosys"),
    lf("LLaMA-Factory qwen, alpaca rows", "alpaca"),
    lf("LLaMA-Factory sharegpt conversations (its default columns and tags)", "sharegpt"),
    lf("LLaMA-Factory mask_history", "chat", {"mask_history": True}),
    lf("LLaMA-Factory train_on_prompt", "chat", {"train_on_prompt": True}),
    lf("LLaMA-Factory cutoff_len 40", "chat", {"cutoff_len": 40}),
    lf("LLaMA-Factory cutoff_len 30, mask_history", "chat", {"cutoff_len": 30, "mask_history": True}),
    lf("LLaMA-Factory template chatml", "chat_nosys", {"template": "chatml"}),
    lf("LLaMA-Factory template smollm2", "chat_nosys", {"template": "smollm2"}),
    lf("LLaMA-Factory template default", "chat", {"template": "default"}),
    lf("LLaMA-Factory template alpaca", "alpaca", {"template": "alpaca"}),
    lf("LLaMA-Factory template vicuna", "chat_nosys", {"template": "vicuna"}),
    lf("LLaMA-Factory template empty", "chat", {"template": "empty"}),
    lf("LLaMA-Factory no template (its parse of the tokenizer's)", "chat", {"template": None}, unrep=("truncation",)),
    lf("LLaMA-Factory template llama3", "chat", {"template": "llama3"}, base="base_llama3"),
    lf("LLaMA-Factory template phi", "chat_nosys", {"template": "phi"}, base="base_phi"),
    lf("LLaMA-Factory template qwen3_nothink", "chat", {"template": "qwen3_nothink"}),
    lf("LLaMA-Factory template smollm", "chat_nosys", {"template": "smollm"}),
    lf(
        "LLaMA-Factory template qwen3 (not reproduced)",
        "chat",
        {"template": "qwen3"},
        equal=0,
        unrep=("truncation", "chat_template"),
    ),
    lf(
        "LLaMA-Factory default_system (in place of the template's)",
        "chat_nosys",
        {"default_system": "Be brief."},
    ),
    tt("torchtune qwen2 (defaults)", "chat"),
    tt("torchtune qwen2, rows without a system turn", "chat_nosys"),
    tt("torchtune qwen2 max_seq_len 40", "chat", {"max_seq_len": 40}, cut=True),
    tt("torchtune qwen2 max_seq_len unset", "chat", {"max_seq_len": None}),
    tt("torchtune alpaca_dataset (train_on_input true, its default)", "alpaca"),
    tt("torchtune alpaca_dataset, train_on_input false", "alpaca", ds={"train_on_input": False}),
    tt("torchtune llama3 alpaca_dataset", "alpaca", family="llama3"),
    tt("torchtune llama3 (defaults)", "chat", family="llama3"),
    tt("torchtune llama3 max_seq_len 40", "chat", {"max_seq_len": 40}, family="llama3", cut=True),
]


def _config(case: dict, root: Path) -> dict:
    """The case's config file content, as a user of that framework writes it."""
    data, base = root / f"{case['data']}.jsonl", root / case["base"]
    out = root / "out" / _slug(case["name"])
    if case["framework"] == "axolotl":
        return {
            "base_model": str(base),
            "adapter": "lora",
            "lora_r": 8,
            "lora_alpha": 16,
            "lora_target_linear": True,
            "sequence_len": 2048,
            "datasets": [{"path": str(data), "ds_type": "json", "type": case["kind"], **case["ds"]}],
            "output_dir": str(out),
            "dataset_prepared_path": str(root / "prepared" / _slug(case["name"])),  # axolotl caches by a hash
            "micro_batch_size": 1,
            "gradient_accumulation_steps": 1,
            "num_epochs": 1,
            "learning_rate": 1e-4,
            "val_set_size": 0,
            **case["extra"],
        }
    if case["framework"] == "llamafactory":
        cfg = {
            "model_name_or_path": str(base),
            "stage": "sft",
            "do_train": True,
            "finetuning_type": "lora",
            "lora_target": "all",
            "dataset": case["data"],
            "dataset_dir": str(root),
            "template": "qwen",
            "cutoff_len": 2048,
            "output_dir": str(out),
            "overwrite_cache": True,
            "report_to": "none",
            **case["extra"],
        }
        return {k: v for k, v in cfg.items() if v is not None}
    files = (
        {"path": str(root / "vocab.json"), "merges_file": str(root / "merges.txt")}
        if case["family"] == "qwen2"
        else {"path": str(root / "tiktoken.model")}
    )
    tok = {
        "_component_": f"torchtune.models.{case['family']}.{case['family']}_tokenizer",
        **files,
        "special_tokens_path": str(base / "tokenizer.json"),
        "max_seq_len": 2048,
        **case["tok"],
    }
    return {
        "tokenizer": {k: v for k, v in tok.items() if v is not None},
        "dataset": {
            "_component_": "torchtune.datasets.chat_dataset",
            "source": "json",
            "data_files": str(data),
            "conversation_column": "messages",
            "conversation_style": "openai",
            "split": "train",
        }
        if case["data"] != "alpaca"
        else {
            "_component_": "torchtune.datasets.alpaca_dataset",
            "source": "json",
            "data_files": str(data),
            "split": "train",
            **case["ds"],
        },
    }


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    extra = [b for b in range(256) if b not in bs]
    return dict(zip(bs + extra, map(chr, cs + [256 + n for n in range(len(extra))])))


@pytest.fixture(scope="module")
def world(tmp_path_factory, tok):
    """A tiny base model and its tokenizer (and ones with the Llama-3 or Phi tokens), the training files,
    LLaMA-Factory's dataset_info.json and torchtune's vocab.json / merges.txt of the same tokenizer.
    """
    from gradian.models.tiny import tiny_model

    root = tmp_path_factory.mktemp("frameworks")
    tiny_model(tok, "llama").save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    for name, specials in (("base_llama3", LLAMA3_TOKENS), ("base_phi", PHI_TOKENS)):
        t = copy.deepcopy(tok)
        t.add_special_tokens({"additional_special_tokens": specials})
        tiny_model(t, "llama").save_pretrained(root / name)
        t.save_pretrained(root / name)
    t = copy.deepcopy(tok)
    t.add_special_tokens({"additional_special_tokens": LLAMA3_TT_TOKENS})
    t.save_pretrained(root / "base_llama3_tt")
    model = json.loads((root / "base" / "tokenizer.json").read_text())["model"]
    # torchtune's Llama-3 tokenizer reads tiktoken's format: each byte-level token's bytes in base64, and its rank
    byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
    ranks = "".join(
        base64.b64encode(bytes(byte_of[ch] for ch in s)).decode() + f" {i}\n"
        for s, i in sorted(model["vocab"].items(), key=lambda kv: kv[1])
        if s not in tok.all_special_tokens
    )
    (root / "tiktoken.model").write_text(ranks)
    (root / "vocab.json").write_text(json.dumps(model["vocab"]))
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    (root / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges))
    for name, data_rows in DATA.items():
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data_rows))
    tags = {
        "role_tag": "role",
        "content_tag": "content",
        "user_tag": "user",
        "assistant_tag": "assistant",
        "system_tag": "system",
    }
    info = {
        n: {
            "file_name": str(root / f"{n}.jsonl"),
            "formatting": "sharegpt",
            "columns": {"messages": "messages"},
            "tags": tags,
        }
        for n in ("chat", "chat_nosys")
    }
    info["sharegpt"] = {"file_name": str(root / "sharegpt.jsonl"), "formatting": "sharegpt"}
    info["alpaca"] = {
        "file_name": str(root / "alpaca.jsonl"),
        "columns": {"prompt": "instruction", "query": "input", "response": "output"},
    }
    (root / "dataset_info.json").write_text(json.dumps(info))
    return root


def run_frameworks(world: Path, case_list: list[dict]) -> dict:
    """``{case name: {"rows": [[input_ids, labels], ...]} or {"error": text}}``: each framework once, every case."""
    out = {}
    for fw in ("axolotl", "llamafactory", "torchtune"):
        if not (FW / fw).is_dir():
            continue
        cases = []
        for case in case_list:
            if case["framework"] != fw:
                continue
            path = world / f"{_slug(case['name'])}.yaml"
            path.write_text(yaml.safe_dump(_config(case, world)))
            saved = world / "saved" / _slug(case["name"]) if fw != "torchtune" else None
            cases.append(
                {
                    "name": case["name"],
                    "framework": fw,
                    "config": str(path),
                    "save_tokenizer": str(saved) if saved else None,
                    "train": case.get("train", False),
                }
            )
        spec, result = world / f"cases_{fw}.json", world / f"rows_{fw}.json"
        spec.write_text(json.dumps(cases))
        env = dict(
            os.environ,
            PYTHONPATH=str(FW / fw),
            DISABLE_VERSION_CHECK="1",
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            AXOLOTL_DO_NOT_TRACK="1",
            DO_NOT_TRACK="1",
            TOKENIZERS_PARALLELISM="false",
        )
        proc = subprocess.run(
            [sys.executable, str(RUNNER), str(spec), str(result)],
            env=env,
            cwd=world,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.is_file(), f"{fw} did not run: {proc.stderr[-2000:]}"
        out.update(json.loads(result.read_text()))
    return out


@pytest.fixture(scope="module")
def framework_rows(world) -> dict:
    return run_frameworks(world, CASES)


def _key(tokenizer, ids: list[int]) -> int | None:
    """The row a framework's ids belong to, by the country it names (axolotl shuffles the rows)."""
    text = tokenizer.decode(ids)
    return next((i for i, (c, _) in enumerate(FACTS) if c in text), None)


def check_case(case: dict, world: Path, framework_rows: dict) -> None:
    """The case's framework rows against Gradian's (module docstring)."""
    if not (FW / case["framework"]).is_dir():
        pytest.skip(f"{FW / case['framework']} is not installed (make frameworks)")
    got = framework_rows[case["name"]]
    assert "error" not in got, got.get("error")
    fw_rows = got["rows"]
    from transformers import AutoTokenizer

    base_tok = AutoTokenizer.from_pretrained(world / case["base"])
    data = world / f"{case['data']}.jsonl"
    examples = load_examples(data)
    saved = world / "saved" / _slug(case["name"]) if case["framework"] != "torchtune" else None
    saved = Path(case["adapter"]) if case.get("adapter") else saved  # a training run's own output folder
    cfg = world / f"{_slug(case['name'])}.yaml"
    setup = setup_from_files([cfg], data, adapter=saved, examples=examples)
    spec = setup.tokenize_spec()
    ours = [tokenize_example(ex, base_tok, spec) for ex in examples]
    trained = {}  # Gradian's row -> the framework's (ids, labels); a row absent here was dropped by the framework
    for n, (ids, labels) in enumerate(fw_rows):
        trained[_key(base_tok, ids) if case["framework"] == "axolotl" else n] = (ids, labels)
    equal = 0
    for k, it in enumerate(ours):
        if k in trained:
            ids, labels = trained[k]
            equal += it.input_ids.tolist() == ids and it.labels.tolist()[1:] == labels[1:]
        else:  # not trained on: equal when Gradian's row has no supervised token (a zero gradient) either
            equal += it.n_supervised == 0
    assert (equal, setup.unreproduced) == (case["equal"], case["unrep"]), (
        f"{case['name']}: {equal} of {len(ours)} rows equal ({len(fw_rows)} trained); unreproduced "
        f"{setup.unreproduced}; "
        f"notes {setup.notes}"
    )
    if equal < len(examples):  # a row that differs is stated, with its reason
        assert setup.unreproduced and setup.notes
    elif not case.get("cut"):  # the comparison has teeth: tokens are supervised and (unless all are) some are not
        sup = [sum(x != IGNORE_INDEX for x in it.labels.tolist()) for it in ours]
        assert all(s > 0 for s in sup)
        if "train_on" not in case["name"] and case.get("kind") != "completion":  # text rows train every token
            assert all(s < len(it.input_ids) - 1 for s, it in zip(sup, ours))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_gradian_tokens_equal_the_framework_or_the_setup_says_why(case, world, framework_rows):
    check_case(case, world, framework_rows)


#: the same runs with SmolLM2-135M-Instruct's own tokenizer (49,152 tokens, its model's template with its own default
#: system prompt), where a piece encoded on its own meets real merges
SMOL_CASES = [
    {**c, "name": c["name"] + " [SmolLM2]", "base": "smol"}
    for c in CASES
    if c["framework"] in ("axolotl", "llamafactory") and c["base"] == "base"
]


@pytest.fixture(scope="module")
def smol_rows(world) -> dict:
    from gradian.worlds.smollm2 import materialise_smollm2

    (world / "smol").symlink_to(materialise_smollm2(), target_is_directory=True)
    return run_frameworks(world, SMOL_CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", SMOL_CASES, ids=[c["name"] for c in SMOL_CASES])
def test_smollm2_tokens_equal_the_framework_or_the_setup_says_why(case, world, smol_rows):
    check_case(case, world, smol_rows)


def test_a_llamafactory_training_run_s_folder(world):
    """LLaMA-Factory 0.9.5 trains (``run_exp``, as ``llamafactory-cli train``: LoRA on the tiny model, 2 epochs, a
    checkpoint each) and Gradian reads its output folder as a user points at it: with the run's config, the rows are
    LLaMA-Factory's own (its ``qwen`` template writes its default system prompt on these rows); without it, the folder
    names the trainer (its model card) but not the template, and the setup says so instead of assuming one. Its
    trainer log is read for Audit."""
    from gradian.audit.config.runfolder import find_run_folder
    from gradian.audit.logs import load_logs

    if not (FW / "llamafactory").is_dir():
        pytest.skip(f"{FW / 'llamafactory'} is not installed (make frameworks)")
    out = world / "lf-run"
    case = lf("LLaMA-Factory training run", "chat_nosys")
    case["train"] = True
    case["extra"] = {
        "output_dir": str(out), "per_device_train_batch_size": 2, "num_train_epochs": 2, "learning_rate": 1e-3,
        "lora_rank": 4, "logging_steps": 1, "save_strategy": "epoch", "use_cpu": True,
        "disable_gradient_checkpointing": True,  # its checkpointing patch does not fit transformers 5.24's layers
    }  # fmt: skip
    got = run_frameworks(world, [case])[case["name"]]
    assert "error" not in got, got.get("error")
    assert (out / "adapter_model.safetensors").is_file() and sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
    ]
    check_case({**case, "adapter": str(out)}, world, {case["name"]: got})  # with --config: its rows, 4 of 4
    found = find_run_folder(out)
    assert found.configs == () and found.card is not None and found.card.trainer == "llamafactory"
    data = world / "chat_nosys.jsonl"
    without = setup_from_files([], data, adapter=out, card=found.card)
    assert without.trainer == "llamafactory" and "chat_template" in without.unreproduced
    assert any("does not record" in n for n in without.notes)
    log = load_logs(found.logs)
    assert [e["step"] for e in log.train] == [1, 2, 3, 4] and all(e["loss"] > 0 for e in log.train)
