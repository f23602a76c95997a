"""A full disk is one error line naming the folder and the bytes needed, never a traceback, and leaves
nothing half-written (issue 21, case 5c).

The disk is simulated: :class:`TinyDisk` wraps ``os.fdopen`` (what :func:`gradian.util.atomic_write_bytes`
writes through) so that files opened for writing under one folder can take only ``budget`` more bytes;
the write that crosses it writes what fits, then raises ``OSError(ENOSPC)``, as a full file system does.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradian.cli import app
from gradian.util import DiskFullError, atomic_write_json
from gradian_testlib import cli_args

sys.path.insert(0, str(Path(__file__).parent / "report"))  # report_world: a real run folder

runner = CliRunner()
_real_fdopen = os.fdopen


class _Writer:
    def __init__(self, f, disk: TinyDisk):
        self._f, self._disk = f, disk

    def write(self, b) -> int:
        n = min(len(b), self._disk.left)
        self._f.write(b[:n])
        self._disk.left -= n
        if n < len(b):
            self._f.flush()  # the partial file really is on disk: the writer must remove it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __getattr__(self, name):
        return getattr(self._f, name)


class TinyDisk:
    """Files written under ``folder`` share ``budget`` bytes; past it, ``ENOSPC``."""

    def __init__(self, folder: Path, budget: int):
        self.folder, self.left = Path(folder).resolve(), budget

    def fdopen(self, fd, mode="r", *a, **k):
        f = _real_fdopen(fd, mode, *a, **k)
        if "w" in mode or "a" in mode:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if path.is_relative_to(self.folder):
                return _Writer(f, self)
        return f


def _full(monkeypatch, folder: Path, budget: int) -> TinyDisk:
    disk = TinyDisk(folder, budget)
    monkeypatch.setattr(os, "fdopen", disk.fdopen)
    return disk


def _cli(args):
    res = runner.invoke(app, [str(a) for a in args])
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    return res.exit_code, lines, res


def _temps(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def _disk_full_line(code, lines, res, folder: Path) -> str:
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert code == 2, res.output
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    line = errors[0]
    assert "the disk is full" in line and str(folder) in line and "bytes" in line and "ENOSPC" in line, line
    return line


def test_atomic_writer_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "run.json"
    atomic_write_json(target, {"old": True})
    _full(monkeypatch, tmp_path, 5)
    with pytest.raises(DiskFullError) as e:
        atomic_write_json(target, {"new": "x" * 1000})
    assert e.value.needed > 1000 and e.value.folder == str(tmp_path)
    assert json.loads(target.read_text()) == {"old": True} and _temps(tmp_path) == []


def _index_args(sf, out):
    """``gradian index`` over 32 rows in 4 shards (the shard size is rounded up to the batch size, 8)."""
    data = Path(out).parent / "train32.jsonl"
    if not data.exists():
        rows = [json.loads(ln) for ln in Path(sf["data"]).read_text().splitlines()]
        data.write_text(
            "".join(json.dumps({**r, "id": f"{r['id']}-{i}"}) + "\n" for i, r in enumerate((rows * 3)[:32]))
        )
    return cli_args(
        "index",
        base=sf["base"],
        adapter=sf["adapter"],
        data=data,
        max_length=64,
        shard_size=8,
        unit="row",  # one index (the default, sentence, builds the sentence-unit index too)
        out=out,
    )


def test_index_build_on_a_full_disk(saved_finetune, tmp_path, monkeypatch):
    """ENOSPC mid-build: exit 2, one line; the shards written before stay valid, no temp file; the next build
    on free disk reuses them and ends with the same index (id and every shard's bytes) as a build that never
    ran out of space."""
    from gradian.index.store import GradientIndex

    ref_out = tmp_path / "ref"
    assert _cli(_index_args(saved_finetune, ref_out))[0] == 0
    (ref_folder,) = [p for p in ref_out.iterdir() if p.is_dir()]
    ref = GradientIndex(ref_folder)
    assert len(ref.manifest["shards"]) >= 3
    shard0 = (ref_folder / ref.manifest["shards"][0]["file"]).stat().st_size

    out = tmp_path / "full"
    out.mkdir()
    # room for the first shard, its record and the small files, not for the second shard
    _full(monkeypatch, out, shard0 + 20_000)
    line = _disk_full_line(*_cli(_index_args(saved_finetune, out)), out)
    assert "shard-00001.safetensors and the" in line and "kept" in line
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    assert _temps(out) == []
    kept = sorted(p.name for p in folder.glob("shard-*.safetensors"))
    assert kept == ["shard-00000.safetensors"]
    assert (folder / "shard-00000.safetensors").read_bytes() == (ref_folder / "shard-00000.safetensors").read_bytes()

    monkeypatch.setattr(os, "fdopen", _real_fdopen)  # space freed
    code, lines, res = _cli(_index_args(saved_finetune, out))
    assert code == 0, res.output
    assert any("1 of" in ln and "shards already built" in ln for ln in lines), res.output
    idx = GradientIndex(folder)
    assert idx.complete and idx.id == ref.id and idx.verify() == []
    assert [s["sha256"] for s in idx.manifest["shards"]] == [s["sha256"] for s in ref.manifest["shards"]]


def test_index_that_cannot_fit_is_refused_before_the_build(saved_finetune, tmp_path, monkeypatch):
    import gradian.index.build as build

    monkeypatch.setattr(build, "free_bytes", lambda folder: 1000)
    out = tmp_path / "idx"
    code, lines, res = _cli(_index_args(saved_finetune, out))
    assert code == 2 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in lines if ln.startswith("error:")]
    assert "the disk is full" in line and "remaining shard(s)" in line and "1,000 bytes free" in line, line
    assert "no shard was written" in line and str(out) in line
    assert not list(out.rglob("shard-*")) and _temps(out) == []


def test_report_out_on_a_full_disk(tmp_path, monkeypatch):
    import shutil

    from report_world import real_run

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(real_run()["run_dir"] / "run.json", run_dir / "run.json")
    disk = tmp_path / "disk"
    disk.mkdir()
    _full(monkeypatch, disk, 100)
    for fmt in ("md", "html", "json"):
        target = disk / f"report.{fmt}"
        _disk_full_line(*_cli(["report", run_dir, "--format", fmt, "--out", target]), disk)
        assert not target.exists() and list(disk.iterdir()) == []
    # and the default (RUN_DIR/report.html) on a full run folder
    _full(monkeypatch, run_dir, 100)
    _disk_full_line(*_cli(["report", run_dir]), run_dir)
    assert sorted(p.name for p in run_dir.iterdir()) == ["run.json"]


def test_evaluate_out_on_a_full_disk(saved_finetune, tmp_path, monkeypatch):
    ev = tmp_path / "eval.jsonl"
    ev.write_text(
        "".join(
            json.dumps({"id": f"e{i}", "prompt": q, "answer": a, "capability": "capitals", "metric": "contains"}) + "\n"
            for i, (q, a) in enumerate([("The capital of France is", "Paris"), ("The capital of Japan is", "Tokyo")])
        )
    )
    disk = tmp_path / "disk"
    disk.mkdir()
    _full(monkeypatch, disk, 50)
    target = disk / "result.json"
    args = ["evaluate", "--base", saved_finetune["base"], "--adapter", saved_finetune["adapter"], "--eval", ev]
    _disk_full_line(*_cli([*args, "--max-new-tokens", "4", "--out", target]), disk)
    assert list(disk.iterdir()) == []


def test_a_library_write_on_a_full_disk_is_one_line(monkeypatch, tmp_path):
    """A write Gradian does not own (a library's save) failing with ENOSPC: one line, exit 2, the folder named."""
    import gradian.worlds as worlds

    def boom(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "w" / "model.safetensors"))

    monkeypatch.setattr(worlds, "build_world", boom)
    code, lines, res = _cli(["world", "--kind", "tiny", "--out", tmp_path / "w"])
    assert code == 2 and "Traceback" not in res.output, res.output
    (line,) = [ln for ln in lines if ln.startswith("error:")]
    assert "the disk is full" in line and str(tmp_path / "w") in line
