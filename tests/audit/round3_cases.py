"""Write issue 25's cases (audit round 3) to a folder, one sub-folder per case, with the command a user runs on it.

    python tests/audit/round3_cases.py OUTDIR

Every fixture comes from the test fixtures (published_examples.py, pref_world.py, template_world.py,
contam_world.py, test_audit_round3.py); nothing is typed out again here. ``OUTDIR/cases.json`` lists the cases:
``id``, ``case`` (the issue's case), ``args`` (the command line after ``gradian``, paths relative to OUTDIR),
``show`` (the check ids whose finding, pass or skip the before/after table gives) and ``reads`` (the values of
``inputs.data.formats`` / ``config.values`` to report). benchmarks/bench_round3_cases.py runs them on two source
trees and writes the before/after table (docs/diagnose.md, "Round 3: before and after").

Building the shared tokenizer folder (``OUTDIR/tok``, used by the chat-template and truncation cases) needs
gradian and transformers on the path; everything else is plain files.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import contam_world as CW  # noqa: E402
import pref_world as PW  # noqa: E402
import published_examples as P  # noqa: E402
import template_world as TW  # noqa: E402

PREF = ["D22", "D23", "D24", "D25", "D26", "D27"]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def _text(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return str(path)


def _lf_tree(root: Path, config: str, files: dict[str, list]) -> tuple[str, str]:
    """A LLaMA-Factory checkout: data/dataset_info.json (the demo entries), data files, examples/train_lora/."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "dataset_info.json").write_text(json.dumps(P.LF_DATASET_INFO, indent=1))
    for name, rows in files.items():
        (root / "data" / name).write_text(json.dumps(rows, indent=1))
    cfg = _text(root / "examples" / "train_lora" / "config.yaml", config)
    return str(root / "data" / next(iter(files))), cfg


def _tokenizer(out: Path) -> str:
    """The audit tests' byte-level BPE tokenizer (ChatML template), saved as a model folder would hold it."""
    from audit_world import corpus_for_tokenizer, make_rows, save_tokenizer

    from gradian.models.tiny import train_tokenizer

    rows = make_rows(400, seed=0)
    corpus = corpus_for_tokenizer(rows) + [q for q, *_ in P.QA] + [f"{c} {k}" for c, k in PW.CAPITALS]
    return str(save_tokenizer(train_tokenizer(corpus, vocab_size=800), out / "tok", max_positions=2048))


def _pref_faults(rows: list[dict], name: str) -> list[dict]:
    """Planted preference faults on a length-biased fixture: row 3 chosen == rejected, row 5 an empty rejected
    response (:func:`pref_world.plant_pair_faults`), rows 0 twice more at the end (duplicates)."""
    rows = PW.plant_pair_faults(rows, name)
    return rows + [dict(rows[0]), dict(rows[0])]


