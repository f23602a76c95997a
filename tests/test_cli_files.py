"""Issue 26, the CLI/files half: file modes, ``gradian export`` (and verify's shared selection), next steps,
``gradian cache``.

The run is the report tests' real tiny run (tests/report/report_world.py: trained in-test, ~15 s).
"""

from __future__ import annotations

import copy
import json
import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradian.cli import app
from gradian_testlib import assert_one_line_error

sys.path.insert(0, str(Path(__file__).parent / "report"))
from report_world import real_run  # noqa: E402

runner = CliRunner()


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


# ---------------------------------------------------------------------- file modes


@pytest.mark.parametrize(
    "mask,want_file,want_dir", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]
)
def test_atomic_writers_and_published_folders_honour_the_umask(tmp_path, mask, want_file, want_dir):
    """mkstemp/mkdtemp make 0600/0700; what Gradian leaves is what open()/mkdir would make under the umask."""
    import tempfile

    import torch
    from safetensors.torch import save_file

    from gradian.util import atomic_write_bytes, atomic_write_json, atomic_write_text, current_umask, publish_folder

    old = os.umask(mask)
    try:
        assert current_umask() == mask
        atomic_write_bytes(tmp_path / "a.bin", b"x")
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_write_json(tmp_path / "a.json", {"x": 1})
        tmp = Path(tempfile.mkdtemp(dir=tmp_path))
        assert _mode(tmp) == 0o700
        # what a library leaves private inside the folder: safetensors' save_file (PEFT's save_pretrained) writes
        # 0600, and a checkpoint-*/ folder made by mkdtemp is 0700
        (tmp / "checkpoint-1").mkdir(mode=0o700)
        save_file({"w": torch.zeros(2)}, str(tmp / "checkpoint-1" / "adapter_model.safetensors"))
        save_file({"w": torch.zeros(2)}, str(tmp / "adapter_model.safetensors"))
        assert _mode(tmp / "adapter_model.safetensors") == 0o600  # the library's own mode, whatever the umask
        publish_folder(tmp, tmp_path / "pub")
    finally:
        os.umask(old)
    for name in ("a.bin", "a.txt", "a.json"):
        assert _mode(tmp_path / name) == want_file, name
    assert _mode(tmp_path / "pub") == want_dir
    assert _mode(tmp_path / "pub" / "checkpoint-1") == want_dir
    for name in ("adapter_model.safetensors", "checkpoint-1/adapter_model.safetensors"):
        assert _mode(tmp_path / "pub" / name) == want_file, name
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


def test_run_files_and_reports_are_group_readable(tmp_path, umask022):
    """report.html / report.md / run.json / the world's files come out 0644 under umask 022 (issue 26, item 4)."""
    src = real_run()
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_bytes((src["run_dir"] / "run.json").read_bytes())
    os.chmod(d / "run.json", 0o600)
    for fmt in ("html", "md"):
        res = runner.invoke(app, ["report", str(d), "--format", fmt])
        assert res.exit_code == 0, res.output
        assert _mode(d / f"report.{fmt}") == 0o644, fmt


def test_tiny_world_files_are_group_readable(tmp_path, umask022, monkeypatch):
    """The world folder (published from mkdtemp) and its JSONL files: 0755 / 0644."""
    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    res = runner.invoke(app, ["world", "--kind", "tiny", "--out", str(tmp_path / "w")])
    assert res.exit_code == 0, res.output
    files = [p for p in (tmp_path / "w").rglob("*") if p.is_file()]
    assert any(p.suffix == ".jsonl" for p in files)
    assert _mode(tmp_path / "w") == 0o755
    bad = [(str(p), oct(_mode(p))) for p in files if _mode(p) & 0o044 != 0o044]
    assert not bad, bad


# ---------------------------------------------------------------------- the selection verify and export share


def _run() -> dict:
    return copy.deepcopy(real_run()["run"])


def _ranked_run():
    """``(run, its first capability, the train ids, their rank scores)``: what verify's selection ranks by."""
    import numpy as np

    run = _run()
    cap = run["attribution"]["capabilities"][0]
    return run, cap, run["attribution"]["train_ids"], np.asarray(cap.get("rank_scores") or cap["scores"], dtype=float)


def test_select_blamed_is_the_harmful_tail_in_rank_order():
    """'blamed' = as many rows as the clusters hold, most negative rank score first; 'top K' and 'cluster N'."""
    from gradian.attribute.selection import select

    run, cap, ids, scores = _ranked_run()
    k = sum(len(c["row_ids"]) for c in cap["clusters"])
    blamed = select(run, "blamed")
    assert len(blamed) == k and len(set(blamed)) == k
    got = [scores[ids.index(r)] for r in blamed]
    assert got == sorted(got)  # most harmful (most negative) first
    assert max(got) <= min(s for j, s in enumerate(scores) if ids[j] not in set(blamed))
    assert select(run, "top 3") == blamed[:3]
    assert select(run, "cluster 1") == list(cap["clusters"][0]["row_ids"])


