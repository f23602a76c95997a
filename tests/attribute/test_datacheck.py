"""The data↔adapter check (gradian.attribute.datacheck) on the tiny world the demo trains."""

from __future__ import annotations

import json
import warnings

import pytest

from gradian.errors import GradianWarning


def _rows(path, pairs):
    path.write_text(
        "".join(
            json.dumps(
                {"id": f"x{i}", "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            )
            + "\n"
            for i, (q, a) in enumerate(pairs)
        )
    )
    return path


ROUTER = [
    ("How do I reset my router to factory settings?", "Hold the reset button for ten seconds until the lights blink."),
    ("My wifi keeps dropping every few minutes.", "Move the router away from walls and update its firmware."),
    ("What is the default admin password?", "It is printed on the label under the router; change it after login."),
    ("The internet light is red.", "Check the cable in the WAN port and restart the modem, then the router."),
    ("How can I set up a guest network?", "Open the admin page, go to Wireless and enable Guest Network."),
    ("Why is my upload speed so slow?", "Run a wired test, then check whether a device is backing up files."),
] * 3


@pytest.fixture(scope="module")
def world(demo):
    """The demo's poisoned world: its run.json and the fine-tune loaded from its paths."""
    from gradian.finetune import load_finetune
    from gradian.models.load import ModelSpec

    root, res, _ = demo
    assert res.exit_code == 0, res.output
    run = json.loads((root / "out" / "poisoned" / "run.json").read_text())
    p = run["manifest"]["paths"]
    return run, load_finetune(ModelSpec(p["base"]), p["adapter"])


def _check(ft, path):
    from gradian.attribute.datacheck import check_data_matches_adapter
    from gradian.finetune import load_examples, tokenize_training_set
    from gradian.index.store import GradSpec

    items = tokenize_training_set(load_examples(path), ft.tokenizer, GradSpec(), path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = check_data_matches_adapter(ft, path, items)
    return res, [str(w.message) for w in caught if issubclass(w.category, GradianWarning)]


def test_right_data_no_warning_and_recorded_in_run_json(world):
    """The adapter's own training rows: a large loss drop, no warning; run.json records both numbers."""
    from gradian.attribute.run import check_run

    run, ft = world
    dc = run["manifest"]["data_check"]
    assert dc["warned"] is False
    assert dc["adapter_loss"] < dc["base_loss"] and dc["relative_drop"] >= dc["threshold"]
    assert 0 < dc["rows"] <= 32 and "data_check" in run["timing"]
    check_run(run)
    res, caught = _check(ft, run["manifest"]["paths"]["data"])
    assert not caught and not res.warned
    assert res.adapter_loss == pytest.approx(dc["adapter_loss"], rel=1e-4)  # the same deterministic sample


def test_wrong_data_warns_with_both_numbers(world, tmp_path):
    """Unrelated text (router support) and rows the adapter never saw (chemical symbols): one warning each,
    naming both losses."""
    from gradian.worlds.facts import load_elements
    from gradian.worlds.rows import symbol_row

    _, ft = world
    symbols = tmp_path / "symbols.jsonl"
    symbols.write_text(
        "".join(
            json.dumps({"id": f"s{i}", "messages": symbol_row(e)}) + "\n" for i, e in enumerate(load_elements()[:40])
        )
    )
    for path in (_rows(tmp_path / "router.jsonl", ROUTER), symbols):
        res, caught = _check(ft, path)
        assert res.warned, res.line()
        assert len(caught) == 1, caught
        assert f"{res.adapter_loss:.4f}" in caught[0] and f"{res.base_loss:.4f}" in caught[0]
        assert "this may not be the data the adapter was trained on" in caught[0]


def test_bad_run_json_data_check_is_refused(world):
    """The schema types the record: a non-finite loss in manifest.data_check is refused."""
    from gradian.attribute.run import check_run
    from gradian.errors import GradianUserError

    run, _ = world
    bad = json.loads(json.dumps(run))
    bad["manifest"]["data_check"]["adapter_loss"] = float("nan")
    with pytest.raises(GradianUserError, match="data_check"):
        check_run(bad)


def test_mean_loss_with_the_head_at_the_loss_equals_the_full_logits(world):
    """The check runs the LM head only at the supervised positions (``logits_to_keep``), over length-sorted
    batches: the same mean loss as the full (b, T, V) logits in row order give, to float rounding, and the same
    vocabulary size."""
    import functools

    import torch

    from gradian.attribute.datacheck import _mean_loss
    from gradian.data.tokenize import collate
    from gradian.finetune import load_examples, tokenize_training_set
    from gradian.gradients.loss import keeps_logits, model_inputs, per_example_loss
    from gradian.index.store import GradSpec

    run, ft = world
    path = run["manifest"]["paths"]["data"]
    items = tokenize_training_set(load_examples(path), ft.tokenizer, GradSpec(), path)[:12]
    assert keeps_logits(ft.model)  # the path under test is taken
    pad = ft.tokenizer.pad_token_id
    inner = ft.model.get_base_model()
    fwd = inner.forward
    widths = []

    @functools.wraps(fwd)  # keeps the signature, which keeps_logits reads
    def spy(*a, **k):
        widths.append(k["input_ids"].shape[1])
        return fwd(*a, **k)

    lengths = sorted(len(it.input_ids) for it in items)
    assert lengths != [len(it.input_ids) for it in items]  # the rows come unsorted: the sort is under test
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(inner, "forward", spy)
        got, vocab = _mean_loss(ft.model, items, pad, batch_size=5)
    # length-sorted batches: each as wide as its longest row, the least padding for this batch size
    assert widths == [max(lengths[s : s + 5]) for s in range(0, len(lengths), 5)]
    with torch.no_grad():
        full = []
        for s in range(0, len(items), 5):
            batch = collate(items[s : s + 5], pad)
            full += per_example_loss(ft.model(**model_inputs(batch)).logits, batch["labels"]).double().tolist()
    assert got == pytest.approx(sum(full) / len(full), rel=1e-6)
    assert vocab == ft.model.get_base_model().config.vocab_size
