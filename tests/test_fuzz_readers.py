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
import shutil
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gradian.errors import GradianUserError  # noqa: E402
from gradian_testlib import fuzz_scalars, fuzz_settings, json_paths  # noqa: E402

#: examples per reader (the budget keeps the whole module at about 20 s on a busy 2-core machine)
N, FUZZ = fuzz_settings(120, "large_base_example")

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
scalars = fuzz_scalars(
    12,
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
    ],
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


_TMP = tempfile.mkdtemp(prefix="gradian_fuzz_")  # module-wide (hypothesis examples cannot take tmp_path)


@pytest.fixture(scope="module", autouse=True)
def _remove_tmp():
    """The module's scratch folder goes when its tests are done (it was left in /tmp by every run, 5 MB each)."""
    yield
    shutil.rmtree(_TMP, ignore_errors=True)


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


ALL_PATHS = [p for p in json_paths(_valid_run()) if p]


@FUZZ
@given(
    mutations=st.lists(st.tuples(st.sampled_from(ALL_PATHS), st.booleans(), json_values), min_size=1, max_size=4),
    whole=st.none() | json_values,
)
@example(mutations=[(("evaluation",), False, {"capabilities": 3})], whole=None)
@example(mutations=[(("schema",), False, "gradian.run/1")], whole=[1, 2, 3])
# found by this fuzz: a ranked row's number of another type passed the schema and failed in the Markdown table
@example(
    mutations=[(("attribution", "capabilities", 0, "ranked", 0, "predicted_loss_delta_if_removed"), False, [])],
    whole=None,
)
@example(mutations=[(("attribution", "capabilities", 0, "ranked", 0, "support"), False, {"gradient": 1})], whole=None)
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


# ---------------------------------------------------------------------- a training run's own files
# trainer_state.json in every checkpoint, optimizer.pt, adapter_model.bin: the numbers in them weigh the
# checkpoints and precondition the gradients, so each must be checked before use (issue 21).
torch = pytest.importorskip("torch")

_LORA_SHAPES = {"q_proj": (3, 4), "v_proj": (4, 4)}  # (out, in) of the tiny base's targeted layers
_R = 2


class _TinyBase(torch.nn.Module):
    """Two Linear layers PEFT can target: a base small enough to build for every example."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        for name, (o, i) in _LORA_SHAPES.items():
            setattr(self, name, torch.nn.Linear(i, o, bias=False))

    def forward(self, x):  # pragma: no cover - never run
        return self.v_proj(x)


def _lora_tensors(seed: int) -> dict:
    """The adapter's tensors under PEFT's saved names: lora_A (r, in), lora_B (out, r)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (o, i) in _LORA_SHAPES.items():
        out[f"base_model.model.{name}.lora_A.weight"] = torch.randn(_R, i, generator=g)
        out[f"base_model.model.{name}.lora_B.weight"] = torch.randn(o, _R, generator=g)
    return out


_ADAPTER_CFG = {"peft_type": "LORA", "r": _R, "lora_alpha": 4, "target_modules": sorted(_LORA_SHAPES)}


def _write_adapter(folder: Path, seed: int) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(_ADAPTER_CFG))
    save_file(_lora_tensors(seed), str(folder / "adapter_model.safetensors"))
    return folder


_RUN = Path(_TMP) / "run" / "adapter"  # the final adapter, with checkpoint-10 and checkpoint-20 inside
_RUN_FOLDERS = {"final": _write_adapter(_RUN, 3)}
for _s in (10, 20):
    _RUN_FOLDERS[f"checkpoint-{_s}"] = _write_adapter(_RUN / f"checkpoint-{_s}", _s)

state_numbers = (
    st.integers(0, 40)
    | st.floats(0, 1e-2)
    | numbers
    | st.sampled_from([0, 0.0, -0.0, 1e-300, 1.7e308, -1e-4, 10**400, True, "nan", "1e-4", None])
)
state_entries = st.one_of(
    st.fixed_dictionaries(
        {"step": st.integers(0, 40), "learning_rate": st.floats(0, 1e-2), "loss": st.floats(0, 5)},
        optional={"epoch": st.floats(0, 3)},
    ),
    st.fixed_dictionaries(
        {"step": state_numbers, "learning_rate": state_numbers, "loss": numbers},
        optional={"epoch": state_numbers, "eval_loss": numbers},
    ),
    st.dictionaries(st.sampled_from(["step", "learning_rate", "epoch", "loss", "eval_loss"]), log_values, max_size=4),
    json_values,
)
trainer_states = st.one_of(
    st.none(),  # no trainer_state.json in this folder
    st.fixed_dictionaries(
        {"log_history": st.lists(state_entries, max_size=12)},
        optional={"global_step": state_numbers, "epoch": state_numbers, "max_steps": state_numbers},
    ),
    st.fixed_dictionaries({"log_history": st.lists(state_entries.filter(lambda e: isinstance(e, dict)), max_size=12)}),
    json_values,
)
_DEEP_STATE = '{"log_history": ' + _deep(100_000) + "}"