@pytest.mark.parametrize(
    "drop,msg",
    [("cluster 99", "has no cluster 99"), ("bogus", "is not a selection"), ("top 0", "is not a selection")],
)
def test_select_errors_name_the_flag(drop, msg):
    from gradian.attribute.selection import select
    from gradian.errors import GradianUserError

    with pytest.raises(GradianUserError) as e:
        select(_run(), drop)
    assert msg in str(e.value) and "--drop" in e.value.one_line()


def test_verify_removes_what_export_drops():
    """verify's fix retrain removes exactly select(run, ...): one selection (brief: verify uses it)."""
    from gradian.attribute.selection import select
    from gradian.verify import VerifySpec, plan

    run = _run()
    for spec, drop in (
        (VerifySpec(), "blamed"),
        (VerifySpec(remove=4), "top 4"),
        (VerifySpec(remove_cluster=1), "cluster 1"),
    ):
        fix = [r for r in plan(run, spec, 0) if r.kind == "fix"][0]
        assert fix.removed == select(run, drop), drop


# ---------------------------------------------------------------------- gradian export


def _copy_run(tmp_path: Path, data: Path | None = None) -> Path:
    run = _run()
    if data is not None:
        run["manifest"]["paths"]["data"] = str(data)
    d = tmp_path / "run"
    d.mkdir()
    (d / "run.json").write_text(json.dumps(run))
    return d


def test_export_keeps_the_other_rows_byte_for_byte(tmp_path):
    """The kept lines are the source's own bytes, in order; the ids dropped are listed beside the export."""
    from gradian.attribute.selection import select

    src = real_run()
    d = _copy_run(tmp_path)
    out = tmp_path / "clean.jsonl"
    res = runner.invoke(app, ["export", str(d), "--drop", "blamed", "--out", str(out)])
    assert res.exit_code == 0, res.output
    removed = json.loads((tmp_path / "clean.removed.json").read_text())
    assert removed["schema"] == "gradian.export/1" and removed["removed"] == select(_run(), "blamed")
    lines = Path(src["world"]["data"]).read_bytes().splitlines(keepends=True)
    want = b"".join(ln for ln in lines if json.loads(ln)["id"] not in set(removed["removed"]))
    assert out.read_bytes() == want and removed["kept"] == len(lines) - len(removed["removed"])
    assert "next" not in res.output and "dropped ids" in res.output


def test_export_of_an_odd_jsonl_keeps_blank_lines_crlf_and_a_last_line_without_newline(tmp_path):
    src = Path(real_run()["world"]["data"])
    lines = src.read_bytes().splitlines()
    odd = b"\r\n".join(lines[:3]) + b"\r\n\n   \n" + b"\n".join(lines[3:])  # no final newline
    data = tmp_path / "train.jsonl"
    data.write_bytes(odd)
    d = _copy_run(tmp_path, data)
    res = runner.invoke(app, ["export", str(d), "--drop", "top 2", "--out", str(tmp_path / "c.jsonl")])
    assert res.exit_code == 2 and "changed since the run" in res.output  # the sha256 differs: refused
    res = runner.invoke(
        app, ["export", str(d), "--drop", "top 2", "--out", str(tmp_path / "c.jsonl"), "--allow-changed-inputs"]
    )
    assert res.exit_code == 0, res.output
    gone = set(json.loads((tmp_path / "c.removed.json").read_text())["removed"])
    pieces = odd.split(b"\n")
    keep = [p + b"\n" for p in pieces[:-1]] + [pieces[-1]]
    want = b"".join(p for p in keep if not p.strip() or json.loads(p)["id"] not in gone)
    assert (tmp_path / "c.jsonl").read_bytes() == want


def test_top_k_never_selects_a_row_that_is_not_harmful():
    """'top K' past the harmful rows stops at them: a row whose rank score is not harmful is never dropped."""
    import numpy as np

    from gradian.attribute.selection import select

    run, cap, ids, scores = _ranked_run()
    every = select(run, "top 100000")
    assert set(every) == {ids[j] for j in np.flatnonzero(scores < 0)}
    assert 0 < len(every) < len(ids)


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--drop", "cluster 99"], "has no cluster 99"),
        (["--drop", "nonsense"], "is not a selection"),
        (["--out", "{tmp}/x.txt"], "the export is JSONL"),
        (["--out", "{tmp}/no/such/x.jsonl"], "the folder of --out does not exist"),
        (["--out", "{data}"], "would overwrite the training data"),
    ],
)
def test_export_user_errors_are_one_line_and_write_nothing(tmp_path, args, msg):
    d = _copy_run(tmp_path)
    data = real_run()["world"]["data"]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    res = runner.invoke(app, ["export", str(d), *[a.format(tmp=tmp_path, data=data) for a in args]])
    assert_one_line_error(res, msg)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_export_of_a_missing_run_is_a_user_error(tmp_path):
    res = runner.invoke(app, ["export", str(tmp_path)])
    assert res.exit_code == 2 and "no run.json here" in res.output


