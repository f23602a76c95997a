"""Property-based fuzzing of every reader of user input.

Random JSON, YAML and bytes go into the data readers, the eval reader, the config readers (and the config
checks that compute with what they read), the trainer-state reader (and the log checks), and the loader behind
``gradian report``. The only acceptable outcomes are a result or a one-line :class:`GradianUserError`; any other
exception is a bug. Derandomized, with a fixed example budget and no deadline, so the run is reproducible and
takes a few seconds.
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gradian.errors import GradianUserError  # noqa: E402

#: examples per reader (the budget keeps the whole module at about 20 s on a busy 2-core machine)
N = int(os.environ.get("GRADIAN_FUZZ_EXAMPLES", "120"))
FUZZ = settings(
    max_examples=N,
    derandomize=True,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)

# ---------------------------------------------------------------------- values
KEYS = [
    "id",
    "prompt",
    "completion",
    "messages",
    "conversations",
    "role",
    "content",
    "from",
    "value",
    "instruction",
    "input",
    "output",
    "text",
    "answer",
    "aliases",
    "capability",
    "metric",
    "data",
    "system",
    "user",
    "assistant",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(
        [
            "",
            " ",
            "user",
            "assistant",
            "system",
            "exact_match",
            "loglik",
            "nan",
            "inf",
            "1e999",
            "-1",
            "0",
            "true",
            "null",
            "2024-13-45",
            "<|im_end|>",
            "\u202e",
            "\x00",
        ]
    )
)
keys = st.sampled_from(KEYS) | st.text(max_size=6)
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=5), max_leaves=25
)
row_like = st.dictionaries(st.sampled_from(KEYS), json_values, max_size=6)
message_rows = st.builds(
    lambda msgs, extra: {"messages": msgs, **extra},
    st.lists(
        st.dictionaries(st.sampled_from(["role", "content", "from", "value"]), json_values, max_size=3), max_size=4
    ),
    st.dictionaries(st.sampled_from(["id", "text"]), json_values, max_size=2),
)


def _deep(n: int, kind: str = "[") -> str:
    return "[" * n + "]" * n if kind == "[" else '{"a": ' * n + "1" + "}" * n


def _dump_line(v) -> str:
    try:
        return json.dumps(v, allow_nan=True)
    except (ValueError, TypeError, RecursionError):
        return "null"


def _write(suffix: str, data: bytes | str) -> Path:
    fd, name = tempfile.mkstemp(suffix=suffix, dir=_TMP)
    with os.fdopen(fd, "wb") as f:
        f.write(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    return Path(name)


_TMP = tempfile.mkdtemp(prefix="gradian_fuzz_")


def _only_user_errors(fn, *args, **kwargs):
    """Call ``fn``; a GradianUserError is fine (and must be one line), anything else propagates."""
    try:
        return fn(*args, **kwargs)
    except GradianUserError as e:
        assert "\n" not in e.one_line()
        return None


# ---------------------------------------------------------------------- data and eval readers
texts = st.text(max_size=40) | st.sampled_from(["What is 2+2?", "4", "", " ", "<|im_end|>", "### Response:", "\u202e"])
roles = st.sampled_from(["user", "assistant", "system", "tool", "human", "gpt", "narrator"])
valid_messages = st.lists(st.fixed_dictionaries({"role": roles, "content": texts}), min_size=1, max_size=4).map(
    lambda ms: ms + [{"role": "assistant", "content": "ok"}]
)
valid_rows = st.one_of(
    st.fixed_dictionaries({"prompt": texts, "completion": texts}),
    st.fixed_dictionaries({"messages": valid_messages}),
    st.fixed_dictionaries({"prompt": valid_messages, "completion": st.just([{"role": "assistant", "content": "x"}])}),
    st.fixed_dictionaries({"instruction": texts, "output": texts}, optional={"input": texts}),
    st.fixed_dictionaries({"text": texts}),
)


def _perturb(row: dict, key: str, value, on: bool) -> dict:
    """One field of a valid row replaced by an arbitrary JSON value (``on``), or the row as is."""
    return {**row, key: value} if on else row


rows = st.one_of(
    valid_rows,
    valid_rows,
    st.builds(_perturb, valid_rows, st.sampled_from(KEYS), json_values, st.booleans()),
    row_like | message_rows | json_values,
)
files = st.one_of(
    st.lists(valid_rows, min_size=1, max_size=6),
    st.lists(valid_rows, min_size=1, max_size=6),
    st.lists(rows, max_size=5),
)
jsonl_texts = files.map(lambda rs: "\n".join(_dump_line(r) for r in rs)) | st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")
)
json_texts = files.map(_dump_line) | st.builds(lambda rs: _dump_line({"data": rs}), files) | json_values.map(_dump_line)
tails = st.just(b"") | st.just(b"") | st.binary(max_size=32)
data_files = jsonl_texts.map(lambda t: (".jsonl", t)) | json_texts.map(lambda t: (".json", t))


@FUZZ
@given(case=data_files, raw=tails)
@example(case=(".json", _deep(5000)), raw=b"")
@example(case=(".jsonl", '{"prompt": ' + _deep(3000) + ', "completion": "x"}'), raw=b"")
@example(case=(".jsonl", '{"prompt": ' + _deep(150) + ', "completion": "x"}'), raw=b"")
@example(
    case=(".jsonl", '{"messages": [{"role": [1], "content": "x"}, {"role": "assistant", "content": "y"}]}'), raw=b""
)
@example(case=(".jsonl", '{"prompt": "a", "completion": "b", "id": ' + "9" * 5000 + "}"), raw=b"")
def test_data_readers(case, raw):
    suffix, text = case
    from gradian.audit import diagnose
    from gradian.data.formats import load_examples

    out = _only_user_errors(load_examples, _write(suffix, text.encode("utf-8", "surrogatepass") + raw))
    assert out is None or isinstance(out, list)
    if out:  # the data checks read every field of the rows (no tokenizer: the fast ones)
        _only_user_errors(diagnose, data=out, eval=out)


valid_items = st.fixed_dictionaries(
    {"prompt": texts.filter(str.strip), "answer": texts.filter(str.strip), "capability": st.sampled_from(["a", "b"])},
    optional={"metric": st.sampled_from(["exact_match", "contains", "loglik"]), "aliases": st.lists(texts, max_size=2)},
)
items = st.one_of(
    valid_items,
    valid_items,
    st.builds(
        _perturb,
        valid_items,
        st.sampled_from(["prompt", "messages", "answer", "aliases", "capability", "metric", "id"]),
        json_values,
        st.booleans(),
    ),
    st.dictionaries(
        st.sampled_from(["prompt", "messages", "answer", "aliases", "capability", "metric", "id"]),
        json_values,
        max_size=6,
    ),
)


@FUZZ
@given(rows=st.lists(valid_items, min_size=1, max_size=4) | st.lists(items, max_size=4), raw=tails)
@example(rows=[{"prompt": "q", "answer": "a", "capability": "c", "metric": ["x"]}], raw=b"")
@example(rows=[{"messages": [{"role": "assistant", "content": "x"}], "answer": 1, "capability": {}}], raw=b"")
def test_eval_reader(rows, raw):
    from gradian.evaluate import load_eval_set

    p = _write(".jsonl", "\n".join(_dump_line(r) for r in rows).encode() + raw)
    out = _only_user_errors(load_eval_set, p)
    assert out is None or isinstance(out, list)


# ---------------------------------------------------------------------- config readers (+ the config checks)
CONFIG_KEYS = [
    "learning_rate",
    "num_train_epochs",
    "num_epochs",
    "per_device_train_batch_size",
    "micro_batch_size",
    "gradient_accumulation_steps",
    "max_length",
    "max_seq_length",
    "sequence_len",
    "cutoff_len",
    "lora_r",
    "lora_rank",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "use_peft",
    "packing",
    "sample_packing",
    "adapter",
    "stage",
    "rl",
    "finetuning_type",
    "train_on_inputs",
    "train_on_prompt",
    "warmup_ratio",
    "warmup_steps",
    "max_steps",
    "datasets",
    "dataset",
    "model",
    "peft_config",
    "peft_type",
    "r",
    "target_modules",
    "base_model",
    "model_name_or_path",
    "dataset_name",
    "dataset_exact_deduplication",
    "messages_loss",
    "eval_strategy",
    "save_steps",
    "eval_steps",
    "load_best_model_at_end",
    "bf16",
    "fp16",
    "template",
    "quantization_bit",
    "optimizer",
    "epochs",
    "batch_size",
    "_component_",
    "completion_only_loss",
    "assistant_only_loss",
    "total_batch_size",
]
config_values = (
    st.floats(allow_nan=True, allow_infinity=True)
    | st.integers(-(10**400), 10**400)
    | st.sampled_from(
        [
            "2e-4",
            ".inf",
            "-1",
            "0",
            "dpo",
            "pt",
            "lora",
            "qlora",
            "true",
            "auto",
            "torchtune.datasets.alpaca_dataset",
            "torchtune.rlhf.loss.DPOLoss",
            "all",
        ]
    )
    | json_values
)
config_dicts = st.dictionaries(
    st.sampled_from(CONFIG_KEYS),
    config_values | st.dictionaries(st.sampled_from(CONFIG_KEYS), config_values, max_size=4),
    min_size=1,
    max_size=8,
)


def _yaml_text(d) -> str:
    import yaml

    try:
        return yaml.safe_dump(d, allow_unicode=True)
    except Exception:  # a value PyYAML cannot represent: fall back to JSON (also YAML)
        return _dump_line(d)


@FUZZ
@given(
    cfg=config_dicts,
    suffix=st.sampled_from([".yaml", ".json"]),
    raw=tails,
    noise=st.sampled_from(["", "", "", "a: &a [*a]\n", "x: 2024-13-45\n", "? [a]\n: b\n", "1: 2\n", "--- 1\n--- 2\n"]),
)
@example(
    cfg={"learning_rate": "2e-4", "num_train_epochs": math.inf, "use_peft": True}, suffix=".yaml", raw=b"", noise=""
)
@example(
    cfg={
        "learning_rate": -1,
        "num_train_epochs": 0,
        "per_device_train_batch_size": -8,
        "max_length": -1,
        "lora_r": 0,
        "use_peft": True,
    },
    suffix=".yaml",
    raw=b"",
    noise="",
)
@example(cfg={"learning_rate": 10**400, "lora_r": 1e300}, suffix=".json", raw=b"", noise="")
def test_config_readers_and_checks(cfg, suffix, raw, noise):
    from gradian.audit import diagnose, load_config

    text = (_dump_line(cfg) if suffix == ".json" else noise + _yaml_text(cfg)).encode("utf-8", "surrogatepass") + raw
    p = _write(suffix, text)
    c = _only_user_errors(load_config, [p])
    if c is not None:
        res = _only_user_errors(diagnose, configs=c)
        assert res is None or res.counts["checks"] > 0


# ---------------------------------------------------------------------- trainer-state reader (+ the log checks)
LOG_KEYS = [
    "loss",
    "eval_loss",
    "grad_norm",
    "learning_rate",
    "epoch",
    "step",
    "train_loss",
    "train_runtime",
    "train/loss",
    "global_step",
    "mean_token_accuracy",
]
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**6), 10**6)
log_values = (
    numbers | numbers | st.integers(-(10**20), 10**400) | st.sampled_from(["nan", "inf", "1e-4", "x"]) | json_values
)
log_entries = st.one_of(
    st.fixed_dictionaries(
        {"loss": numbers, "step": st.integers(0, 500)},
        optional={"epoch": numbers, "grad_norm": numbers, "learning_rate": numbers},
    ),
    st.fixed_dictionaries({"eval_loss": numbers, "step": st.integers(0, 500)}),
    st.dictionaries(st.sampled_from(LOG_KEYS), log_values, max_size=5),
)


@FUZZ
@given(
    entries=st.lists(log_entries, min_size=1, max_size=30)
    | st.lists(log_entries, min_size=1, max_size=30)
    | st.lists(log_entries, min_size=1, max_size=30)
    | st.lists(json_values, max_size=4),
    state=st.dictionaries(
        st.sampled_from(["global_step", "max_steps", "num_train_epochs", "log_history"]), log_values, max_size=3
    ),
    jsonl=st.booleans(),
    raw=tails,
)
@example(entries=[{"loss": 1.0, "step": math.inf}], state={}, jsonl=False, raw=b"")
@example(entries=[{"loss": 1.0, "step": 10**400}, {"loss": 2, "step": -5}], state={}, jsonl=True, raw=b"")
def test_trainer_state_reader_and_checks(entries, state, jsonl, raw):
    from gradian.audit import diagnose, load_logs

    if jsonl:
        p = _write(".jsonl", "\n".join(_dump_line(e) for e in entries).encode() + raw)
    else:
        p = _write(".json", _dump_line({**state, "log_history": entries}).encode() + raw)
    log = _only_user_errors(load_logs, p)
    if log is not None:
        _only_user_errors(diagnose, logs=log)


# ---------------------------------------------------------------------- gradian report's run.json loader
def _valid_run() -> dict:
    """The smallest run.json the report reads in full (every section present)."""
    finding = {
        "id": "D04",
        "name": "truncated",
        "title": "Rows longer than max_length",
        "severity": "error",
        "reads": ["data", "config", "tokenizer"],
        "message": "2 of 3 rows are truncated",
        "evidence": {"value": 0.66, "threshold": 0.02},
        "row_ids": ["a", "b"],
        "eval_row_ids": [],
        "steps": [],
        "fraction": 0.66,
        "fix": "raise max_length",
    }
    return {
        "schema": "gradian.run/1",
        "evaluation": {
            "capabilities": [
                {
                    "name": "capitals",
                    "metric": "exact_match",
                    "unit": "accuracy",
                    "n": 10,
                    "reference_score": 0.9,
                    "tuned_score": 0.4,
                    "delta": -0.5,
                    "ci_low": -0.8,
                    "ci_high": -0.2,
                    "confidence": 0.95,
                    "verdict": "regressed",
                    "diagnosed": True,
                    "reason": "the CI excludes zero",
                    "sign_test_p": 0.01,
                    "n_kept": 4,
                    "n_lost": 5,
                    "n_gained": 0,
                    "n_both_fail": 1,
                    "base_bounds": {
                        "qualifiers": ["base fails 1"],
                        "margins_available": True,
                        "failing": 5,
                        "thin_margin": 1,
                        "median_margin": 2.0,
                        "thin_margin_share": 0.2,
                    },
                }
            ],
            "notes": ["n"],
        },
        "audit": {
            "counts": {"error": 1, "warning": 0, "info": 0, "skipped": 0, "passed": 1, "checks": 2},
            "findings": [finding],
            "passed": ["D01"],
            "skipped": [{"id": "L01", "name": "nan_inf", "reason": "needs --logs"}],
            "notes": [],
        },
        "attribution": {
            "index": {"id": "x", "root": "/tmp/x", "reused": False, "n": 3, "blocks": 2, "dims": 8},
            "train_ids": ["a", "b", "c"],
            "train_meta": [{"format": "messages", "tokens": 9, "truncated": True, "n_supervised": 3}] * 3,
            "capabilities": [
                {
                    "capability": "capitals",
                    "n_train": 3,
                    "engine": "datainf",
                    "queries": [{"item_id": "q1", "kind": "contrastive"}],
                    "scores": [-1.0, 0.5, -0.2],
                    "ranked": [
                        {
                            "rank": 1,
                            "id": "a",
                            "score": -1.0,
                            "predicted_loss_delta_if_removed": -0.3,
                            "format": "messages",
                            "tokens": 9,
                            "truncated": True,
                            "prompt": "p",
                            "completion": "Paris.",
                        }
                    ],
                    "agreement": {
                        "engines": ["datainf", "graddot"],
                        "spearman": 0.9,
                        "topk_overlap": 1.0,
                        "k": 3,
                        "confidence": "high",
                    },
                    "clusters": [
                        {
                            "label": 0,
                            "size": 2,
                            "harmful_share": 0.9,
                            "score": -1.2,
                            "row_ids": ["a", "c"],
                            "exemplars": [{"id": "a", "completion": "Paris."}],
                            "common": {
                                "distinctive_words": [{"word": "paris"}],
                                "truncated_share": 1.0,
                                "missing_eos_share": 0.5,
                            },
                        }
                    ],
                    "drilldown": [
                        {
                            "id": "a",
                            "item_id": "q1",
                            "row_score_for_item": -1.0,
                            "sentences": [{"char_start": 0, "char_end": 6, "text": "Paris.", "score": -1.0}],
                            "top_sentence": {"char_start": 0, "char_end": 6, "text": "Paris.", "score": -1.0},
                        }
                    ],
                    "per_item_top": {"q1": [{"id": "a", "score": -1.0}]},
                    "failing_items": [
                        {
                            "id": "q1",
                            "prompt": "Capital?",
                            "answer": "Rome",
                            "tuned_answer": "Paris",
                            "margin": 0.5,
                            "thin_margin": True,
                            "query": "contrastive",
                        }
                    ],
                }
            ],
        },
        "manifest": {
            "run_id": "r1",
            "identity": {"index_id": "x", "dataset": {"name": "t", "sha256": "ab"}, "versions": {"gradian": "0"}},
            "paths": {},
            "notes": ["note"],
            "sign_convention": "negative = degraded",
        },
        "timing": {"total": 1.0},
    }


def test_the_valid_run_renders():
    """The fuzz starts from this run; it must be complete, or the mutations below test nothing."""
    from gradian.report import render, report_for_run

    d = Path(tempfile.mkdtemp(dir=_TMP))
    (d / "run.json").write_text(json.dumps(_valid_run()))
    rep = report_for_run(d)
    assert rep.status == "attributed" and rep.capabilities[0].attribution.clusters
    for fmt in ("md", "json", "html", "text"):
        assert render(rep, fmt)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


ALL_PATHS = [p for p in _paths(_valid_run()) if p]


@FUZZ
@given(
    mutations=st.lists(st.tuples(st.sampled_from(ALL_PATHS), st.booleans(), json_values), min_size=1, max_size=4),
    whole=st.none() | json_values,
)
@example(mutations=[(("evaluation",), False, {"capabilities": 3})], whole=None)
@example(mutations=[(("schema",), False, "gradian.run/1")], whole=[1, 2, 3])
def test_report_run_loader(mutations, whole):
    from gradian.report import render, report_for_run

    run = _valid_run()
    for path, delete, value in mutations:
        parent = run
        try:
            for k in path[:-1]:
                parent = parent[k]
            if delete and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = copy.deepcopy(value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced this path
    d = Path(tempfile.mkdtemp(dir=_TMP))
    (d / "run.json").write_text(_dump_line(whole if whole is not None and not isinstance(whole, dict) else run))
    rep = _only_user_errors(report_for_run, d, read_logs=False)
    if rep is not None:
        for fmt in ("md", "json", "text"):
            render(rep, fmt)
