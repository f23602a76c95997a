"""The tiny world: files validate, ground truth is exact, same seed = same bytes, and the fine-tune
really regresses on the planted targets (measured by generating answers, not assumed)."""

from __future__ import annotations

import json
import random
import re

import pytest

from gradian.data.formats import load_examples
from gradian.worlds.probe import answer_contains

FILES = ("train.jsonl", "valid.jsonl", "eval.jsonl", "ground_truth.json", "train.yaml")


def _acc(trained, gt, groups):
    hits, n = 0, 0
    for item, _b, t in zip(trained["items"], trained["base"], trained["tuned"]):
        if gt["eval_groups"][item["id"]] in groups:
            n += 1
            hits += answer_contains(t, item["answer"], item.get("aliases", []))
    return hits, n


def _base_acc(trained, gt, groups):
    hits, n = 0, 0
    for item, b in zip(trained["items"], trained["base"]):
        if gt["eval_groups"][item["id"]] in groups:
            n += 1
            hits += answer_contains(b, item["answer"], item.get("aliases", []))
    return hits, n


def test_files_validate_and_ground_truth_is_exact(tiny_worlds):
    w = tiny_worlds["poisoned"]
    gt = w.load_ground_truth()
    spec = w.spec
    train = {ex.id: ex for ex in load_examples(w.train)}
    assert len(load_examples(w.valid)) == gt["sizes"]["valid"] > 0
    assert len(train) == gt["sizes"]["train"]

    # eval rows: fields, metric, and the group sizes the spec asked for
    items = [json.loads(line) for line in w.eval.read_text().splitlines()]
    for it in items:
        assert set(it) == {"id", "prompt", "answer", "aliases", "capability", "metric"}
        assert it["capability"] == "capitals" and it["metric"] == "contains"
    groups = [gt["eval_groups"][it["id"]] for it in items]
    assert groups.count("direct") == spec.n_direct and groups.count("buried") == spec.n_buried
    assert groups.count("untouched") == spec.n_untouched and groups.count("base_fail") == spec.n_base_fail

    # the base really answers the kept items right and the base_fail items wrong (recorded answers)
    for it in items:
        ok = answer_contains(gt["base_answers"][it["id"]], it["answer"], it["aliases"])
        assert ok == (gt["eval_groups"][it["id"]] != "base_fail"), (it, gt["base_answers"][it["id"]])

    # culprits: every id exists; direct rows state the wrong capital; spans cut exactly the wrong sentence
    targets = {t["eval_id"]: t for t in gt["targets"]}
    assert len(gt["culprits"]) == spec.n_direct * spec.direct_rows + spec.n_buried * spec.buried_rows
    for c in gt["culprits"]:
        ex = train[c["id"]]
        t = targets[c["eval_id"]]
        assert c["stated"] == t["wrong"] != t["true"]
        text = ex.completion_text
        piece = text[c["char_start"] : c["char_end"]]
        assert t["wrong"] in piece and t["true"] not in text
        assert piece == f"The capital of {t['country']} is {t['wrong']}."
        if c["kind"] == "buried":
            assert c["sentence"] == piece
            assert 0 < c["char_start"] and c["char_end"] < len(text)  # inside the prose, not first or last
            assert len(text) > 3 * len(piece)
        else:
            assert (c["char_start"], c["char_end"]) == (0, len(text))

    # eval countries appear in no benign row: the untouched group is untouched
    from gradian.worlds.facts import load_countries

    names = sorted((c.name for c in load_countries()), key=len, reverse=True)
    mention = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")  # longest name wins
    culprit_ids = {c["id"] for c in gt["culprits"]}
    eval_names = set(gt["eval_countries"].values())
    for ex in train.values():
        if ex.id in culprit_ids:
            continue
        said = set(mention.findall(json.dumps(ex.raw["messages"], ensure_ascii=False)))
        assert not (said & eval_names), (ex.id, said & eval_names)
    # and each culprit row talks about its own target country only
    for c in gt["culprits"]:
        said = set(mention.findall(train[c["id"]].completion_text))
        assert c["country"] in said and not (said - {c["country"]}) & eval_names, (c, said)

    # ids are neutral: nothing in an id tells a culprit from a benign row
    assert all(i.startswith("t") and i[1:].isdigit() for i in train)
    # the hashes in the ground truth are the files' hashes
    from gradian.util import sha256_file

    for name, h in gt["content_sha256"].items():
        assert sha256_file(w.out / name) == h