def build(out: Path) -> list[dict]:
    """Write every case under ``out`` and return the case list (also written to ``out/cases.json``)."""
    import test_audit_round3 as R3

    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(out)
    cases: list[dict] = []

    def case(cid: str, what: str, args: list[str], show: list[str], reads: list[str] = ()) -> None:
        rel = [str(Path(a).relative_to(out)) if a.startswith(str(out)) else a for a in args]
        cases.append({"id": cid, "case": what, "args": rel, "show": show, "reads": list(reads)})

    def diagnose_case(cid, what, show, reads=(), *, data=None, evals=None, config=None, tokenizer=False) -> None:
        """A ``gradian diagnose`` case on files under ``out/cid``: ``data`` and ``evals`` are (file name, rows),
        written as JSONL; ``config`` is (file name, text); ``tokenizer`` adds the shared tokenizer folder."""
        args = ["diagnose"]
        if data is not None:
            args += ["--data", _jsonl(out / cid / data[0], data[1])]
        if evals is not None:
            args += ["--eval", _jsonl(out / cid / evals[0], evals[1])]
        if config is not None:
            args += ["--config", _text(out / cid / config[0], config[1])]
        if tokenizer:
            args += ["--tokenizer", tok]
        case(cid, what, args, show, reads)

    d = out
    # ------------------------------------------------------------------ 1: preference data
    diagnose_case(
        "1a",
        "1 preference rows: HuggingFaceH4/ultrafeedback_binarized rows + alignment-handbook zephyr DPO QLoRA recipe",
        PREF,
        ["formats", "stage"],
        data=("train_prefs.jsonl", P.h4_ultrafeedback_rows(24)),
        config=("recipes/zephyr-7b-beta/dpo/config_qlora.yaml", P.AH_ZEPHYR_DPO_QLORA),
    )
    conv = PW.trl_rows()
    plain = [{k: r[k][0]["content"] for k in ("prompt", "chosen", "rejected")} for r in conv]
    diagnose_case(
        "1b",
        "1 preference rows: TRL standard prompt/chosen/rejected strings",
        PREF,
        ["formats"],
        data=("train.jsonl", plain),
    )
    diagnose_case(
        "1c",
        "1 preference rows: TRL conversational prompt/chosen/rejected messages",
        PREF,
        ["formats"],
        data=("train.jsonl", conv),
    )
    diagnose_case(
        "1d",
        "1 preference rows: axolotl chat_template.default (conversation + chosen/rejected) + its DPO LoRA example",
        PREF,
        ["formats", "stage"],
        data=("train.jsonl", P.axolotl_dpo_test_rows(24)),
        config=("examples/llama-3/instruct-dpo-lora-8b.yml", P.AX_DPO_LORA_8B),
    )
    diagnose_case(
        "1e",
        "1 preference rows: axolotl chatml.intel (system/question/chosen/rejected)",
        PREF,
        ["formats"],
        data=("train.jsonl", PW.axolotl_rows()),
    )
    for cid, what, config, files in [
        ("1f",
         "1 preference rows: LLaMA-Factory dpo_en_demo (sharegpt ranking) + examples/train_lora/qwen3_lora_dpo.yaml",
         P.LF_QWEN3_LORA_DPO, {"dpo_en_demo.json": P.lf_dpo_en_demo_rows(24)}),
        ("1g", "1 KTO rows: LLaMA-Factory kto_en_demo (10 desirable, 2 undesirable) + qwen3_lora_kto.yaml",
         P.LF_QWEN3_LORA_KTO, {"kto_en_demo.json": P.lf_kto_en_demo_rows(10, 2)}),
    ]:  # fmt: skip
        data, cfg = _lf_tree(d / cid / "LLaMA-Factory", config, files)
        case(cid, what, ["diagnose", "--data", data, "--config", cfg], PREF, ["formats", "stage"])
    diagnose_case(
        "1h",
        "1 KTO rows: TRL unpaired prompt/completion/label (6+6) + axolotl qlora-1b-kto.yaml (kto_desirable_weight 0.2)",
        ["D27"],
        ["formats", "stage", "desirable_weight"],
        data=("kto.jsonl", P.trl_kto_rows(6, 6)),
        config=("examples/llama-3/qlora-1b-kto.yaml", P.AX_KTO_QLORA_1B),
    )
    ev = _jsonl(
        d / "1i" / "eval.jsonl",
        [{"id": "e1", "prompt": "What is the capital city of Peru?", "answer": "Lima.", "capability": "capitals"}],
    )
    data = str(d / "1b" / "train.jsonl")
    case(
        "1i",
        "What to build: gradian attribute on preference rows is refused in one line",
        ["attribute", "--base", "base", "--adapter", "adapter", "--data", data, "--eval", ev, "--out", "1i/out"],
        [],
    )
    case(
        "1j",
        "What to build: gradian index on preference rows is refused in one line",
        ["index", "--base", "base", "--adapter", "adapter", "--data", data, "--out", "1j/ix"],
        [],
    )

    # ------------------------------------------------------------------ 2: stage-aware config rules
    stage_reads = ["stage", "learning_rate", "beta", "max_prompt_length", "finetuning"]
    for cid, what, name, fname in [
        ("2a", "2 TRL DPO QLoRA at 5e-6 (alignment-handbook zephyr-7b-beta dpo/config_qlora.yaml)",
         "AH_ZEPHYR_DPO_QLORA", "recipes/zephyr-7b-beta/dpo/config_qlora.yaml"),
        ("2b", "2 TRL ORPO (alignment-handbook zephyr-141b-A35b orpo/config_full.yaml, lr 5e-6)",
         "AH_ZEPHYR_ORPO", "recipes/zephyr-141b-A35b/orpo/config_full.yaml"),
        ("2d", "2 axolotl rl: dpo LoRA at 2e-4 (examples/llama-3/instruct-dpo-lora-8b.yml)",
         "AX_DPO_LORA_8B", "examples/llama-3/instruct-dpo-lora-8b.yml"),
        ("2e", "2 axolotl rl: orpo QLoRA at 2e-4 (examples/mistral/orpo/mistral-qlora-orpo.yml)",
         "AX_ORPO_QLORA", "examples/mistral/orpo/mistral-qlora-orpo.yml"),
        ("2f", "2 LLaMA-Factory stage: dpo LoRA (examples/train_lora/qwen3_lora_dpo.yaml)",
         "LF_QWEN3_LORA_DPO", "examples/train_lora/qwen3_lora_dpo.yaml"),
        ("2g", "2 torchtune LoRA DPO at 5e-4 (recipes/configs/llama3_1/8B_lora_dpo.yaml)",
         "TT_LLAMA31_8B_LORA_DPO", "recipes/configs/llama3_1/8B_lora_dpo.yaml"),
    ]:  # fmt: skip
        diagnose_case(cid, what, ["C01", "C02", "C20"], stage_reads, config=(fname, getattr(P, name)))
    no_lr = "\n".join(x for x in P.AH_ZEPHYR_ORPO.splitlines() if not x.startswith("learning_rate:")) + "\n"
    diagnose_case(
        "2c",
        "2 TRL ORPO recipe without a learning_rate: ORPOConfig's default (1e-6), not SFTConfig's (2e-5)",
        ["C01", "C20"],
        ["stage", "learning_rate"],
        config=("recipes/zephyr-141b-A35b/orpo/config_full.yaml", no_lr),
    )
    bad = (
        P.AH_ZEPHYR_DPO_QLORA.replace("beta: 0.01", "beta: 0")
        .replace("max_prompt_length: 512", "max_prompt_length: 2048")
        .replace("learning_rate: 5.0e-6", "learning_rate: 2.0e-3")
    )
    diagnose_case(
        "2h",
        "What to build (stage rules): the DPO recipe with beta 0, max_prompt_length 2048 >= max_length 1024, lr 2e-3",
        ["C01", "C02", "C20"],
        ["stage", "learning_rate", "beta", "max_prompt_length", "max_length"],
        config=("dpo.yaml", bad),
    )

    # ------------------------------------------------------------------ 3: the config's own chat template
    import trl

    jinja = Path(trl.__file__).parent / "chat_templates" / "qwen3_training.jinja"
    (d / "3a").mkdir(exist_ok=True)
    shutil.copy(jinja, d / "3a" / "qwen3_training.jinja")  # chat_template_path is read relative to the config
    diagnose_case(
        "3a",
        "3 assistant_only_loss + chat_template_path naming TRL's qwen3_training.jinja ({%- generation %} block)",
        ["C09"],
        ["chat_template_path"],
        config=("sft.yaml", P.TRL_SFT_ASSISTANT_ONLY.format(path="qwen3_training.jinja")),
        tokenizer=True,
    )
    inline = P.TRL_SFT_ASSISTANT_ONLY.replace(
        "chat_template_path: {path}", "chat_template: " + json.dumps(jinja.read_text())
    )
    diagnose_case(
        "3b",
        "3 assistant_only_loss + the same template inline as the config's chat_template:",
        ["C09"],
        ["chat_template"],
        config=("sft.yaml", inline),
        tokenizer=True,
    )

    # ------------------------------------------------------------------ 4: the config's own version pins
    diagnose_case(
        "4a",
        '4 packing_strategy bfd + assistant_only_loss, the config pinning "trl==0.19.1" in a comment',
        ["C11"],
        ["versions"],
        config=("sft.yaml", R3.PACKED_ASSISTANT_ONLY),
    )
    _text(d / "4b" / "requirements.txt", "peft==0.15.2\ntrl==0.19.0\n")
    diagnose_case(
        "4b",
        "4 the same config unpinned, with a requirements.txt beside it pinning trl==0.19.0",
        ["C11"],
        ["versions"],
        config=("sft.yaml", R3.PACKED_ASSISTANT_ONLY.split("\n", 1)[1]),
    )

    # ------------------------------------------------------------------ 5: test splits trained on
    diagnose_case(
        "5a",
        "5 alignment-handbook zephyr-7b-beta sft/config_qlora.yaml (mixture of ultrachat_200k train_sft + test_sft)",
        ["C21"],
        config=("recipes/zephyr-7b-beta/sft/config_qlora.yaml", P.AH_ZEPHYR_SFT_QLORA_MIXTURE),
    )
    diagnose_case(
        "5b",
        "5 alignment-handbook smollm2 dpo/config.yaml (mixture of ultrafeedback train_prefs + test_prefs)",
        ["C21"],
        config=("recipes/smollm2/dpo/config.yaml", P.AH_SMOLLM2_DPO_MIXTURE),
    )
    diagnose_case(
        "5c", "5 axolotl datasets[].split: test (tatsu-lab/alpaca)", ["C21"], config=("ax.yaml", R3.AXOLOTL_TEST_SPLIT)
    )

    # ------------------------------------------------------------------ 6: axolotl custom type: mappings
    rows = [
        {"question": f"What is {k} squared?", "context": "" if k % 2 else "Maths.", "answer": str(k * k)}
        for k in range(12)
    ]
    diagnose_case(
        "6a",
        "6 axolotl type: mapping (field_instruction question, field_input context, field_output answer, format)",
        ["D01", "C08", "D08"],
        ["formats"],
        data=("train.jsonl", rows),
        config=("ax.yml", R3.AXOLOTL_CUSTOM),
    )
    diagnose_case(
        "6b",
        "6 axolotl docs' Custom Instruct Prompt Format (input/output rows, field_input left empty)",
        ["D01", "C08", "D08"],
        ["formats"],
        data=("data.jsonl", P.axolotl_custom_rows()),
        config=("ax.yml", P.AX_CUSTOM_INSTRUCT),
    )

    # ------------------------------------------------------------------ 7: LLaMA-Factory freeze tuning
    for cid, name, fname in [
        ("7a", "LF_LLAMA3_FREEZE_SFT", "examples/extras/llama_pro/llama3_freeze_sft.yaml"),
        ("7b", "LF_V1_FREEZE_SFT", "examples/v1/train_freeze/train_freeze_sft.yaml"),
    ]:
        what = f"7 LLaMA-Factory {fname} (freeze tuning)"
        diagnose_case(cid, what, ["C02"], ["finetuning", "learning_rate"], config=(fname, getattr(P, name)))

    # ------------------------------------------------------------------ 8: D15 on template data, C08
    for kind in sorted(TW.WORLDS):
        train, ev = TW.WORLDS[kind]()
        what = f"8 D15 on template data: template_world.{kind} (healthy eval rows)"
        diagnose_case(f"8-{kind}", what, ["D15", "D14"], data=("train.jsonl", train), evals=("eval.jsonl", ev))
    for kind in ("macro", "maths"):  # the light edits test_audit_d15 plants (seed 5): still caught
        train, ev = TW.WORLDS[kind]()
        rng = random.Random(5)
        for src in rng.sample(train, 3):
            p = CW.paraphrase(src, rng)
            p["id"] = f"para-{src['id']}"
            ev.append(p)
        what = f"8 D15: template_world.{kind} + light edits of 3 training rows (must be caught)"
        diagnose_case(f"8-{kind}-edits", what, ["D15"], data=("train.jsonl", train), evals=("eval.jsonl", ev))
    response_rows = [
        {"id": r["id"], "text": r["text"].replace("### Answer:", "### Response:")} for r in R3._qa_text_rows()
    ]
    diagnose_case(
        "8c",
        "8 C08: '### Response:' text rows + DataCollatorForCompletionOnlyLM(response_template='### Response:')",
        ["C08", "C10"],
        ["formats"],
        data=("train.jsonl", response_rows),
        config=("sft.yaml", R3.TRL_COMPLETION_ONLY.replace("### Answer:", "### Response:")),
        tokenizer=True,
    )
    diagnose_case(
        "8d",
        "8 C08: '### Question: ... ### Answer:' text rows + the collator with response_template ' ### Answer:'",
        ["C08", "C10"],
        ["formats"],
        data=("train.jsonl", R3._qa_text_rows()),
        config=("sft.yaml", R3.TRL_COMPLETION_ONLY),
    )
    case(
        "8e",
        "8 C08: the same '### Question: ... ### Answer:' text rows, no config (trained on the prompt)",
        ["diagnose", "--data", str(d / "8d" / "train.jsonl")],
        ["C08"],
        ["formats"],
    )
    (out / "cases.json").write_text(json.dumps(cases, indent=1))
    return cases


