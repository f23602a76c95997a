"""Issue 22: the resolved training setup is in the manifest and the report; Audit's error-level setup findings
(learning rate, epochs, loss mask, truncation of the blamed rows) come first in the summary and lower the data
verdict's confidence. On the real tiny run (tests/report/report_world.py: lr 1e-2 on LoRA, many epochs)."""

from __future__ import annotations

import copy

import pytest
from report_world import real_run

from gradian.attribute.run import check_run
from gradian.report import build_report, render
from gradian.report.join import setup_errors


@pytest.fixture(scope="module")
def real():
    return real_run()


def _ids(run):
    return {f["id"]: f for f in run["audit"]["findings"]}


def test_manifest_records_the_resolved_setup(real):
    ts = real["run"]["manifest"]["training_setup"]
    v = ts["values"]
    # the API path resolves like the CLI: a TRL config on 'messages' rows trains every token
    assert v["trainer"]["value"] == "trl" and v["loss_on"]["value"] == "all"
    assert v["loss_on"]["from"].startswith("TRL 1.16 rule")
    # the test gives max_length explicitly in its GradSpec: named as given, not as the config's
    assert v["max_length"] == {"value": 40, "from": "given: GradSpec.tokenize.max_length"}
    grad = real["run"]["manifest"]["identity"]["specs"]["grad"]["tokenize"]
    assert grad["loss_on"] == v["loss_on"]["value"] and grad["max_length"] == v["max_length"]["value"]
    check_run(real["run"], inputs=True)
    # the schema is strict about the new key, and a run written before it (no key) still reads
    old = copy.deepcopy(real["run"])
    del old["manifest"]["training_setup"]
    check_run(old, inputs=True)
    bad = copy.deepcopy(real["run"])
    bad["manifest"]["training_setup"]["values"]["loss_on"]["from"] = 5
    with pytest.raises(Exception, match="manifest.training_setup.values.loss_on.from"):
        check_run(bad, inputs=True)


def test_setup_errors_rules():
    f = [
        {"id": "C02", "severity": "error", "title": "Learning rate far too high", "row_ids": []},
        {"id": "C03", "severity": "warning", "title": "Too many epochs", "row_ids": []},
        {"id": "D04", "severity": "error", "title": "Rows longer than max_length", "row_ids": ["a", "b"]},
        {"id": "D14", "severity": "error", "title": "Eval rows in training", "row_ids": ["a"]},
    ]
    # a warning and a non-setup error do not count; D04 only when it truncates blamed rows
    assert [e["id"] for e in setup_errors(f, {"x"})] == ["C02"]
    got = setup_errors(f, {"b", "x"})
    assert [e["id"] for e in got] == ["C02", "D04"] and got[1]["rows"] == 1


def test_summary_says_first_the_regression_may_be_mechanical(real):
    run = real["run"]
    found = _ids(run)
    assert found["C02"]["severity"] == "error" and found["C03"]["severity"] == "error"
    r = build_report(run)
    i_verdict = next(i for i, h in enumerate(r.headline) if h.startswith("capitals regressed:"))
    i_mech = next(i for i, h in enumerate(r.headline) if h.startswith("The capitals regression may be mechanical"))
    i_conf = next(i for i, h in enumerate(r.headline) if h.startswith("Confidence in the data verdict for capitals"))
    assert i_verdict < i_mech < i_conf  # before any data verdict
    mech = r.headline[i_mech]
    assert "C02: Learning rate far too high" in mech and "C03: Too many epochs" in mech
    assert "lowered by the audit" in r.headline[i_conf] and "C02" in r.headline[i_conf]
    q = [x for x in r.capability("capitals").qualifiers if x.kind == "audit_setup"]
    assert len(q) == 1 and q[0].level == "warning"
    assert not any("has no mechanical explanation" in h for h in r.headline)
    # every renderer shows it, and the manifest's setup
    for fmt in ("text", "md", "html"):
        out = render(r, fmt)
        assert "regression may be mechanical" in out and "raining setup" in out, fmt


def test_without_setup_errors_the_summary_is_unchanged(real):
    run = copy.deepcopy(real["run"])
    for f in run["audit"]["findings"]:
        if f["id"] in ("C01", "C02", "C03", "C08", "C09", "D04"):
            f["severity"] = "warning"
    r = build_report(run)
    assert not any("may be mechanical" in h for h in r.headline)
    assert not any(x.kind == "audit_setup" for x in r.capability("capitals").qualifiers)
    conf = next(h for h in r.headline if h.startswith("Confidence in the data verdict for capitals"))
    assert "lowered by the audit" not in conf