@FUZZ
@given(
    states=st.fixed_dictionaries({k: trainer_states for k in _RUN_FOLDERS}),
    weighting=st.sampled_from(["lr", "lr", "equal"]),
    deep=st.sampled_from([None, None, None, None, "final", "checkpoint-10"]),
)
@example(
    states={
        "final": {"log_history": [{"step": 15, "learning_rate": math.inf}, {"step": 25, "learning_rate": 1e-3}]},
        "checkpoint-10": None,
        "checkpoint-20": None,
    },
    weighting="lr",
    deep=None,
)
@example(
    states={
        "final": {"log_history": [{"step": 5, "learning_rate": 1e-3}, {"step": 25, "learning_rate": -1e-4}]},
        "checkpoint-10": None,
        "checkpoint-20": None,
    },
    weighting="lr",
    deep=None,
)
@example(states={"final": [1, 2], "checkpoint-10": None, "checkpoint-20": [3]}, weighting="lr", deep=None)
@example(states={"final": None, "checkpoint-10": None, "checkpoint-20": None}, weighting="lr", deep="checkpoint-10")
def test_checkpoint_trainer_states(states, weighting, deep):
    """Every checkpoint's trainer_state.json through the trajectory reader (the checkpoint weights) and Audit's."""
    from gradian.attribute.trajectory import resolve_trajectory
    from gradian.audit import diagnose, load_logs

    for name, folder in _RUN_FOLDERS.items():
        p = folder / "trainer_state.json"
        p.unlink(missing_ok=True)
        if name == deep:
            p.write_text(_DEEP_STATE)
        elif states[name] is not None:
            p.write_text(_dump_line(states[name]))
    traj = _only_user_errors(resolve_trajectory, _RUN, "auto", weighting=weighting)
    if traj is not None:
        w = traj.weights
        assert all(isinstance(x, float) and math.isfinite(x) and x >= 0 for x in w), w
        assert abs(sum(w) - 1) < 1e-9, w
    for folder in _RUN_FOLDERS.values():
        if (folder / "trainer_state.json").exists():
            log = _only_user_errors(load_logs, folder)
            if log is not None:
                _only_user_errors(diagnose, logs=log)


def _peft_model():
    from peft import LoraConfig, get_peft_model

    from gradian.models.load import prepare_lora_for_gradients

    pm = get_peft_model(_TinyBase(), LoraConfig(r=_R, lora_alpha=4, target_modules=sorted(_LORA_SHAPES)))
    prepare_lora_for_gradients(pm)
    return pm


_MODEL = _peft_model()
_BLOCK_SHAPES = [(_R, 4), (3, _R), (_R, 4), (4, _R)]  # q_proj A, B, v_proj A, B: named_parameters order

dtypes = st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool])
shapes = st.sampled_from(_BLOCK_SHAPES + [(), (1,), (2, 2), (0, 4), (_R, 4, 1)])
fills = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, 1.0, -1.0, 1e-300, 1e300])


def _tensor(shape, dtype, fill, noise):
    t = torch.full(shape, fill, dtype=torch.float64)
    if noise:
        t = t + torch.randn(shape, generator=torch.Generator().manual_seed(noise), dtype=torch.float64)
    return t.to(dtype)


tensors = st.builds(_tensor, shapes, dtypes, fills, st.integers(0, 3))
#: tensors that fit a LoRA matrix, mostly sound (float, finite), some not: the values a real file could hold
fitting_tensors = st.builds(
    _tensor,
    st.sampled_from(_BLOCK_SHAPES),
    st.sampled_from([torch.float32, torch.float32, torch.float64, torch.bfloat16, torch.int64]),
    st.sampled_from([0.0, 0.0, 1e-3, 1.0, -1.0, 1e-300, 1e300, math.nan, math.inf]),
    st.integers(0, 3),
)
torch_values = st.one_of(
    tensors,
    scalars,
    st.lists(scalars, max_size=3),
    st.tuples(scalars, scalars),
    st.builds(torch.tensor, st.floats(allow_nan=True, allow_infinity=True)),
    st.dictionaries(st.sampled_from(["exp_avg", "exp_avg_sq", "step", "params"]), tensors | scalars, max_size=3),
)


