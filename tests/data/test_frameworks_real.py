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
    tok = {**torchtune_tokenizer(root, case["family"], base, 2048), **case["tok"]}
    return {
        **case.get("extra", {}),  # a training run's sections (model, checkpointer, optimizer, ...)
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


def torchtune_tokenizer(root: Path, family: str, base: Path, max_seq_len: int) -> dict:
    """A torchtune recipe's ``tokenizer`` section for the world's tokenizer files: Qwen2's vocab.json / merges.txt or
    Llama-3's tiktoken file, the special tokens of ``base``'s tokenizer.json."""
    files = (
        {"path": str(root / "vocab.json"), "merges_file": str(root / "merges.txt")}
        if family == "qwen2"
        else {"path": str(root / "tiktoken.model")}
    )
    return {
        "_component_": f"torchtune.models.{family}.{family}_tokenizer",
        **files,
        "special_tokens_path": str(base / "tokenizer.json"),
        "max_seq_len": max_seq_len,
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
    return make_world(tmp_path_factory.mktemp("frameworks"), tok)


def make_world(root: Path, tok) -> Path:
    """In ``root``: a tiny base model and its tokenizer (and ones with the Llama-3 or Phi tokens), the training
    files, LLaMA-Factory's dataset_info.json and torchtune's vocab.json / merges.txt (and Llama-3 tiktoken file) of
    the same tokenizer.
    """
    from gradian.models.tiny import tiny_model

    root.mkdir(parents=True, exist_ok=True)
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


def framework_env(pythonpath: str) -> dict[str, str]:
    """The environment a framework's subprocess runs in: its folder(s) on ``PYTHONPATH``, offline, no telemetry."""
    return dict(
        os.environ,
        PYTHONPATH=pythonpath,
        DISABLE_VERSION_CHECK="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        AXOLOTL_DO_NOT_TRACK="1",
        DO_NOT_TRACK="1",
        WANDB_MODE="disabled",
        TOKENIZERS_PARALLELISM="false",
    )


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
                    "quant_out": case.get("quant_out"),
                }
            )
        spec, result = world / f"cases_{fw}.json", world / f"rows_{fw}.json"
        spec.write_text(json.dumps(cases))
        proc = subprocess.run(
            [sys.executable, str(RUNNER), str(spec), str(result)],
            env=framework_env(str(FW / fw)),
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


def _llamafactory_run(world: Path, name: str, folder: str, epochs: int = 2, **extra) -> tuple[dict, dict, Path]:
    """``(case, its result, output folder)`` of a real ``llamafactory-cli train`` run (``run_exp``: LoRA r 4 on the
    tiny model, batch 2, ``epochs`` epochs, on CPU; ``extra``: more of its arguments); skipped without the
    framework."""
    if not (FW / "llamafactory").is_dir():
        pytest.skip(f"{FW / 'llamafactory'} is not installed (make frameworks)")
    out = world / folder
    case = lf(name, "chat_nosys")
    case["train"] = True
    case["extra"] = {
        "output_dir": str(out), "per_device_train_batch_size": 2, "num_train_epochs": epochs, "learning_rate": 1e-3,
        "lora_rank": 4, "logging_steps": 1, "use_cpu": True,
        "disable_gradient_checkpointing": True,  # its checkpointing patch does not fit transformers 5.24's layers
        **extra,
    }  # fmt: skip
    got = run_frameworks(world, [case])[case["name"]]
    assert "error" not in got, got.get("error")
    return case, got, out


def test_a_llamafactory_training_run_s_folder(world):
    """LLaMA-Factory 0.9.5 trains (``run_exp``, as ``llamafactory-cli train``: LoRA on the tiny model, 2 epochs, a
    checkpoint each) and Gradian reads its output folder as a user points at it: with the run's config, the rows are
    LLaMA-Factory's own (its ``qwen`` template writes its default system prompt on these rows); without it, the folder
    names the trainer (its model card) but not the template, and the setup says so instead of assuming one. Its
    trainer log is read for Audit."""
    from gradian.audit.config.runfolder import find_run_folder
    from gradian.audit.logs import load_logs

    case, got, out = _llamafactory_run(world, "LLaMA-Factory training run", "lf-run", save_strategy="epoch")
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


def _torchtune_run_config(world: Path, out: Path, family: str = "qwen2", epochs: int = 2, base: str = "") -> dict:
    """What a torchtune user adds to the tokenizer and dataset sections to train: ``lora_finetune_single_device``
    on a tiny Qwen2 (or Llama-3) from an HF checkpoint (its config's sizes, LoRA on q, v, output and the MLP; on k
    too for Llama-3); batch 1 in order, ``epochs`` epochs, every step logged."""
    base = base or f"base_{family}"
    hf = json.loads((world / base / "config.json").read_text())
    extra = {"tie_word_embeddings": hf["tie_word_embeddings"]} if family == "qwen2" else {}
    attn = ["q_proj", "v_proj", "output_proj"] if family == "qwen2" else ["q_proj", "k_proj", "v_proj", "output_proj"]
    return {
        "output_dir": str(out),
        "model": {
            "_component_": f"torchtune.models.{family}.lora_{family}",
            "lora_attn_modules": attn,
            "apply_lora_to_mlp": True,
            "lora_rank": 4,
            "lora_alpha": 8,
            "vocab_size": hf["vocab_size"],
            "num_layers": hf["num_hidden_layers"],
            "num_heads": hf["num_attention_heads"],
            "num_kv_heads": hf["num_key_value_heads"],
            "embed_dim": hf["hidden_size"],
            "intermediate_dim": hf["intermediate_size"],
            "max_seq_len": hf["max_position_embeddings"],
            "norm_eps": hf["rms_norm_eps"],
            "rope_base": hf.get("rope_theta") or hf["rope_parameters"]["rope_theta"],
            **extra,
        },
        "checkpointer": {
            "_component_": "torchtune.training.FullModelHFCheckpointer",
            "checkpoint_dir": str(world / base),
            "checkpoint_files": ["model.safetensors"],
            "recipe_checkpoint": None,
            "output_dir": str(out),
            "model_type": family.upper(),
        },
        "resume_from_checkpoint": False,
        "save_adapter_weights_only": False,
        "seed": 0,
        "shuffle": False,
        "batch_size": 1,
        "optimizer": {"_component_": "torch.optim.AdamW", "fused": False, "weight_decay": 0.01, "lr": 2e-2},
        "lr_scheduler": {
            "_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup",
            "num_warmup_steps": 1,
        },
        "loss": {"_component_": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "epochs": epochs,
        "max_steps_per_epoch": None,
        "gradient_accumulation_steps": 1,
        "clip_grad_norm": None,
        "compile": False,
        "metric_logger": {"_component_": "torchtune.training.metric_logging.DiskLogger", "log_dir": str(out / "logs")},
        "log_every_n_steps": 1,
        "log_peak_memory_stats": False,
        "device": "cpu",
        "dtype": "fp32",
        "enable_activation_checkpointing": False,
        "enable_activation_offloading": False,
        "profiler": {"_component_": "torchtune.training.setup_torch_profiler", "enabled": False},
    }


def _tiny_qwen2(world: Path, tok) -> Path:
    """A tiny Qwen2 (tied embeddings) saved with the test tokenizer, for torchtune's ``lora_qwen2`` to train."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    base = world / "base_qwen2"
    if not base.is_dir():
        torch.manual_seed(0)
        cfg = Qwen2Config(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, rope_theta=10000.0,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        Qwen2ForCausalLM(cfg).save_pretrained(base)
        tok.save_pretrained(base)
    return base


def _tiny_llama3_untied(world: Path) -> Path:
    """A tiny Llama-3 with the Llama-3 tokenizer, its output projection its own (as torchtune's ``lora_llama3``)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    base = world / "base_llama3_untied"
    if not base.is_dir():
        t = AutoTokenizer.from_pretrained(world / "base_llama3_tt")
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=len(t), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, rope_theta=500000.0,
            rms_norm_eps=1e-5, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id,
        )  # fmt: skip
        LlamaForCausalLM(cfg).save_pretrained(base)
        t.save_pretrained(base)
    return base


def test_a_torchtune_training_run_s_folder(world, tok):
    """torchtune 0.6.1 trains (``tune run lora_finetune_single_device``: LoRA on a tiny Qwen2, 2 epochs of 4 steps,
    an ``epoch_N/`` folder each) and Gradian reads its output folder as a user points at it, with no ``--config``:

    * the setup is read from ``torchtune_config.yaml`` beside ``epoch_1/``, and its rows are torchtune's own;
    * the loss is the trainer's: Gradian's loss of row 0 on the base model (where the LoRA starts: B = 0) is the
      loss torchtune logged for step 1 (batch 1, in order), so the mask and the normalisation are the trainer's;
    * the adapter is the trainer's model: base + ``epoch_0/``'s adapter, loaded by Gradian, gives the logits of the
      model torchtune merged and saved at the end of epoch 0 (torchtune's PEFT file permutes this Qwen2's q_proj
      ``lora_B`` rows, so PEFT on the folder as written does not; Gradian un-permutes them, checked against the
      ``adapter_model.pt`` torchtune writes beside it);
    * the trajectory is the run's epochs, ``epoch_0`` and ``epoch_1`` at steps 4 and 8, weighted by the mean
      learning rate torchtune logged in each epoch;
    * the output folder itself (no adapter at its top) is refused with the checkpoint to pass;
    * Audit's C23 names both of torchtune's faults this run has (the permuted Qwen2 export, and on CPU the adapter
      merged into the live base weights at epoch 0's save, which epoch_1/'s merged weights show).
    """
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.audit import diagnose
    from gradian.audit.config.runfolder import find_run_folder
    from gradian.audit.logs import load_logs, torchtune_log
    from gradian.data.tokenize import collate
    from gradian.errors import GradianUserError
    from gradian.finetune import load_finetune
    from gradian.gradients.loss import head_positions, lm_logits, per_example_loss
    from gradian.models.spec import ModelSpec

    if not (FW / "torchtune").is_dir():
        pytest.skip(f"{FW / 'torchtune'} is not installed (make frameworks)")
    base = _tiny_qwen2(world, tok)
    out = world / "tt-run"
    case = tt("torchtune training run", "chat_nosys")
    case.update(base="base_qwen2", train=True, extra=_torchtune_run_config(world, out))
    got = run_frameworks(world, [case])[case["name"]]
    assert "error" not in got, got.get("error")
    assert sorted(p.name for p in out.glob("epoch_*")) == ["epoch_0", "epoch_1"]
    assert (out / "torchtune_config.yaml").is_file() and (out / "epoch_1" / "adapter_model.safetensors").is_file()

    found = find_run_folder(out / "epoch_1")
    assert [p.name for p in found.configs] == ["torchtune_config.yaml"]
    check_case({**case, "adapter": str(out / "epoch_1")}, world, {case["name"]: got})  # its rows, 4 of 4
    data = world / "chat_nosys.jsonl"
    examples = load_examples(data)
    setup = setup_from_files(list(found.configs), data, adapter=out / "epoch_1", examples=examples)
    assert setup.trainer == "torchtune" and setup.unreproduced == ()
    log_text = torchtune_log(out).read_text().splitlines()
    logged = [dict(kv.split(":", 1) for kv in line.split(" | ")[1].split()) for line in log_text]
    assert len(logged) == 8 and [e["step"] for e in load_logs(torchtune_log(out)).train] == list(range(1, 9))

    ft = load_finetune(ModelSpec(base=str(base)), out / "epoch_0")
    item = tokenize_example(examples[0], ft.tokenizer, setup.tokenize_spec())
    assert item.input_ids.tolist() == got["rows"][0][0]
    batch = collate([item], ft.tokenizer.pad_token_id)
    with torch.no_grad():
        with ft.model.disable_adapter():  # the model torchtune's first step saw (LoRA B starts at 0)
            keep = head_positions(ft.model, batch["labels"])
            loss = per_example_loss(lm_logits(ft.model, batch, keep), batch["labels"], keep).item()
        ours = ft.model(input_ids=batch["input_ids"]).logits
        # the merged model torchtune saved (from its weights alone: transformers' from_pretrained of the folder would
        # also apply the adapter_config.json beside them, a second time)
        trained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out / "epoch_0")).eval()
        result = trained.load_state_dict(load_file(out / "epoch_0" / "model-00001-of-00001.safetensors"), strict=False)
        assert result.unexpected_keys == [] and result.missing_keys == ["lm_head.weight"]  # tied to the embeddings
        merged = trained(input_ids=batch["input_ids"]).logits
        plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out / "epoch_0").eval()
        as_saved = plain(input_ids=batch["input_ids"]).logits  # PEFT on the folder as torchtune wrote it
    assert loss == pytest.approx(float(logged[0]["loss"]), rel=1e-5)
    assert (ours - merged).abs().max().item() < 1e-5
    assert (as_saved - merged).abs().max().item() > 100 * max((ours - merged).abs().max().item(), 1e-7)
    assert any("un-permuted" in n for n in ft.notes)

    # torchtune's other fault on CPU (C23's warning): saving epoch 0 merged its adapter into the live base weights,
    # so epoch_1/'s merged model is the base plus both epochs' adapters
    v = "model.layers.0.self_attn.v_proj"
    w0, w1 = (load_file(out / f"epoch_{e}" / "adapter_model.safetensors") for e in (0, 1))
    merged_1 = out / "epoch_1" / "model-00001-of-00001.safetensors"
    w_base, w_saved = (load_file(f)[f"{v}.weight"] for f in (base / "model.safetensors", merged_1))
    delta = [
        2.0 * w[f"base_model.model.{v}.lora_B.weight"] @ w[f"base_model.model.{v}.lora_A.weight"] for w in (w0, w1)
    ]
    assert (w_saved - (w_base + delta[0] + delta[1])).abs().max() < 1e-6 < (w_saved - (w_base + delta[1])).abs().max()
    findings = diagnose(configs=[out / "torchtune_config.yaml"], select=["C23"]).by_id("C23")
    assert sorted(f.severity for f in findings) == ["error", "warning"]

    traj = resolve_trajectory(out / "epoch_1")
    assert [(c.path.name, c.step) for c in traj.checkpoints] == [("epoch_0", 4), ("epoch_1", 8)]
    lr = [float(e["lr"]) for e in logged]
    eta = [sum(lr[:4]) / 4, sum(lr[4:]) / 4]
    assert traj.weights == pytest.approx([e / sum(eta) for e in eta], rel=1e-9)
    assert "torchtune epochs of 4 steps" in traj.weight_rule
    with pytest.raises(GradianUserError, match="epoch_0..epoch_1") as err:
        load_finetune(ModelSpec(base=str(base)), out)
    assert err.value.fix == f"pass its last checkpoint, --adapter {out / 'epoch_1'}"


