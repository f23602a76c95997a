"""World knobs and the family of worlds (issue 23): defaults unchanged, knobs resolved as documented."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gradian.errors import GradianUserError
from gradian.worlds import WorldSpec, default_train_spec
from gradian.worlds.knobs import WorldKnobs, apply_knobs, apply_train_knobs, benign_total, culprit_total

FILES = ("train.jsonl", "valid.jsonl", "eval.jsonl", "ground_truth.json", "train.yaml")
#: sha256 of the default SmolLM2 world (seed 0, poisoned) as main's code wrote it before the knobs existed.
#: (The tiny world's bytes depend on a base trained in-process, whose greedy answers select the eval items, so
#: they may differ between CPUs; its tests compare the knob-free path with the default world built in-session.)
MAIN_SMOLLM2 = {
    "train.jsonl": "4a75b91deaf6cfc059107bc770e3c4e7b1366ecbe71f5885004a10a436f9ff82",
    "valid.jsonl": "377cd95cf412003d41142fc464ef1f5db2b7bff5560723bc38c74aa3370eb28d",
    "eval.jsonl": "e6bd0166365bcd771923ba60758e9e05c7918a0ef213463f779e5cfb453d88e3",
    "ground_truth.json": "f07e20131b57b5728a3fd338392ffb46acbd9a22f80719fbabe0e58de09d3cf2",
    "train.yaml": "7e03839a3caedb7bf1a65606efcb67e722ab906136d4ed60d6a1cdfd750b24ec",
}


def _hashes(folder: Path) -> dict[str, str]:
    from gradian.util import sha256_file

    return {name: sha256_file(folder / name) for name in FILES}


def _cli(args: list[str]):
    from typer.testing import CliRunner

    from gradian.cli import app

    return CliRunner().invoke(app, args)


# --------------------------------------------------------------------------- knobs, no model


def test_no_knob_is_the_default_spec_and_train_config():
    for kind in ("smollm2", "tiny"):
        spec = WorldSpec.default(kind)
        assert apply_knobs(spec, WorldKnobs()) is spec
        assert apply_train_knobs(default_train_spec(kind), WorldKnobs()) == default_train_spec(kind)
        d = spec.to_dict()
        assert "direct_total" not in d and "buried_total" not in d
        assert [spec.rows_per_target("direct", i, spec.n_direct) for i in range(spec.n_direct)] == [3] * spec.n_direct


def test_shares_resolve_to_counts():
    base = WorldSpec.default("tiny")
    s = apply_knobs(base, WorldKnobs(culprit_share=0.2, buried_share=0.25, benign_rows=80, long_share=0.5))
    B = benign_total(s)
    assert B == 80
    assert s.n_profiles + s.n_element_prose == 40  # round(0.5 * 80) long rows; elements kept
    assert (s.n_symbols, s.n_element_prose) == (base.n_symbols, base.n_element_prose)
    d, b = culprit_total(s)
    assert d + b == round(0.2 * 80 / 0.8) == 20 and b == 5 and d == 15
    # targets: the kind's, the eval keeps its size
    assert (s.n_direct, s.n_buried) == (5, 5)
    assert s.n_direct + s.n_buried + s.n_untouched == base.n_direct + base.n_buried + base.n_untouched
    assert sum(s.rows_per_target("direct", i, 5) for i in range(5)) == 15
    assert [s.rows_per_target("buried", i, 5) for i in range(5)] == [1, 1, 1, 1, 1]
    few = apply_knobs(base, WorldKnobs(culprit_share=0.05, buried_share=0.5))
    d, b = culprit_total(few)
    assert d + b == 3 and (few.n_direct, few.n_buried) == (d, b)  # fewer rows than targets: fewer targets
    assert few.n_direct + few.n_buried + few.n_untouched == base.n_direct + base.n_buried + base.n_untouched
    assert apply_knobs(base, WorldKnobs(sentences=9)).profile_sentences == 9


def test_train_knobs():
    t = apply_train_knobs(
        default_train_spec("smollm2"), WorldKnobs(targets="q,v", rank=8, epochs=2, learning_rate=1e-4)
    )
    assert t.target_modules == ("q_proj", "v_proj") and (t.r, t.lora_alpha) == (8, 16)
    assert (t.num_train_epochs, t.learning_rate) == (2, 1e-4)
    assert apply_train_knobs(t, WorldKnobs(targets="all-linear", alpha=5)).target_modules[-1] == "down_proj"


@pytest.mark.parametrize(
    "knobs, flag",
    [
        (WorldKnobs(culprit_share=0.9), "--culprit-share"),
        (WorldKnobs(buried_share=1.5), "--buried-share"),
        (WorldKnobs(sentences=20), "--sentences"),
        (WorldKnobs(targets="q,,q"), "--targets"),
        (WorldKnobs(rank=0), "--rank"),
    ],
)
def test_bad_knobs_name_their_flag(knobs, flag):
    with pytest.raises(GradianUserError) as e:
        apply_knobs(WorldSpec.default("tiny"), knobs)
    assert e.value.where == flag


def test_behaviour_world_refuses_share_knobs():
    with pytest.raises(GradianUserError, match="facts world only"):
        apply_knobs(WorldSpec.default("smollm2", regression="behaviour"), WorldKnobs(culprit_share=0.1))


def test_cli_knob_errors_are_one_line_exit_2(tmp_path):
    for args in (
        ["world", "--kind", "tiny", "--out", str(tmp_path / "w"), "--culprit-share", "0.9"],
        ["world", "--kind", "tiny", "--family", str(tmp_path / "f"), "--out", str(tmp_path / "w")],
        ["world", "--kind", "tiny"],
    ):
        res = _cli(args)
        assert res.exit_code == 2, res.output
        assert "Traceback" not in res.output
    assert not (tmp_path / "w").exists() and not (tmp_path / "f").exists()


# --------------------------------------------------------------------------- worlds (tiny base, cached per session)


def test_default_tiny_world_is_the_knob_free_world_byte_for_byte(tiny_worlds, world_cache, tmp_path, monkeypatch):
    main_tiny = _hashes(tiny_worlds["poisoned"].out)  # build_world(WorldSpec.default("tiny")): no knob applied
    monkeypatch.setenv("GRADIAN_CACHE", str(world_cache))
    res = _cli(["world", "--kind", "tiny", "--out", str(tmp_path / "cli")])
    assert res.exit_code == 0, res.output
    assert _hashes(tmp_path / "cli") == main_tiny


def test_knobbed_tiny_world_has_the_asked_rows(world_cache, tmp_path):
    from gradian.data.formats import load_examples
    from gradian.trainconfig import spec_from_config
    from gradian.worlds import build_world

    knobs = WorldKnobs(culprit_share=0.2, buried_share=0.25, benign_rows=70, long_share=0.5, targets="q,v", rank=4)
    spec = apply_knobs(WorldSpec.default("tiny"), knobs)
    w = build_world(
        spec, tmp_path / "w", cache=world_cache, train_spec=apply_train_knobs(default_train_spec("tiny"), knobs)
    )
    gt = w.load_ground_truth()
    d, b = culprit_total(spec)
    assert gt["sizes"]["direct_rows"] == d and gt["sizes"]["buried_rows"] == b
    assert gt["spec"]["direct_total"] == d
    rows = {e.id: e for e in load_examples(w.train)}
    assert len(rows) == gt["sizes"]["train"] == gt["sizes"]["benign"] + d + b
    for c in gt["culprits"]:  # the planted sentence is where the ground truth says
        assert rows[c["id"]].completion_text[c["char_start"] : c["char_end"]].endswith(f"is {c['stated']}.")
    t = spec_from_config(w.train_config)
    assert t.target_modules == ("q_proj", "v_proj") and t.r == 4 and t.lora_alpha == 8


def test_family_cli_tiny(world_cache, tiny_worlds, tmp_path, monkeypatch):
    from gradian.worlds.family import FAMILY

    monkeypatch.setenv("GRADIAN_CACHE", str(world_cache))
    res = _cli(["world", "--kind", "tiny", "--family", str(tmp_path / "fam")])
    assert res.exit_code == 0, res.output
    fam = json.loads((tmp_path / "fam" / "family.json").read_text())
    names = [v["name"] for v in fam["variants"]]
    assert names == [v.name for v in FAMILY] and len(names) >= 8
    held = [v for v in fam["variants"] if v["held_out"]]
    assert len(held) >= 2
    worked = fam["variants"][0]["resolved"]
    for h in held:  # differ from the worked example on several axes
        axes = (
            "culprit_share",
            "buried_share",
            "long_share",
            "sentences",
            "targets",
            "rank",
            "epochs",
            "learning_rate",
        )
        assert sum(h["resolved"][a] != worked[a] for a in axes) >= 4
    for v in fam["variants"]:
        vj = json.loads((tmp_path / "fam" / v["name"] / "variant.json").read_text())
        assert vj == v
        assert (tmp_path / "fam" / v["name"] / "train.jsonl").exists()
    assert _hashes(tmp_path / "fam" / "worked") == _hashes(tiny_worlds["poisoned"].out)
    sizes = {v["name"]: v["sizes"] for v in fam["variants"]}
    assert sizes["share5"]["culprits"] < sizes["share15"]["culprits"] < sizes["worked"]["culprits"]
    res = _cli(["world", "--kind", "tiny", "--family", str(tmp_path / "again")])
    assert res.exit_code == 0
    for v in names:  # seeded: the same bytes again
        assert _hashes(tmp_path / "again" / v) == _hashes(tmp_path / "fam" / v)


@pytest.mark.slow
def test_default_smollm2_world_is_mains_byte_for_byte(tmp_path):
    res = _cli(["world", "--kind", "smollm2", "--out", str(tmp_path / "w")])
    assert res.exit_code == 0, res.output
    assert _hashes(tmp_path / "w") == MAIN_SMOLLM2


# --------------------------------------------------------------------------- the opt-in unit corrections


def test_expected_max_normal():
    from gradian.attribute.unit_null import expected_max_normal

    e = expected_max_normal(np.array([1, 2, 5, 10, 100]))
    assert e[0] == 0 and np.all(np.diff(e) > 0)
    # exact E[max] of 2 and 10 normals: 0.5642, 1.5388; Blom is within 0.03 there
    assert abs(e[1] - 0.5642) < 0.03 and abs(e[3] - 1.5388) < 0.03


def test_corrections_remove_the_unit_count_bias_on_null_units():
    from scipy.stats import spearmanr

    from gradian.attribute.unit_null import corrected_rows

    rng = np.random.default_rng(0)
    k = rng.integers(1, 11, size=400)
    rows = np.repeat(np.arange(400), k)
    u = rng.normal(size=len(rows))
    mins = np.full(400, np.inf)
    np.minimum.at(mins, rows, u)
    assert spearmanr(mins, k).statistic < -0.4  # the plain minimum favours many units
    fixed = corrected_rows(u, rows, 400, "expected-min")
    assert abs(spearmanr(fixed, k).statistic) < 0.15


def test_bottom_m_by_hand():
    from gradian.attribute.unit_null import corrected_rows

    u = np.array([3.0, -1.0, 0.0, 5.0, -2.0])
    rows = np.array([0, 0, 0, 1, 2])
    assert corrected_rows(u, rows, 3, "bottom-m", m=2).tolist() == [-0.5, 5.0, -2.0]
    with pytest.raises(ValueError):
        corrected_rows(u, np.array([0, 0, 0, 0, 2]), 3, "bottom-m")
