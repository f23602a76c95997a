"""The demo's profiles (issue 26): ``make demo`` runs the quick SmolLM2 world, ``--full`` the worked example.

No training here: the specs are checked against docs/worked-example.md's table, and the CLI's choice of
profile against the spec it resolves.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "worked-example.md"
MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def _doc_table() -> dict[str, tuple[str, str]]:
    """``field -> (full, quick)`` from the quick profile's table in docs/worked-example.md."""
    text = DOC.read_text()
    section = text.split("## The quick profile: `make demo`", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|[^|]+\| `(\w+)` \| ([^|]+) \| ([^|]+) \|$", line.strip())
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    return rows


def _value(spec, tspec, field: str):
    return getattr(spec, field) if hasattr(spec, field) else getattr(tspec, field)


def test_the_docs_table_is_the_quick_and_the_full_spec():
    from gradian.worlds.profiles import QUICK_KNOBS, QUICK_TRAIN, QUICK_WORLD, demo_world

    table = _doc_table()
    quick = demo_world("quick", "smollm2", "poisoned", 0)
    full = demo_world("full", "smollm2", "poisoned", 0)
    # every field the profile sets is in the table, and every row of the table is a field that exists
    set_fields = set(QUICK_WORLD) | set(QUICK_TRAIN) | {"num_train_epochs", "learning_rate"}
    assert set(QUICK_KNOBS.to_dict()) == {"epochs", "learning_rate"}
    assert set_fields <= set(table), sorted(set_fields - set(table))
    for field, (want_full, want_quick) in table.items():
        for (spec, tspec), want in ((full, want_full), (quick, want_quick)):
            got = _value(spec, tspec, field)
            assert float(got) == pytest.approx(float(want)), (field, got, want)


def test_full_is_the_worked_example_unchanged_and_quick_only_resizes_it():
    from gradian.worlds.builder import WorldSpec, default_train_spec
    from gradian.worlds.profiles import QUICK_TRAIN, QUICK_WORLD, demo_world

    spec, tspec = demo_world("full", "smollm2", "null", 3, faults=True)
    assert spec == WorldSpec.default("smollm2", "null", 3, faults=True)
    assert tspec == default_train_spec("smollm2", 3)
    q, qt = demo_world("quick", "smollm2", "null", 3, faults=True)
    assert replace(q, **{k: getattr(spec, k) for k in QUICK_WORLD}) == spec  # same seed, variant, faults
    assert (q.seed, q.variant, q.faults, qt.seed) == (3, "null", True, 3)
    assert qt.replace(num_train_epochs=3, learning_rate=4e-4, **{k: 8 for k in QUICK_TRAIN}) == tspec
    # what the module docstring states: 12 direct and 20 buried culprits, about a third culprits
    from gradian.worlds.knobs import describe

    d = describe(q, qt)
    assert (d["direct_rows"], d["buried_rows"]) == (12, 20)
    assert 0.3 < d["culprit_share"] < 0.4


def test_the_demo_defaults_to_quick_for_smollm2_facts_only():
    from gradian.worlds.demo import DemoSpec

    assert DemoSpec().resolved_profile() == "quick"
    assert DemoSpec().cache_folder().name == "smollm2-quick-seed0"
    assert DemoSpec(profile="full").cache_folder().name == "smollm2-seed0"  # the worked example's folder
    assert DemoSpec(kind="tiny").resolved_profile() == "full"
    assert DemoSpec(kind="tiny").cache_folder().name == "tiny-seed0"
    assert DemoSpec(regression="behaviour").cache_folder().name == "smollm2-behaviour-seed0"
    assert DemoSpec().to_dict()["profile"] == "quick"


@pytest.mark.parametrize(
    "args",
    [["--kind", "tiny", "--quick"], ["--regression", "behaviour", "--quick"]],
)
def test_quick_on_a_world_with_one_size_is_a_user_error(tmp_path, args):
    from typer.testing import CliRunner

    from gradian.cli import app

    res = CliRunner().invoke(app, ["demo", "--out", str(tmp_path / "out"), *args])
    assert res.exit_code == 2, res.output
    assert "--quick" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


def test_make_demo_is_quick_and_demo_full_is_the_worked_example():
    text = MAKEFILE.read_text()
    demo = re.search(r"^demo: .*\n\t(.*)$", text, re.M)
    full = re.search(r"^demo-full: .*\n\t(.*)$", text, re.M)
    assert demo and demo.group(1).strip() == "$(BIN)/gradian demo"
    assert full and full.group(1).strip() == "$(BIN)/gradian demo --full"
