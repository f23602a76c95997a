"""``training_args.bin`` read without unpickling it (``gradian.audit.config.training_args``).

The real file a TRL run saves is read in ``test_audit_trl_folder.py``; here the reader is held to every pickle
protocol, to pickles that would run code if loaded, and to damaged or foreign files.
"""

from __future__ import annotations

import enum
import io
import json
import os
import pickle
import zipfile
from dataclasses import dataclass, field

import pytest

from gradian.audit.config import load_config
from gradian.audit.config.runfolder import find_run_folder
from gradian.audit.config.training_args import read_training_args
from gradian.errors import GradianUserError


class Schedule(enum.Enum):
    LINEAR = "linear"
    COSINE = "cosine"


@dataclass
class Accel:
    split_batches: bool = False
    gradient_accumulation_kwargs: dict | None = None


@dataclass
class Args:
    """Stands in for a TrainingArguments subclass: an enum, a nested dataclass, containers, a secret."""

    output_dir: str = "out"
    learning_rate: float = 2e-4
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 4
    max_steps: int = -1
    lr_scheduler_type: Schedule = Schedule.COSINE
    max_length: int | None = 512
    assistant_only_loss: bool = True
    report_to: list = field(default_factory=lambda: ["none"])
    lora_target_modules: tuple = ("q_proj", "v_proj")
    accelerator_config: Accel = field(default_factory=Accel)
    fsdp_config: dict = field(default_factory=lambda: {"min_num_params": 0, "xla": False})
    seed: int = 2**70  # a LONG
    hub_token: str | None = "hf_secret"
    eos_token: str | None = "<|im_end|>"


WANT = {
    "output_dir": "out",
    "learning_rate": 2e-4,
    "num_train_epochs": 3.0,
    "per_device_train_batch_size": 4,
    "max_steps": -1,
    "lr_scheduler_type": "cosine",
    "max_length": 512,
    "assistant_only_loss": True,
    "report_to": ["none"],
    "lora_target_modules": ["q_proj", "v_proj"],
    "accelerator_config": {"split_batches": False, "gradient_accumulation_kwargs": None},
    "fsdp_config": {"min_num_params": 0, "xla": False},
    "seed": 2**70,
    "hub_token": "<HUB_TOKEN>",  # a secret is never shown
    "eos_token": "<|im_end|>",  # a setting, kept
}