@pytest.mark.parametrize(
    "fw, extra, scheme, load",
    [
        ("llamafactory", {"bf16": True}, "nf4-dq", "bfloat16"),  # its QuantizationArguments' defaults
        # no bf16 / fp16: its compute dtype is None, so transformers loads the stored dtype (None here)
        ("llamafactory", {"quantization_type": "fp4", "double_quantization": False}, "fp4", None),
        ("axolotl", {"bf16": True}, "nf4-dq", "bfloat16"),  # loaders/model.py's qlora BitsAndBytesConfig
        ("axolotl", {"fp16": True, "bnb_config_kwargs": {"bnb_4bit_use_double_quant": False}}, "nf4", "float16"),
    ],
)
def test_a_qlora_config_is_quantised_as_the_trainer_s_loader_quantises(world, fw, extra, scheme, load):
    """The trainer's own model loader (LLaMA-Factory 0.9.5 ``configure_quantization``, axolotl 0.19.0
    ``ModelLoader._set_quantization_config``) builds the BitsAndBytesConfig of a QLoRA config; Gradian's setup names
    the same 4-bit scheme and the dtype the base is loaded in."""
    pytest.importorskip("bitsandbytes")
    if not (FW / fw).is_dir():
        pytest.skip(f"{FW / fw} is not installed (make frameworks)")
    if fw == "llamafactory":
        case = lf(f"LLaMA-Factory QLoRA {scheme} {load}", "chat")
        case["extra"] = {"quantization_bit": 4, "use_cpu": True, **extra}
    else:
        case = ax(f"axolotl QLoRA {scheme} {load}", "chat")
        case["extra"] = {"adapter": "qlora", "load_in_4bit": True, **extra}
    case["quant_out"] = str(world / f"quant_{_slug(case['name'])}.json")
    got = run_frameworks(world, [case])[case["name"]]
    assert "error" not in got, got.get("error")
    theirs = json.loads(Path(case["quant_out"]).read_text())
    load_dtype = None if theirs["load_dtype"] == "None" else theirs["load_dtype"]
    assert (theirs["quant_type"] + ("-dq" if theirs["double_quant"] else ""), load_dtype) == (scheme, load)
    setup = setup_from_files([world / f"{_slug(case['name'])}.yaml"], world / "chat.jsonl")
    assert (setup.base_quant, setup.base_quant_from) == (scheme, load) and "base_quant" not in setup.unreproduced