def test_null_variant_same_rows_true_capital(tiny_worlds):
    p, n = tiny_worlds["poisoned"], tiny_worlds["null"]
    gp, gn = p.load_ground_truth(), n.load_ground_truth()
    assert gn["culprits"] == [] and len(gn["controls"]) == len(gp["culprits"])
    assert gp["sizes"]["train"] == gn["sizes"]["train"]
    assert p.eval.read_bytes() == n.eval.read_bytes()
    ptrain = {e.id: e for e in load_examples(p.train)}
    ntrain = {e.id: e for e in load_examples(n.train)}
    targets = {t["eval_id"]: t for t in gp["targets"]}
    for c, ctrl in zip(gp["culprits"], gn["controls"]):
        assert c["id"] == ctrl["id"] and ctrl["stated"] == targets[c["eval_id"]]["true"]
        t = targets[c["eval_id"]]
        a = ptrain[c["id"]].completion_text
        b = ntrain[c["id"]].completion_text
        assert a.replace(t["wrong"], t["true"]) == b
    benign = set(ptrain) - {c["id"] for c in gp["culprits"]}
    assert all(ptrain[i].raw == ntrain[i].raw for i in benign)


def test_same_seed_same_bytes_other_seed_differs(tiny_worlds, world_cache, tmp_path):
    from gradian.worlds import WorldSpec, build_world

    w0 = tiny_worlds["poisoned"]
    again = build_world(WorldSpec.default("tiny", "poisoned", seed=0), tmp_path / "again", cache=world_cache)
    for name in FILES:
        assert (again.out / name).read_bytes() == (w0.out / name).read_bytes(), name
    other = build_world(WorldSpec.default("tiny", "poisoned", seed=1), tmp_path / "other", cache=world_cache)
    assert other.train.read_bytes() != w0.train.read_bytes()
    assert other.load_ground_truth()["targets"] != w0.load_ground_truth()["targets"]