def _valid_adam(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    state = {
        i: {"step": torch.tensor(7.0), "exp_avg": torch.randn(s, generator=g), "exp_avg_sq": torch.rand(s, generator=g)}
        for i, s in enumerate(_BLOCK_SHAPES)
    }
    groups = [
        {"params": [0, 1, 2, 3], "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
        {"params": [], "lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0},
    ]
    return {"state": state, "param_groups": groups}


ADAM_LEAVES = [("state", i, k) for i in range(4) for k in ("exp_avg", "exp_avg_sq", "step")]
ADAM_PATHS = [
    *ADAM_LEAVES,
    *[("state", i) for i in range(4)],
    *[("param_groups", 0, k) for k in ("betas", "eps", "params")],
    ("param_groups", 0, "params", 0),
    ("param_groups", 0, "betas", 0),
    ("param_groups", 0, "betas", 1),
    ("param_groups", 1, "params"),
    ("param_groups", 0),
    ("state",),
    ("param_groups",),
]


def _mutate(obj, path, value):
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if not isinstance(parent, (dict, list)):  # a tuple (betas), or an earlier mutation put a scalar/tensor here
        return
    parent[path[-1]] = value


@FUZZ
@given(
    mutations=st.lists(
        st.tuples(st.sampled_from(ADAM_LEAVES), fitting_tensors | state_numbers)
        | st.tuples(st.sampled_from(ADAM_LEAVES), fitting_tensors)
        | st.tuples(st.sampled_from(ADAM_PATHS), torch_values),
        max_size=3,
    ),
    betas=st.none()
    | st.none()
    | st.tuples(state_numbers, state_numbers)
    | st.tuples(st.floats(0, 1), st.floats(0, 1))
    | st.tuples(st.floats(0, 1).map(torch.tensor), st.floats(0.9, 1)),
    whole=st.tuples(st.booleans(), st.booleans(), torch_values).map(lambda t: t[2] if t[0] and t[1] else None),
    seed=st.integers(0, 3),
)
@example(mutations=[(("state", 0, "exp_avg"), 1.0)], betas=None, whole=None, seed=0)
@example(mutations=[(("param_groups", 0, "params", 0), "a")], betas=None, whole=None, seed=0)
@example(mutations=[], betas=("x", "y"), whole=None, seed=0)
@example(mutations=[], betas=(1, 1), whole=None, seed=0)
@example(mutations=[(("state", 0, "step"), -1)], betas=None, whole=None, seed=0)
@example(mutations=[(("param_groups", 0, "eps"), math.nan)], betas=None, whole=None, seed=0)
@example(
    mutations=[(("param_groups", 0, "eps"), 1e-300), (("state", 0, "exp_avg_sq"), 0.0)], betas=None, whole=None, seed=0
)
def test_optimizer_pt(mutations, betas, whole, seed):
    """Random optimizer state dicts (torch.save) through the Adam preconditioner's loader (weights_only) and its
    update: a finite preconditioned gradient, or one line naming optimizer.pt."""
    from gradian.gradients.adam import read_adam_state

    sd = _valid_adam(seed)
    if betas is not None:
        sd["param_groups"][0]["betas"] = betas
    for path, value in mutations:
        try:
            _mutate(sd, path, copy.deepcopy(value))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced this path
    p = _write(".pt", b"")
    torch.save(whole if whole is not None else sd, p)
    states = _only_user_errors(read_adam_state, p, _MODEL)
    if states is None:
        return
    gen = torch.Generator().manual_seed(seed)
    for s in states.values():
        assert torch.isfinite(s.exp_avg).all() and torch.isfinite(s.exp_avg_sq).all() and (s.exp_avg_sq >= 0).all()
        assert 0 <= s.beta1 < 1 and 0 <= s.beta2 < 1 and s.eps > 0 and math.isfinite(s.eps) and s.step >= 0
        g = torch.randn(2, *s.exp_avg.shape, generator=gen, dtype=torch.float64)
        u = _only_user_errors(s.update, g)
        assert u is None or bool(torch.isfinite(u).all())


adapter_objects = st.one_of(
    st.builds(lambda s: _lora_tensors(s), st.integers(0, 3)),
    st.builds(
        lambda s, k, v: {**_lora_tensors(s), k: v},
        st.integers(0, 3),
        st.sampled_from(sorted(_lora_tensors(0))),
        fitting_tensors,
    ),
    st.builds(
        lambda s, k, v: {**_lora_tensors(s), k: v},
        st.integers(0, 3),
        st.sampled_from(sorted(_lora_tensors(0))) | st.text(max_size=8),
        torch_values,
    ),
    st.builds(lambda s, k: {**_lora_tensors(s), k: torch.zeros(1)}, st.integers(0, 3), st.integers() | st.none()),
    torch_values,
    st.lists(tensors, max_size=3),
)


@FUZZ
@given(obj=adapter_objects)
@example(obj=[1, 2, 3])
@example(obj={"base_model.model.q_proj.lora_A.weight": torch.tensor(1.0)})
@example(obj={**_lora_tensors(0), "base_model.model.q_proj.lora_A.weight": torch.full((_R, 4), math.nan)})
def test_adapter_model_bin(obj):
    """Random torch-saved objects as adapter_model.bin through the adapter loader (weights_only), its checks
    against the base, and PEFT's load: a loaded adapter or one line."""
    from gradian.models.load import load_adapter, read_adapter_weights

    d = Path(tempfile.mkdtemp(dir=_TMP))
    (d / "adapter_config.json").write_text(json.dumps(_ADAPTER_CFG))
    torch.save(obj, d / "adapter_model.bin")
    w = _only_user_errors(read_adapter_weights, d)
    if w is not None:
        assert isinstance(w, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in w.items())
        assert all(torch.isfinite(v).all() for v in w.values())
    _only_user_errors(load_adapter, _TinyBase(), d)