def build_preference(out: Path) -> list[dict]:
    """One TRL, one axolotl and one LLaMA-Factory preference fixture (pref_world.py), clean and with planted faults
    (chosen == rejected, an empty rejected, two duplicates, chosen always longer, an eval row copying row 3, and the
    handbook DPO recipe cut to max_length 64 / max_prompt_length 12 for D25). Written to ``out/pref``; returns the
    cases (the KTO fixtures are cases 1g and 1h of :func:`build`)."""
    tok = str(out / "tok")
    d = out / "pref"
    short = P.AH_ZEPHYR_DPO_QLORA.replace("max_length: 1024", "max_length: 64")
    cfg = _text(d / "dpo_short.yaml", short.replace("max_prompt_length: 512", "max_prompt_length: 12"))
    cases = []
    for name, make in (("trl", PW.trl_rows), ("axolotl", PW.axolotl_rows), ("llamafactory", PW.llamafactory_rows)):
        clean = _jsonl(d / name / "clean.jsonl", make())
        faulty = _jsonl(d / name / "faulty.jsonl", _pref_faults(make(biased=True), name))
        q, good, _ = PW._pair(3, biased=True)
        ev_rows = [{"id": "e1", "prompt": q, "answer": good, "capability": "capitals"}]
        if name == "axolotl":  # its rows' prompt holds the system turn: the same question with it
            ev_rows.append({"id": "e2", "prompt": f"You are a geography tutor. {q}", "answer": good, "capability": "c"})
        ev = _jsonl(d / name / "eval.jsonl", ev_rows)
        for cid, what, args in (
            ("clean", f"{name} preference fixture (pref_world.{make.__name__})", ["--data", clean, "--tokenizer", tok]),
            ("faulty", f"{name} fixture, planted faults", ["--data", faulty, "--eval", ev, "--tokenizer", tok]),
        ):
            args = ["diagnose", *args] + (["--config", cfg] if cid == "faulty" else [])
            cases.append({"id": f"pref-{name}-{cid}", "case": what, "args": args, "show": PREF, "reads": ["formats"]})
    for c in cases:
        c["args"] = [str(Path(a).relative_to(out)) if a.startswith(str(out)) else a for a in c["args"]]
    (out / "pref_cases.json").write_text(json.dumps(cases, indent=1))
    return cases