def _torch_zip(path, payload: bytes, name: str = "training_args/data.pkl") -> None:
    """A file laid out as ``torch.save`` writes it: a zip archive whose ``<name>/data.pkl`` is the pickle."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(name, payload)
        z.writestr("training_args/version", "3\n")
    path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_protocol_reads_as_to_dict_would_show_it(tmp_path, protocol):
    path = tmp_path / "training_args.bin"
    _torch_zip(path, pickle.dumps(Args(), protocol=protocol))
    settings, cls = read_training_args(path)
    assert settings == WANT
    assert cls == f"{__name__}.Args"
    path.write_bytes(pickle.dumps(Args(), protocol=protocol))  # an old torch.save: the bare pickle
    assert read_training_args(path) == (WANT, cls)


def test_torch_save_itself_is_read(tmp_path):
    import torch

    path = tmp_path / "training_args.bin"
    torch.save(Args(), path)
    assert read_training_args(path)[0] == WANT


class _Runs:
    """Unpickling this would call ``os.system``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_would_run_code_is_read_without_running_it(tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("code from the pickle ran")

    marker = tmp_path / "ran"
    args = Args()
    args.output_dir = _Runs(marker)  # type: ignore[assignment]
    path = tmp_path / "training_args.bin"
    _torch_zip(path, pickle.dumps(args, protocol=2))
    top = tmp_path / "top.bin"
    top.write_bytes(pickle.dumps(_Runs(marker), protocol=4))
    monkeypatch.setattr(os, "system", never)
    settings, _ = read_training_args(path)
    assert settings["output_dir"] == f"touch {marker}" and not marker.exists()  # the call's argument, not its result
    path = top
    with pytest.raises(GradianUserError, match="does not hold training arguments"):
        read_training_args(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload, what",
    [
        (b"\x80\x04 not a pickle", "a malformed pickle"),
        (pickle.dumps(Args(), protocol=2)[:-40], "a malformed pickle"),
        (pickle.dumps([[[]]] * 3, protocol=2), "does not hold training arguments"),
        (b"\x80\x02(S'x'\nS'y'\ni__main__\nC\n.", "opcode INST"),  # protocol 0's INST: refused
    ],
)
def test_damaged_or_foreign_pickles_are_one_line_errors(tmp_path, payload, what):
    path = tmp_path / "training_args.bin"
    path.write_bytes(payload)
    with pytest.raises(GradianUserError, match=what) as e:
        read_training_args(path)
    assert str(path) in str(e.value) and "--config" in str(e.value) and "\n" not in str(e.value)


def test_tensors_and_archives_that_are_not_training_args_are_refused(tmp_path):
    import torch

    path = tmp_path / "training_args.bin"
    torch.save({"w": torch.zeros(2)}, path)  # a tensor is a persistent id: refused, nothing loaded
    with pytest.raises(GradianUserError, match="opcode BINPERSID"):
        read_training_args(path)
    _torch_zip(path, b"", name="elsewhere/other.pkl")
    with pytest.raises(GradianUserError, match="0 data.pkl in the archive"):
        read_training_args(path)
    path.write_bytes(b"PK\x03\x04 damaged")
    with pytest.raises(GradianUserError, match="a damaged archive"):
        read_training_args(path)
    with open(path, "wb") as f:  # sparse: a file far larger than any training arguments is refused unread
        f.truncate(64 << 20)
    with pytest.raises(GradianUserError, match="64 MiB, over the 16 MiB"):
        read_training_args(path)
    path.write_bytes(b'{"learning_rate": 1}')  # JSON under the pickle's name
    with pytest.raises(GradianUserError, match="a malformed pickle"):
        read_training_args(path)


def test_nesting_is_bounded(tmp_path):
    deep: list = []
    for _ in range(200):
        deep = [deep]
    args = Args()
    args.report_to = deep
    path = tmp_path / "training_args.bin"
    path.write_bytes(pickle.dumps(args, protocol=4))
    with pytest.raises(GradianUserError, match="nested over"):
        read_training_args(path)


def test_shared_values_cannot_multiply(tmp_path):
    """Each level lists the one below twice: 40 levels are 2**40 values once copied; the walk stops at its budget."""
    shared: list = []
    for _ in range(40):
        shared = [shared, shared]
    args = Args()
    args.report_to = shared
    path = tmp_path / "training_args.bin"
    path.write_bytes(pickle.dumps(args, protocol=4))
    assert path.stat().st_size < 10_000
    with pytest.raises(GradianUserError, match="over 1000000 values"):
        read_training_args(path)


def test_an_explicit_config_reads_it_and_the_cli_refuses_a_bad_one_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from gradian.cli import app

    path = tmp_path / "training_args.bin"
    _torch_zip(path, pickle.dumps(Args(), protocol=2))
    cfg = load_config([str(path)])
    assert (cfg.max_length, cfg.learning_rate, cfg.lr_scheduler) == (512, 2e-4, "cosine")
    assert cfg.source("max_length") == "training_args.bin: max_length"
    bad = tmp_path / "bad" / "training_args.bin"
    bad.parent.mkdir()
    bad.write_bytes(b"\x80\x04 junk")
    res = CliRunner().invoke(app, ["diagnose", "--config", str(bad)])
    assert res.exit_code == 2
    (line,) = [x for x in res.output.splitlines() if x.strip()]
    assert "cannot be read without unpickling it" in " ".join(res.output.split())


def _adapter(folder):
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16}))
    return folder


def test_run_folder_reads_a_transformers_class_and_leaves_another_trainer_s_to_its_card(tmp_path):
    """A run folder's training_args.bin is read on its own when TRL or transformers saved it; LLaMA-Factory's
    subclass keeps the length and template elsewhere, so its card (the trainer's defaults) decides there."""
    out = _adapter(tmp_path / "hf")
    body = pickle.dumps(Args(), protocol=2)
    here = f"c{__name__}\nArgs\n".encode()
    assert here in body
    _torch_zip(out / "training_args.bin", body.replace(here, b"ctransformers.training_args\nTrainingArguments\n"))
    found = find_run_folder(out)
    assert found.configs == (out / "training_args.bin",) and found.notes == () and found.setup_note is None
    assert "(training arguments, read without unpickling)" in found.lines()[0]
    ck = _adapter(out / "checkpoint-5")  # a checkpoint's own copy is read when the adapter is the checkpoint
    _torch_zip(ck / "training_args.bin", body.replace(here, b"ctransformers.training_args\nTrainingArguments\n"))
    assert find_run_folder(ck).configs == (ck / "training_args.bin",)
    (out / "training_config.yaml").write_text("max_length: 256\n")  # a text config above it wins
    assert find_run_folder(ck).configs == (out / "training_config.yaml",)

    lf = _adapter(tmp_path / "lf")
    lf_class = b"cllamafactory.hparams.training_args\nTrainingArguments\n"
    _torch_zip(lf / "training_args.bin", body.replace(here, lf_class))
    (lf / "README.md").write_text("---\nlibrary_name: peft\ntags:\n- llama-factory\n- lora\n---\n# sft\n")
    found = find_run_folder(lf)
    assert found.configs == () and found.card is not None and found.card.trainer == "llamafactory"
    assert "LLaMA-Factory's defaults" in found.setup_note