def test_a_torchtune_llama3_run_s_adapter_is_its_merged_model(world):
    """torchtune 0.6.1 on a tiny Llama-3 (its ``lora_llama3``, LoRA on q, k, v and output, one epoch): its base
    conversion permutes q/k rows for Llama's rotary layout and its PEFT export permutes ``lora_B`` to match, so the
    PEFT file is the model trained. Gradian loads it as written (no note), and base + adapter gives the logits of the
    model torchtune merged and saved; the trajectory is its one epoch."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.finetune import load_finetune
    from gradian.models.spec import ModelSpec

    if not (FW / "torchtune").is_dir():
        pytest.skip(f"{FW / 'torchtune'} is not installed (make frameworks)")
    base = _tiny_llama3_untied(world)
    out = world / "tt-llama3-run"
    case = tt("torchtune llama3 training run", "chat_nosys", family="llama3")
    case.update(train=True, extra=_torchtune_run_config(world, out, "llama3", epochs=1, base=base.name))
    got = run_frameworks(world, [case])[case["name"]]
    assert "error" not in got, got.get("error")
    ft = load_finetune(ModelSpec(str(base)), out / "epoch_0")
    assert not any("un-permuted" in n for n in ft.notes)
    trained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out / "epoch_0")).eval()
    trained.load_state_dict(load_file(out / "epoch_0" / "model-00001-of-00001.safetensors"))
    x = torch.tensor([got["rows"][0][0]])
    with torch.no_grad():
        ours = ft.model(input_ids=x).logits
        diff = (ours - trained(input_ids=x).logits).abs().max().item()
        with ft.model.disable_adapter():
            moved = (ours - ft.model(input_ids=x).logits).abs().max().item()
    assert diff < 1e-5 < moved
    assert [c.path.name for c in resolve_trajectory(out / "epoch_0").checkpoints] == ["epoch_0"]


@pytest.mark.parametrize("family", ["llama3", "qwen2"])
def test_a_torchtune_dora_run_s_adapter_is_its_merged_model(world, tok, family):
    """torchtune 0.6.1 trains DoRA (``use_dora: true``, on q, k, v, output and the MLP, one epoch) and its PEFT
    export is wrong twice: ``adapter_config.json`` has no ``use_dora`` (PEFT loads plain LoRA, the magnitudes
    dropped), and for a Llama the q/k magnitudes stay in torchtune's rotary order while the base's rows are
    permuted to HF's (for a Qwen2 it is the q/k ``lora_B`` that are permuted wrongly, as without DoRA). Gradian
    loads it as DoRA and puts both right, checked against ``adapter_model.pt``: base + adapter gives the logits of
    the model torchtune merged and saved, PEFT on the folder as written does not, and the magnitudes are blocks of
    the per-example gradient."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from gradian.audit import diagnose
    from gradian.finetune import load_finetune
    from gradian.gradients.lora import lora_blocks
    from gradian.models.spec import ModelSpec

    if not (FW / "torchtune").is_dir():
        pytest.skip(f"{FW / 'torchtune'} is not installed (make frameworks)")
    if family == "llama3":
        base = _tiny_llama3_untied(world)
        case = tt("torchtune llama3 DoRA run", "chat_nosys", family="llama3")
        conf = _torchtune_run_config(world, world / "tt-llama3-dora", "llama3", epochs=1, base=base.name)
    else:
        base = _tiny_qwen2(world, tok)
        case = tt("torchtune qwen2 DoRA run", "chat_nosys")
        conf = _torchtune_run_config(world, world / "tt-qwen2-dora", "qwen2", epochs=1)
        conf["model"]["lora_attn_modules"] = ["q_proj", "k_proj", "v_proj", "output_proj"]
    out = Path(conf["output_dir"])
    conf["model"]["use_dora"] = True
    case.update(base=base.name, train=True, extra=conf)
    got = run_frameworks(world, [case])[case["name"]]
    assert "error" not in got, got.get("error")
    assert "use_dora" not in json.loads((out / "epoch_0" / "adapter_config.json").read_text())  # torchtune's omission
    ft = load_finetune(ModelSpec(str(base)), out / "epoch_0")
    assert any("without use_dora" in n for n in ft.notes)
    assert any(("DoRA magnitudes" if family == "llama3" else "un-permuted") in n for n in ft.notes)
    assert sum(b.kind == "M" for b in lora_blocks(ft.model)) == 2 * 7  # 2 layers x 7 adapted linears
    trained = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out / "epoch_0")).eval()
    trained.load_state_dict(load_file(out / "epoch_0" / "model-00001-of-00001.safetensors"), strict=False)
    trained.tie_weights()  # the Qwen2's lm_head is its embeddings
    x = torch.tensor([got["rows"][0][0]])
    with torch.no_grad():
        merged = trained(input_ids=x).logits
        ours = ft.model(input_ids=x).logits
        plain = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), out / "epoch_0").eval()
        as_written = plain(input_ids=x).logits
    diff = (ours - merged).abs().max().item()
    assert diff < 1e-5 and (as_written - merged).abs().max().item() > 100 * max(diff, 1e-7)
    c23 = [f.message for f in diagnose(configs=[out / "torchtune_config.yaml"], select=["C23"]).by_id("C23")]
    assert any("without use_dora" in m and (("rotary order" in m) == (family == "llama3")) for m in c23)