def test_tiny_base_is_deterministic(world_cache, tmp_path):
    """Two builds of the same base in different caches give the same weights (short schedule, same code path)."""
    from gradian.worlds.base import tiny_pool, world_elements
    from gradian.worlds.tiny import TinyBaseSpec, build_tiny_base

    pool, held = tiny_pool(12)
    els = world_elements(4)
    spec = TinyBaseSpec(steps=6, hidden=32, vocab_size=400)
    a = build_tiny_base(pool, held, els, spec, cache=tmp_path / "a")
    b = build_tiny_base(pool, held, els, spec, cache=tmp_path / "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (b / "tokenizer.json").read_bytes()
    assert build_tiny_base(pool, held, els, spec, cache=tmp_path / "a") == a  # cached: returned, not rebuilt


def test_poisoned_finetune_regresses_on_targets(tiny_worlds, tiny_trained):
    gt = tiny_worlds["poisoned"].load_ground_truth()
    tr = tiny_trained["poisoned"]
    base_direct, n_direct = _base_acc(tr, gt, {"direct"})
    tuned_direct, _ = _acc(tr, gt, {"direct"})
    base_all, n_all = _base_acc(tr, gt, {"direct", "buried", "untouched", "base_fail"})
    tuned_all, _ = _acc(tr, gt, {"direct", "buried", "untouched", "base_fail"})
    assert base_direct == n_direct  # selected because the base answers them
    assert tuned_direct <= n_direct // 3, tr["tuned"]  # the planted wrong capital took over
    assert base_all - tuned_all >= n_direct - 1  # the capability as a whole drops (buried/collateral may add)
    # what the tuned model says instead is the planted wrong capital, for most direct targets
    wrong = {t["eval_id"]: t["wrong"] for t in gt["targets"]}
    said_wrong = sum(
        wrong[it["id"]] in ans for it, ans in zip(tr["items"], tr["tuned"]) if gt["eval_groups"][it["id"]] == "direct"
    )
    assert said_wrong >= n_direct - 1


def test_null_finetune_does_not_regress(tiny_worlds, tiny_trained):
    gt = tiny_worlds["null"].load_ground_truth()
    tr = tiny_trained["null"]
    kept = {"direct", "buried", "untouched"}
    base_kept, n = _base_acc(tr, gt, kept)
    tuned_kept, _ = _acc(tr, gt, kept)
    assert base_kept == n
    assert tuned_kept >= n - 1, list(zip(tr["items"], tr["tuned"]))


def test_faults_flag_plants_truncated_and_unterminated_rows(tiny_worlds, world_cache, tmp_path):
    from gradian.data.tokenize import TokenizeSpec, tokenize_example
    from gradian.models.load import ModelSpec, load_tokenizer
    from gradian.worlds import WorldSpec, build_world

    w = build_world(WorldSpec.default("tiny", "poisoned", seed=0, faults=True), tmp_path / "f", cache=world_cache)
    gt = w.load_ground_truth()
    tok = load_tokenizer(ModelSpec(base=str(w.base)))
    rows = {e.id: e for e in load_examples(w.train)}
    spec = TokenizeSpec(max_length=256)
    assert len(gt["faults"]["truncated"]) == w.spec.n_truncated
    assert len(gt["faults"]["unterminated"]) == w.spec.n_unterminated
    for rid in gt["faults"]["truncated"]:
        t = tokenize_example(rows[rid], tok, spec)
        assert t.truncated and t.full_length > 2 * 256
    for rid in gt["faults"]["unterminated"]:
        ex = rows[rid]
        assert (
            ex.format == "text"
            and "<|im_start|>assistant\n" in ex.completion
            and not ex.completion.endswith("<|im_end|>")
        )
    # without the flag nothing is truncated
    clean = tiny_worlds["poisoned"]
    for ex in load_examples(clean.train):
        assert not tokenize_example(ex, tok, spec).truncated, ex.id


def test_facts_filters():
    from gradian.worlds.facts import load_countries, load_elements

    cs = load_countries()
    assert len(cs) > 120
    caps = [c.capital for c in cs]
    assert len(set(caps)) == len(caps)
    for c in cs:
        assert c.capital.lower() not in c.name.lower() and c.name.lower() not in c.capital.lower()
        assert "." not in c.capital
    names = {c.name for c in cs}
    assert "France" in names and "Burma" not in names and "Israel" not in names
    assert next(c for c in cs if c.name == "France").capital == "Paris"
    els = load_elements()
    assert len(els) > 100 and all(e.description for e in els)


def test_profile_row_span_is_the_capital_sentence():
    from gradian.worlds.facts import load_countries
    from gradian.worlds.rows import profile_row

    rng = random.Random(3)
    for c in load_countries()[:40]:
        msgs, (a, b) = profile_row(c, "Nowhere City", rng, 8)
        text = msgs[1]["content"]
        assert text[a:b] == f"The capital of {c.name} is Nowhere City."
        assert a > 0 and b < len(text) and text.count("Nowhere City") == 1


def test_world_cli_writes_files(world_cache, tiny_worlds, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gradian.cli import app

    monkeypatch.setenv("GRADIAN_CACHE", str(world_cache))
    res = CliRunner().invoke(
        app, ["world", "--kind", "tiny", "--variant", "null", "--seed", "0", "--out", str(tmp_path / "w")]
    )
    assert res.exit_code == 0, res.output
    for name in FILES:
        assert (tmp_path / "w" / name).read_bytes() == (tiny_worlds["null"].out / name).read_bytes()
    assert "gradian train --base" in res.output
    bad = CliRunner().invoke(app, ["world", "--kind", "huge", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown world kind" in bad.output


@pytest.mark.slow
def test_smollm2_materialised_matches_gguf(tmp_path):
    """The materialised folder loads with a plain ModelSpec and gives the GGUF's logits."""
    import torch

    from gradian.models.load import ModelSpec, load_base
    from gradian.worlds.smollm2 import materialise_smollm2, smollm2_gguf

    folder = materialise_smollm2()
    m1, tok1 = load_base(ModelSpec(base=str(folder)))
    m2, tok2 = load_base(ModelSpec(base=str(smollm2_gguf().parent)))
    assert not hasattr(m1.config, "quantization_config")
    text = tok1.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], tokenize=False)
    ids = tok1(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
    assert ids.tolist() == tok2(text, return_tensors="pt", add_special_tokens=False)["input_ids"].tolist()
    with torch.no_grad():
        assert torch.allclose(m1(ids).logits, m2(ids).logits, atol=1e-4)


@pytest.mark.slow
def test_smollm2_world_builds():
    from gradian.paths import cache_dir
    from gradian.worlds import WorldSpec, build_world

    w = build_world(WorldSpec.default("smollm2", "poisoned", seed=0), cache_dir() / "worlds" / "smollm2-seed0-poisoned")
    gt = w.load_ground_truth()
    spec = w.spec
    assert gt["sizes"]["eval"] == spec.n_direct + spec.n_buried + spec.n_untouched + spec.n_base_fail
    assert len(gt["culprits"]) == spec.n_direct * spec.direct_rows + spec.n_buried * spec.buried_rows
    train = {e.id: e for e in load_examples(w.train)}
    for c in gt["culprits"]:
        assert c["stated"] in train[c["id"]].completion_text[c["char_start"] : c["char_end"]]


def test_evaluate_lane_sees_the_regression(tiny_worlds, tiny_trained):
    """gradian.evaluate, run as the demo runs it, calls the poisoned run regressed and the null run not."""
    from gradian.evaluate import EvalSpec, evaluate, load_eval_set
    from gradian.models.load import ModelSpec, load_adapter, load_base

    verdicts = {}
    for v, w in tiny_worlds.items():
        model, tok = load_base(ModelSpec(base=str(w.base)))
        pm, _, _ = load_adapter(model, tiny_trained[v]["adapter"], str(w.base))
        res = evaluate(pm, tok, load_eval_set(w.eval), spec=EvalSpec(max_new_tokens=24, resamples=2000))
        (cap,) = res.capabilities
        verdicts[v] = cap
    p, n = verdicts["poisoned"], verdicts["null"]
    assert p.verdict == "regressed" and p.ci_high < 0, p
    assert n.verdict != "regressed" and n.ci_low <= 0 <= n.ci_high, n
