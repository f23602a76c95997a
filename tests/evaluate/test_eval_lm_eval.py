"""lm-evaluation-harness ``--log_samples`` output as an eval set (gradian.evaluate.lm_eval)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from eval_world import evaluate_args
from typer.testing import CliRunner

from gradian.cli import app
from gradian.errors import GradianUserError
from gradian.evaluate import load_eval_set
from gradian.evaluate.items import model_prompt
from gradian.evaluate.lm_eval import LM_EVAL_FORMAT_VERSION

FIXTURE = Path(__file__).parent / "fixtures" / "lm_eval"
DATE = "2026-12-01T10-00-00.123456"
CHATML = (
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _copy(tmp_path) -> Path:
    d = tmp_path / "lm"
    shutil.copytree(FIXTURE, d)
    return d


def _results(d: Path) -> tuple[Path, dict]:
    p = d / f"results_{DATE}.json"
    return p, json.loads(p.read_text())


def _lines(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def _write_lines(p: Path, recs: list) -> None:
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in recs))


def test_fixture_folder_reads_as_two_capabilities():
    items = load_eval_set(FIXTURE)
    assert LM_EVAL_FORMAT_VERSION == "0.4.13"
    caps = [i for i in items if i.capability == "capitals"]
    mc = [i for i in items if i.capability == "symbols_mc"]
    # two filters log each capitals doc twice: one item per doc_id
    assert [i.id for i in caps] == ["capitals/0", "capitals/1", "capitals/2", "capitals/3"]
    # gsm8k's regexes_to_ignore ("(?s).*#### " etc.) applied to the target, as lm-eval compares it
    assert [i.answer for i in caps] == ["Marven", "Quisto", "Tressa", "Olvey"]
    assert caps[0].prompt == "What is the capital of Aland?" and caps[0].metric == "exact_match"
    assert caps[0].where.endswith(f"samples_capitals_{DATE}.jsonl:1")
    # multiple choice: the gold choice's context and continuation, scored by loglik
    assert [(i.prompt, i.answer, i.metric) for i in mc] == [
        ("What is the symbol of argonite?", " Ag", "loglik"),
        ("What is the symbol of borite?", " Bx", "loglik"),
        ("What is the symbol of cobrium?", " Cb", "loglik"),
    ]
    # no chat template in results: prompts stay as rendered, never wrapped in the tuned model's template
    assert all(i.raw for i in items)

    class Tok:
        chat_template = "{{ messages }}"

    assert model_prompt(caps[0].prompt, Tok(), use_chat_template=not caps[0].raw) == caps[0].prompt
    assert model_prompt("q", Tok(), use_chat_template=True) == [{"role": "user", "content": "q"}]


def test_one_samples_file_and_model_subfolder(tmp_path):
    items = load_eval_set(FIXTURE / f"samples_symbols_mc_{DATE}.jsonl")
    assert {i.capability for i in items} == {"symbols_mc"} and len(items) == 3
    # lm-eval writes into <output_path>/<model_name_sanitized>/: the parent folder works too
    shutil.copytree(FIXTURE, tmp_path / "out" / "tiny-adapter")
    assert [i.id for i in load_eval_set(tmp_path / "out")] == [i.id for i in load_eval_set(FIXTURE)]


def test_gradian_file_with_lm_eval_like_fields_is_read_as_before(tmp_path):
    p = tmp_path / "eval.jsonl"
    rec = {"prompt": "q?", "answer": "a", "capability": "c", "doc_id": 1, "target": "x", "arguments": {}}
    _write_lines(p, [rec, dict(rec, prompt="r?")])
    items = load_eval_set(p)
    assert [i.id for i in items] == ["0", "1"] and not items[0].raw


def test_chat_template_rebuilds_messages_with_the_system_prompt(tmp_path):
    d = _copy(tmp_path)
    rp, res = _results(d)
    res.update(chat_template=CHATML, chat_template_sha="x", system_instruction="Answer with one word.")
    rp.write_text(json.dumps(res))
    sp = d / f"samples_capitals_{DATE}.jsonl"
    recs = _lines(sp)
    for r in recs:
        q = r["arguments"]["gen_args_0"]["arg_0"]
        r["arguments"]["gen_args_0"]["arg_0"] = (
            f"<|im_start|>system\nAnswer with one word.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"
            "<|im_start|>assistant\n"
        )
    for r in (recs[3], recs[7]):  # doc 3 under both filters: not a generation prompt at the end, so kept raw
        r["arguments"]["gen_args_0"]["arg_0"] += "Sure:"
    _write_lines(sp, recs)
    items = {i.id: i for i in load_eval_set(sp)}
    assert items["capitals/0"].prompt == [
        {"role": "system", "content": "Answer with one word."},
        {"role": "user", "content": "What is the capital of Aland?"},
    ]
    assert not items["capitals/0"].raw
    assert items["capitals/3"].raw and items["capitals/3"].prompt.endswith("assistant\nSure:")


def test_chat_split_not_confirmed_by_the_template_stays_raw(tmp_path):
    d = _copy(tmp_path)
    rp, res = _results(d)
    res["chat_template"] = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"  # renders differently
    rp.write_text(json.dumps(res))
    sp = d / f"samples_capitals_{DATE}.jsonl"
    recs = _lines(sp)
    text = "<|im_start|>user\nWhat is the capital of Aland?<|im_end|>\n<|im_start|>assistant\n"
    recs[0]["arguments"]["gen_args_0"]["arg_0"] = text
    recs[4]["arguments"]["gen_args_0"]["arg_0"] = text  # the same doc under the second filter
    _write_lines(sp, recs)
    it = load_eval_set(sp)[0]
    assert it.raw and it.prompt == text


@pytest.mark.parametrize(
    "metric_list,needle",
    [
        ([{"metric": "bleu", "aggregation": "bleu"}], "lm-eval metric bleu of task 'capitals' is not supported"),
        ([{"metric": "f1"}, {"metric": "rouge1"}], "lm-eval metric f1, rouge1"),
    ],
)
def test_refused_generation_metric_is_one_line(tmp_path, metric_list, needle):
    d = _copy(tmp_path)
    rp, res = _results(d)
    res["configs"]["capitals"]["metric_list"] = metric_list
    rp.write_text(json.dumps(res))
    with pytest.raises(GradianUserError) as ei:
        load_eval_set(d)
    msg = str(ei.value)
    assert needle in msg and "exact_match" in msg and "configs.capitals" in msg and "\n" not in msg
    out = CliRunner().invoke(app, ["evaluate", "--base", "b", "--adapter", "a", "--eval", str(d)])
    lines = [ln for ln in out.output.strip().splitlines() if ln.strip()]
    assert out.exit_code == 2 and len(lines) == 1 and needle in lines[0], out.output


def test_refused_output_type(tmp_path):
    d = _copy(tmp_path)
    rp, res = _results(d)
    res["configs"]["symbols_mc"]["output_type"] = "loglikelihood_rolling"
    rp.write_text(json.dumps(res))
    with pytest.raises(GradianUserError, match="output_type 'loglikelihood_rolling' of task 'symbols_mc'"):
        load_eval_set(d)


@pytest.mark.parametrize(
    "edit,needle",
    [
        (lambda r: r.pop("arguments"), "missing field 'arguments'"),
        (lambda r: r["arguments"]["gen_args_1"].pop("arg_0"), "'arguments.gen_args_1.arg_0'"),
        (lambda r: r.update(target="7"), "field 'target' '7' is neither a choice index (0..2)"),
        (lambda r: r.update(target="Zz"), "field 'target' 'Zz' is neither a choice index"),
    ],
    ids=["no-arguments", "no-arg0", "index-out-of-range", "not-a-choice"],
)
def test_malformed_sample_names_file_line_and_field(tmp_path, edit, needle):
    d = _copy(tmp_path)
    sp = d / f"samples_symbols_mc_{DATE}.jsonl"
    recs = _lines(sp)
    edit(recs[1])
    _write_lines(sp, recs)
    with pytest.raises(GradianUserError) as ei:
        load_eval_set(sp)
    assert ei.value.where == f"{sp}:2" and needle in str(ei.value), str(ei.value)


def test_bad_json_line_and_missing_results(tmp_path):
    d = _copy(tmp_path)
    sp = d / f"samples_capitals_{DATE}.jsonl"
    _write_lines(sp, [*_lines(sp)[:2], "{not json"])
    with pytest.raises(GradianUserError) as ei:
        load_eval_set(d)
    assert ei.value.where == f"{sp}:3" and "not JSON" in str(ei.value)
    (d / f"results_{DATE}.json").unlink()
    with pytest.raises(GradianUserError, match=f"no lm-eval results file \\(results_{DATE}.json\\)"):
        load_eval_set(sp)


def test_same_doc_with_a_different_target_under_another_filter_is_refused(tmp_path):
    d = _copy(tmp_path)
    sp = d / f"samples_capitals_{DATE}.jsonl"
    recs = _lines(sp)
    recs[5]["target"] = "#### Elsewhere"
    _write_lines(sp, recs)
    with pytest.raises(GradianUserError) as ei:
        load_eval_set(sp)
    assert ei.value.where == f"{sp}:6" and "doc_id 1 is logged again (filter 'flexible-extract')" in str(ei.value)


def test_cli_evaluate_on_the_lm_eval_folder(eval_world, tmp_path):
    out = tmp_path / "result.json"
    res = CliRunner().invoke(
        app,
        evaluate_args(eval_world, FIXTURE, out, resamples=1000),
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    caps = {c["name"]: c for c in d["capabilities"]}
    assert set(caps) == {"capitals", "symbols_mc"}
    assert caps["capitals"]["n"] == 4 and caps["symbols_mc"]["n"] == 3
    assert caps["symbols_mc"]["unit"] == "nats" and caps["capitals"]["unit"] == "accuracy"
    items = {i["id"]: i for i in d["items"]}
    # the tiny tokenizer has a chat template, but lm-eval's rendered prompt is run as it was rendered
    assert items["capitals/0"]["model_prompt"] == "What is the capital of Aland?" and not items["capitals/0"]["chat"]
    assert items["symbols_mc/0"]["answer"] == " Ag"


def test_run_identity_hashes_the_samples_files(tmp_path):
    """An lm-eval folder's identity covers its samples files, not only results_*.json: an edited sample (a changed
    target), or an edited task config, gives another eval sha256 in the run identity."""
    from gradian.index.identity import dataset_identity, file_hash
    from gradian.util import sha256_json

    d = _copy(tmp_path)
    before = dataset_identity(d)["sha256"]
    assert before == dataset_identity(_copy(tmp_path / "again"))["sha256"]  # content, not path
    sp = d / f"samples_capitals_{DATE}.jsonl"
    recs = _lines(sp)
    recs[0]["target"] = recs[0]["target"] + " (edited)"
    _write_lines(sp, recs)
    after_sample = dataset_identity(d)["sha256"]
    assert after_sample != before
    res, obj = _results(d)
    obj["configs"]["capitals"]["metric_list"] = obj["configs"]["capitals"].get("metric_list", []) + [{}]
    res.write_text(json.dumps(obj))
    assert dataset_identity(d)["sha256"] not in (before, after_sample)
    # one samples file: it and the results file beside it
    one = dataset_identity(sp)["sha256"]
    assert one == sha256_json({sp.name: file_hash(sp), res.name: file_hash(res)}) and one != file_hash(sp)
    # a Gradian eval file keeps the sha256 of its bytes
    g = tmp_path / "eval.jsonl"
    _write_lines(g, [{"prompt": "q?", "answer": "a", "capability": "c"}])
    assert dataset_identity(g)["sha256"] == file_hash(g)


def test_run_manifest_eval_identity_and_changed_inputs(tmp_path):
    """The run's manifest records the folder's hash with the samples, and a later edit of a sample is reported as a
    changed eval set (gradian verify / report refuse or warn on it)."""
    from gradian.attribute.changes import eval_sha
    from gradian.index.identity import dataset_identity

    d = _copy(tmp_path)
    assert eval_sha(d) == dataset_identity(d)["sha256"]
    sp = d / f"samples_symbols_mc_{DATE}.jsonl"
    recs = _lines(sp)
    recs[-1]["doc_id"] = 999
    _write_lines(sp, recs)
    assert eval_sha(d) != dataset_identity(_copy(tmp_path / "orig"))["sha256"]