# ---------------------------------------------------------------------- next steps after attribute


def test_next_steps_are_filled_in(tmp_path):
    from gradian.commands import _common
    from gradian.commands.attribute import print_next_steps

    run = _run()
    with _common.console.capture() as cap:
        print_next_steps(run, tmp_path / "my run")
    text = cap.get()
    assert f"gradian verify '{tmp_path / 'my run'}'" in text
    assert f"gradian export '{tmp_path / 'my run'}' --drop blamed --out '{tmp_path / 'my run' / 'clean.jsonl'}'" in text
    from gradian.attribute.selection import select

    assert f"blamed: {len(select(run, 'blamed'))} row(s)" in text
    run["attribution"] = None  # stopped after Evaluate: nothing to act on, nothing printed
    with _common.console.capture() as cap:
        print_next_steps(run, tmp_path)
    assert cap.get() == ""


# ---------------------------------------------------------------------- gradian cache


def test_cache_lists_and_removes_indexes(tmp_path, monkeypatch):
    """A run records its indexes' source run; `cache` lists size/age/run; `rm` by id, --older-than, --all."""
    import shutil
    import time

    from gradian.cache import list_indexes, record_index_use

    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    src = real_run()
    root = tmp_path / "cache" / "index"
    root.mkdir(parents=True)
    built = sorted(p for p in (src["run_dir"] / "index").iterdir() if (p / "manifest.json").is_file())
    assert len(built) >= 2
    for p in built:
        shutil.copytree(p, root / p.name)
    run = _run()
    for ix in [run["attribution"]["index"]] + [
        v for c in (run["attribution"].get("trajectory") or {}).get("checkpoints") or [] for v in c["index"].values()
    ]:
        ix["root"] = str(root / Path(ix["root"]).name)
    record_index_use(run, tmp_path / "the-run")
    (root / "not-an-index").mkdir()  # a stray folder is neither listed nor removed
    res = runner.invoke(app, ["cache"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    entries = list_indexes()
    assert {e["id"] for e in entries} == {p.name for p in built}
    assert all(e["bytes"] > 0 for e in entries)
    used = run["attribution"]["index"]["id"]
    assert [e["run_dir"] for e in entries if e["id"] == used] == [str((tmp_path / "the-run").resolve())]
    assert used in res.output and "the-run" in res.output and f"{len(built)} index(es)" in res.output

    # --older-than: nothing is a day old; then age one index by its recorded use
    res = runner.invoke(app, ["cache", "rm", "--older-than", "1d"])
    assert res.exit_code == 0 and "removed 0 index(es)" in res.output and len(list_indexes()) == len(built)
    usage = json.loads((tmp_path / "cache" / "index-runs.json").read_text())
    key = str((root / used).resolve())
    usage["indexes"][key]["used"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 10 * 86400))
    (tmp_path / "cache" / "index-runs.json").write_text(json.dumps(usage))
    res = runner.invoke(app, ["cache", "rm", "--older-than", "7d"])
    assert res.exit_code == 0 and f"removed {used}" in res.output
    assert not (root / used).exists() and len(list_indexes()) == len(built) - 1

    other = list_indexes()[0]["id"]
    res = runner.invoke(app, ["cache", "rm", other[:6]])
    assert res.exit_code == 0 and not (root / other).exists()
    res = runner.invoke(app, ["cache", "rm", "--all", "--dry-run"])
    assert res.exit_code == 0 and len(list_indexes()) == len(built) - 2
    res = runner.invoke(app, ["cache", "rm", "--all"])
    assert res.exit_code == 0 and list_indexes() == [] and (root / "not-an-index").is_dir()


@pytest.mark.parametrize(
    "args,msg",
    [
        (["rm"], "say which indexes to remove"),
        (["rm", "--all", "--older-than", "7d"], "only one of"),
        (["rm", "--older-than", "soon"], "is not an age"),
        (["rm", "ffffffffff"], "no index 'ffffffffff'"),
        (["frobnicate"], "unknown action"),
        (["--all"], "go with rm"),
    ],
)
def test_cache_user_errors(tmp_path, monkeypatch, args, msg):
    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))
    res = runner.invoke(app, ["cache", *args])
    assert_one_line_error(res, msg)