def test_a_llamafactory_dora_run_s_adapter_is_attributed_as_dora(world):
    """LLaMA-Factory 0.9.5 trains DoRA (``use_dora: true``, one epoch) through PEFT: its folder says ``use_dora``,
    Gradian loads it with its trained magnitudes (moved off the weight norms PEFT started them at) as blocks of the
    per-example gradient, and the setup read from the run's config is LLaMA-Factory's, as for LoRA."""
    import torch

    from gradian.data.tokenize import collate
    from gradian.finetune import load_finetune
    from gradian.gradients import per_example_grads
    from gradian.gradients.lora import lora_blocks
    from gradian.models.spec import ModelSpec

    case, got, out = _llamafactory_run(
        world, "LLaMA-Factory DoRA run", "lf-dora-run", 1, use_dora=True, save_strategy="no"
    )
    assert json.loads((out / "adapter_config.json").read_text())["use_dora"] is True
    check_case({**case, "adapter": str(out)}, world, {case["name"]: got})  # with --config: its rows, 4 of 4
    ft = load_finetune(ModelSpec(str(world / "base")), out)
    mags = [b for b in lora_blocks(ft.model) if b.kind == "M"]
    assert mags and len(mags) * 2 == sum(b.kind in "AB" for b in lora_blocks(ft.model))
    layer = dict(ft.model.named_modules())[mags[0].layer]
    with torch.no_grad():
        W, A, B = layer.base_layer.weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight
        norm = torch.linalg.norm(W + layer.scaling["default"] * (B @ A), dim=1)
    assert not torch.allclose(mags[0].module.weight, norm)  # trained: m/n is not 1
    setup = setup_from_files([world / f"{_slug(case['name'])}.yaml"], world / "chat_nosys.jsonl")
    examples = load_examples(world / "chat_nosys.jsonl")
    items = [tokenize_example(e, ft.tokenizer, setup.tokenize_spec()) for e in examples[:2]]
    grads = per_example_grads(ft.model, collate(items, ft.tokenizer.pad_token_id))
    assert all(float(grads[b.name].abs().max()) > 0 for b in mags)
