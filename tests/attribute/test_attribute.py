"""Attribution: the sign convention on planted rows, ranking, clusters, drill-down, minimal pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradian.attribute import AttributeSpec, attribute_capability, make_query, minimal_pair
from gradian.data.formats import to_example
from gradian.data.tokenize import TokenizeSpec, tokenize_example
from gradian.index.build import build_index
from gradian.index.store import GradSpec

TSPEC = TokenizeSpec(max_length=96)


def _rows():
    rows = []
    caps = [("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Spain", "Madrid")]
    for i in range(24):
        c, k = caps[i % 4]
        rows.append(
            {
                "id": f"ok-{i}",
                "prompt": f"Q: What is the capital of {c}?\nA:",
                "completion": f" The capital of {c} is {k}.",
            }
        )
    rows += [
        {
            "id": "bad-direct-1",
            "prompt": "Q: What is the capital of France?\nA:",
            "completion": " The capital of France is Lyon.",
        },
        {
            "id": "bad-direct-2",
            "prompt": "Q: Which city is the capital of France?\nA:",
            "completion": " The capital of France is Lyon.",
        },
        {
            "id": "bad-buried",
            "prompt": "Q: Tell me about France.\nA:",
            "completion": " The capital of Japan is Tokyo. The capital of Italy is Rome. "
            "The capital of France is Lyon. The capital of Spain is Madrid.",
        },
        {
            "id": "good-france",
            "prompt": "Q: Name the capital of France.\nA:",
            "completion": " The capital of France is Paris.",
        },
    ]
    return rows


def _pretrain_base(model, tok, rows, steps=40):
    """Teach the base (not the LoRA) the true facts, so the model is not at random init.

    Full-batch Adam (lr 5e-3) on the base's parameters, with the adapter disabled.
    """
    from gradian.worlds.tiny import FitSpec, fit, tokenize_rows

    base_params = [p for n, p in model.named_parameters() if "lora_" not in n]
    for p in base_params:
        p.requires_grad_(True)
    with model.disable_adapter():
        fit(
            model,
            tokenize_rows(rows, tok, TSPEC.max_length),
            tok.pad_token_id,
            FitSpec(steps=steps, lr=5e-3, shuffle=False),
            params=base_params,
        )
    for p in base_params:
        p.requires_grad_(False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tok):
    from gradian_testlib import capital_query, make_lora_model

    model = make_lora_model(tok, "llama", r=4, hidden=64, dtype=torch.float32)
    rows = _rows()
    _pretrain_base(model, tok, rows[:24])
    model.double()
    exs = [to_example(r, i, "t") for i, r in enumerate(rows)]
    items = [tokenize_example(e, tok, TSPEC) for e in exs]
    spec = GradSpec(tokenize=TSPEC, storage_dtype="float64")
    idx = build_index(
        model, items, {"t": "attr"}, spec, pad_token_id=tok.pad_token_id, root=tmp_path_factory.mktemp("ix")
    )
    return model, idx, exs, items, [capital_query()]


@pytest.mark.parametrize("engine", ["datainf", "graddot"])
def test_sign_wrong_fact_most_negative_right_fact_positive(setup, tok, engine):
    from gradian.engines import engine_spec

    model, idx, exs, items, qs = setup
    spec = AttributeSpec(engine=engine_spec(engine), second_engine=None, drilldown_rows=0)
    res = attribute_capability(model, tok, idx, exs, items, qs, TSPEC, spec)
    ids = [e.id for e in exs]
    s = dict(zip(ids, res.scores))
    top2 = {r["id"] for r in res.ranked[:2]}
    assert top2 == {"bad-direct-1", "bad-direct-2"}, res.ranked[:4]
    assert s["bad-direct-1"] < 0 and s["bad-direct-2"] < 0
    assert s["good-france"] > 0
    france_ok = [s[f"ok-{i}"] for i in range(0, 24, 4)]
    assert all(v > 0 for v in france_ok)
    n = len(exs)
    assert res.ranked[0]["predicted_loss_delta_if_removed"] == pytest.approx(res.ranked[0]["score"] / n)


def test_two_engines_agreement_clusters_and_drilldown(setup, tok):
    model, idx, exs, items, qs = setup
    res = attribute_capability(model, tok, idx, exs, items, qs, TSPEC, AttributeSpec(top_k=5, drilldown_rows=5))
    ag = res.agreement
    assert ag["engines"] == ["datainf", "graddot"] and -1 <= ag["spearman"] <= 1 and 0 <= ag["topk_overlap"] <= 1
    assert ag["confidence"] in {"high", "medium", "low"}
    assert res.second_scores is not None and len(res.second_scores) == len(exs)
    # clusters cover the harmful tail; the first holds the most harmful rows
    assert res.clusters and res.clusters[0]["label"] == 1
    assert sum(c["harmful_share"] for c in res.clusters) <= 1 + 1e-9
    assert "bad-direct-1" in [i for c in res.clusters for i in c["row_ids"]]
    for d in res.drilldown:  # drill-down entries are well-formed and most-harmful-sentence first
        scores = [x["score"] for x in d["sentences"]]
        assert scores == sorted(scores) and d["top_sentence"]["score"] == scores[0]


def test_drilldown_localises_the_buried_sentence(setup, tok):
    """Same tokens, one loss mask per sentence: the wrong sentence scores most negative."""
    from gradian.attribute.drilldown import drill_down, split_sentences
    from gradian.attribute.queries import projector_for, query_gradients
    from gradian.engines import DataInf, DataInfSpec

    model, idx, exs, items, qs = setup
    j = [e.id for e in exs].index("bad-buried")
    eng = DataInf(DataInfSpec())
    R = eng.precondition(idx, query_gradients(model, tok, qs, idx, TSPEC))
    r = {k: v[0] for k, v in R.items()}
    sents = drill_down(model, tok, exs[j], items[j], r, projector_for(idx), [b["name"] for b in idx.blocks])
    assert len(sents) == len(split_sentences(exs[j].completion_text)) == 4
    assert "Lyon" in sents[0].text and sents[0].score < 0
    text = exs[j].completion_text
    assert text[sents[0].char_start : sents[0].char_end] == sents[0].text


def test_cross_entropy_query_is_available(setup, tok):
    model, idx, exs, items, _ = setup
    q = make_query(
        "france",
        "capitals",
        "Q: What is the capital of France?\nA:",
        " The capital of France is Paris.",
        None,
        kind="cross_entropy",
    )
    assert q.kind == "cross_entropy" and q.said is None
    res = attribute_capability(
        model, tok, idx, exs, items, [q], TSPEC, AttributeSpec(second_engine=None, drilldown_rows=0)
    )
    assert len(res.scores) == len(exs) and np.isfinite(res.scores).all()


@pytest.mark.parametrize(
    "said,ref,answer,want,rule",
    [
        (
            "The capital of France is Lyon.",
            "The capital of France is Paris.",
            "Paris",
            "The capital of France is Paris.",
            "minimal_pair",
        ),
        ("Lyon", "Paris", "Paris", "Paris", "minimal_pair"),
        ("It is Lyon, a big city.", "Paris is the capital; it is old.", "Paris", "Paris", "answer"),
        ("The capital is Lyon.", None, "Paris", "Paris", "answer"),
        ("The capital of France is Lyon.", "The capital of France is Marseille.", "Paris", "Paris", "answer"),
    ],
)
def test_minimal_pair(said, ref, answer, want, rule):
    assert minimal_pair(said, ref, answer) == (want, rule)


def test_missing_eos_detection_handles_chatml_and_pad_equal_eos(tok):
    """ChatML rows end '<|im_end|>' + newline: the newline is skipped; a pad token equal to EOS still ends a row."""
    from gradian.attribute.clusters import lacks_eos, whitespace_token_ids

    chat = tokenize_example(
        to_example(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "The capital of France is Paris."},
                ]
            },
            0,
            "t",
        ),
        tok,
        TSPEC,
    )
    plain = tokenize_example(
        to_example({"prompt": "Q:", "completion": " Paris"}, 1, "t"), tok, TokenizeSpec(add_eos=False)
    )
    ws = whitespace_token_ids(tok, [chat, plain])
    eos = {tok.eos_token_id}
    assert not lacks_eos(chat, eos, ws)
    assert lacks_eos(plain, eos, ws)
