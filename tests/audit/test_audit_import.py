"""Import-time guarantees: the check registry is complete on import, and the Audit path never imports torch.

Each test runs a fresh interpreter (a subprocess), since this test session has long since imported torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def test_registry_is_complete_right_after_import():
    res = _python("import gradian.audit; print(len(gradian.audit.REGISTRY))")
    assert res.returncode == 0, res.stderr
    n = int(res.stdout.strip())
    assert n >= 41
    res = _python("import gradian.audit; print(len(gradian.audit.all_checks()))")
    assert int(res.stdout.strip()) == n  # all_checks adds nothing import did not register


def test_import_gradian_and_audit_do_not_import_torch():
    res = _python(
        "import sys, gradian, gradian.audit, gradian.audit.config, gradian.cli\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'datasets') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "print(gradian.__version__, sorted(gradian.__all__))"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[0] == "0.1.0"


def test_lazy_exports_resolve():
    res = _python(
        "import sys, gradian\n"
        "f = gradian.per_example_grads\n"
        "from gradian.gradients.per_example import per_example_grads\n"
        "assert f is per_example_grads and 'per_example_grads' in dir(gradian)\n"
        "from gradian.evaluate.result import EvalResult\n"
        "assert gradian.EvalResult is EvalResult\n"
        "try:\n    gradian.no_such_name\nexcept AttributeError as e:\n    print('ok', e)"
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok") and "no_such_name" in res.stdout


def test_diagnose_command_does_not_import_torch(tmp_path):
    rows = [{"id": f"r{i}", "prompt": f"What is {i} plus {i}?", "completion": f" {2 * i}."} for i in range(40)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    (tmp_path / "sft.yaml").write_text(
        "learning_rate: 2e-4\nnum_train_epochs: 3\nmax_length: 512\nuse_peft: true\nlora_r: 16\nlora_alpha: 32\n"
        "max_steps: 2\nper_device_train_batch_size: 4\n"  # C04 names the 32 rows the run never reached
    )
    out = tmp_path / "audit.json"
    driver = (
        "import sys\n"
        "from gradian.cli import app\n"
        "try:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'datasets') if m in sys.modules]\n"
        "print('CODE', code, 'HEAVY', ','.join(heavy) or '-')\n"
    )
    res = _python(
        driver,
        "diagnose",
        "--data",
        str(tmp_path / "train.jsonl"),
        "--eval",
        str(tmp_path / "eval.jsonl"),
        "--config",
        str(tmp_path / "sft.yaml"),
        "--format",
        "json",
        "--out",
        str(out),
        "--fail-on",
        "never",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "CODE 0 HEAVY -", res.stdout + res.stderr
    report = json.loads(out.read_text())
    assert report["counts"]["checks"] >= 41 and report["inputs"]["config"]["trainer"] == "trl"
    (c04,) = [f for f in report["findings"] if f["id"] == "C04" and "never trained" in f["message"]]
    assert len(c04["row_ids"]) == 32
    # --help of the command, and a user error, stay torch-free too
    for args in (["diagnose", "--help"], ["diagnose", "--data", str(tmp_path / "missing.jsonl")]):
        res = _python(driver, *args)
        last = res.stdout.strip().splitlines()[-1]
        assert last.endswith("HEAVY -") and last.split()[1] in ("0", "2"), res.stdout + res.stderr