def build_d15(out: Path) -> list[str]:
    """The other D15 fixtures, each as ``out/d15/<name>/{train,eval}.jsonl``: contam_world's three template-built
    worlds, healthy and with 8 planted light paraphrases (eval ids ``para-<source id>``), and the audit tests'
    clean run (audit_world.make_rows: 400 training rows, 60 eval rows)."""
    from audit_world import make_rows

    names = []
    for kind in ("support", "qa", "chat"):
        for name, (train, ev, *_) in ((kind, CW.world(kind)), (f"{kind}+paraphrases", CW.with_paraphrases(kind))):
            _jsonl(out / "d15" / f"contam_world.{name}" / "train.jsonl", train)
            _jsonl(out / "d15" / f"contam_world.{name}" / "eval.jsonl", ev)
            names.append(f"contam_world.{name}")
    _jsonl(out / "d15" / "audit_world.clean" / "train.jsonl", make_rows(400, seed=0))
    _jsonl(out / "d15" / "audit_world.clean" / "eval.jsonl", make_rows(60, seed=1, id_prefix="e"))
    return names + ["audit_world.clean"]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = Path(sys.argv[1]).resolve()
    n = len(build(root)) + len(build_preference(root))
    m = len(build_d15(root))
    print(f"{n} cases under {root} (cases.json, pref_cases.json), {m} D15 fixtures under {root / 'd15'}")
