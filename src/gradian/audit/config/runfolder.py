"""The training config and trainer log a trainer leaves in its output folder, found beside the adapter.

A run is read as it was trained only when Gradian reads the trainer's own settings (max length, loss mask,
template). When ``--config`` (``--logs``) is not given, ``gradian attribute`` and ``gradian index`` read what the
trainer left beside the adapter (``--no-run-folder`` turns it off), and say which files they read:

=========================  ===================================================================================
file                       written by
=========================  ===================================================================================
``training_config.yaml``   ``gradian train`` (TRL names)
``torchtune_config.yaml``  torchtune 0.6.1: the default ``DiskLogger``'s ``log_config`` calls
                           ``training.metric_logging.save_config``, which writes ``{output_dir}/torchtune_config.yaml``;
                           the adapter is saved in ``{output_dir}/epoch_N/``
``training_args.yaml``     LLaMA-Factory 0.9.5's web UI: ``webui.common.save_cmd`` writes the run's arguments to
                           ``{output_dir}/training_args.yaml``
``README.md``              axolotl 0.19.0: ``train.setup_model_card`` writes the raw config into the model card, in a
                           "See axolotl config" block after "axolotl version: `X`"
=========================  ===================================================================================

An HF ``Trainer`` or TRL run leaves its settings only in ``training_args.bin`` (``Trainer.save_model`` writes it beside
the adapter, and into every ``checkpoint-N/``), a pickle of its ``TrainingArguments`` / ``SFTConfig``. Gradian never
unpickles it: it is read statically (:mod:`gradian.audit.config.training_args`), and used when no file above is found
and the pickled class is TRL's or transformers' own (another trainer's subclass, e.g. LLaMA-Factory's, keeps its
length and template elsewhere: that run is read from its model card, :func:`trainer_card`). The trainer log is
``trainer_state.json`` in the folder or in its last ``checkpoint-N/``, or torchtune's ``logs/log_<unix time>.txt``
(:func:`gradian.audit.logs.find_trainer_state` reads each).

The adapter folder is searched first, then its parent when the adapter is a ``checkpoint-N`` (HF) or ``epoch_N``
(torchtune) folder; the first folder holding any of the files is used, so two runs' files are never mixed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from gradian.audit.config.reader import MODEL_CARD, axolotl_card, read_config
from gradian.errors import GradianUserError
from gradian.paths import checkpoint_number
from gradian.safeio import read_text

#: torchtune's copy of the recipe config in its output folder (its DiskLogger's ``log_config``)
TORCHTUNE_CONFIG = "torchtune_config.yaml"
#: The config files a trainer writes into its output folder, in the order they are read (see the module docstring).
RUN_CONFIG_FILES = ("training_config.yaml", TORCHTUNE_CONFIG, "training_args.yaml")

#: TRL's model card (``trl/templates/lm_model_card.md``, TRL 1.16; written into the output folder at every checkpoint
#: save): "It has been trained using [TRL](...)", "This model was trained with <trainer>." and "- TRL: <version>".
_TRL_CARD = re.compile(r"It has been trained using \[TRL\]")
_TRL_TRAINER = re.compile(r"This model was trained with ([A-Za-z0-9_-]+)")
_TRL_VERSION = re.compile(r"^\s*-\s*TRL:\s*v?([0-9][\w.+-]*)", re.M)
#: LLaMA-Factory 0.9.5's card (``train/trainer_utils.py`` ``create_modelcard_and_push``: HF ``Trainer``'s card with
#: the tags ``llama-factory`` and the finetuning type) in the YAML front matter
_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n---", re.S)
_LLAMAFACTORY_TAG = re.compile(r"^\s*-\s*['\"]?llama-factory['\"]?\s*$", re.M)

#: what the setup takes from a card, in words (:func:`gradian.data.setup.card_config`)
_DEFAULTS_SAID = {
    "trl": "TRL's defaults (a messages row: every token)",
    "llamafactory": "LLaMA-Factory's defaults (cutoff_len 2048, every assistant turn)",
}


def _run_folders(adapter: Path) -> list[Path]:
    """The folders to search: the adapter's, then its parent when it is a checkpoint of a run (HF ``checkpoint-N``,
    torchtune ``epoch_N``: :func:`gradian.paths.checkpoint_number`).
    """
    folders = [adapter]
    if checkpoint_number(adapter) is not None:
        folders.append(adapter.parent)
    return folders


#: The pickled ``TrainingArguments`` class of a run folder's ``training_args.bin`` must come from one of these packages
#: to be read on its own (TRL's configs carry the max length and loss mask; transformers' the rest).
_ARGS_PACKAGES = ("trl.", "transformers.")


def _training_args_in(folder: Path) -> tuple[Path | None, str | None]:
    """``(training_args.bin, None)`` when ``folder`` holds one of TRL's or transformers' classes; ``(None, note)``
    when it holds one that is not read (another trainer's class, or a file that does not read); ``(None, None)``
    when it has none.
    """
    from gradian.audit.config.training_args import TRAINING_ARGS_NAME, read_training_args

    path = folder / TRAINING_ARGS_NAME
    if not path.is_file():
        return None, None
    try:
        _, cls = read_training_args(path)
    except GradianUserError as e:
        return None, f"run folder: {path} is not used: {e.what} (pass the run's config with --config)"
    if not cls.startswith(_ARGS_PACKAGES):
        return None, None  # e.g. LLaMA-Factory's TrainingArguments: its model card says more (trainer_card)
    return path, None


def _configs_in(folder: Path) -> list[Path]:
    found = [folder / name for name in RUN_CONFIG_FILES if (folder / name).is_file()]
    card = folder / MODEL_CARD
    if card.is_file():
        try:
            if axolotl_card(card) is not None:
                found.append(card)
        except GradianUserError:  # a model card that cannot be read holds no config we could use
            pass
    return found


@dataclass(frozen=True)
class TrainerCard:
    """What a model card says of the run that wrote it: the trainer (``"trl"``, ``"llamafactory"``), TRL's trainer
    class (``"SFT"`` for ``SFTTrainer``; None for LLaMA-Factory, whose card does not say its stage) and version.
    """

    path: Path
    trainer: str
    kind: str | None
    version: str | None

    def says(self) -> str:
        """``README.md says TRL 1.16.0's SFT trainer``: the source the setup names."""
        if self.trainer == "trl":
            return f"{self.path.name} says TRL {self.version or '(version not given)'}'s {self.kind} trainer"
        return f"{self.path.name} says LLaMA-Factory (its tag llama-factory; the stage is not said, SFT assumed)"

    @property
    def sft(self) -> bool:
        """Whether the card is of a supervised fine-tune (TRL: ``SFTTrainer``; LLaMA-Factory: assumed)."""
        return self.trainer == "llamafactory" or self.kind == "SFT"


def trainer_card(folder: Path) -> TrainerCard | None:
    """The TRL or LLaMA-Factory model card in ``folder`` (``README.md``), or None."""
    card = Path(folder) / MODEL_CARD
    if not card.is_file():
        return None
    try:
        text = read_text(card, "model card")
    except GradianUserError:  # a model card that cannot be read says nothing
        return None
    trainer = _TRL_TRAINER.search(text)
    if _TRL_CARD.search(text) and trainer is not None:
        version = _TRL_VERSION.search(text)
        return TrainerCard(card, "trl", trainer.group(1), version.group(1) if version else None)
    front = _FRONT_MATTER.match(text)
    if front is not None and _LLAMAFACTORY_TAG.search(front.group(1)):
        return TrainerCard(card, "llamafactory", None, None)
    return None


@dataclass(frozen=True)
class RunFolder:
    """What a trainer left beside an adapter.

    Attributes:
        configs: its training config files (:data:`RUN_CONFIG_FILES`, an axolotl model card), in reading order; each
            one reads (:func:`gradian.audit.config.reader.read_config`).
        logs: the folder whose log is read (:func:`gradian.audit.logs.find_trainer_state`: its ``trainer_state.json``,
            its last ``checkpoint-N/trainer_state.json``, or torchtune's ``logs/log_*.txt``).
        notes: one line per file found and not used (it does not read: malformed, an unknown format).
        card: the trainer's model card (TRL, LLaMA-Factory), when no config reads: the setup then takes that
            trainer's defaults (:func:`gradian.data.setup.card_config`).
    """

    configs: tuple[Path, ...] = ()
    logs: Path | None = None
    notes: tuple[str, ...] = ()
    card: TrainerCard | None = None

    def lines(self) -> list[str]:
        """The lines to print: what was read, then the notes (none: nothing found and nothing to say)."""
        read = [
            f"{p} ({'training arguments, read without unpickling' if p.suffix == '.bin' else 'training config'})"
            for p in self.configs
        ]
        if self.logs is not None:
            from gradian.audit.logs import find_trainer_state

            log, _ = find_trainer_state(self.logs)
            read.append(f"{log} (trainer log)")
        head = ["run folder: read " + ", ".join(read) + "; --config / --logs read others"] if read else []
        return head + list(self.notes) + ([self.setup_note] if self.setup_note else [])

    def inputs(
        self, configs: Sequence[str | Path], logs: str | Path | None
    ) -> tuple[list[Path], Path | None, TrainerCard | None]:
        """``(configs, logs, card)`` of a run: those given, else the ones found here; the trainer's card only when the
        run has no config (the setup then takes that trainer's defaults, :func:`gradian.data.setup.card_config`).
        """
        merged = [Path(c) for c in configs] or list(self.configs)
        log = Path(logs) if logs is not None else self.logs
        return merged, log, (None if merged else self.card)

    @property
    def setup_note(self) -> str | None:
        """For a folder with no readable config: where the training setup comes from instead (the trainer's model
        card, else Gradian's defaults when a file was found and not used), or None.
        """
        if self.configs:
            return None
        if self.card is not None and self.card.sft:
            assumed = f"{self.card.says()}, so the setup is {_DEFAULTS_SAID[self.card.trainer]}"
        elif self.notes:
            assumed = "so the run's max length and loss mask are Gradian's defaults"
        else:
            return None
        return (
            f"run folder: no training config that reads here; {assumed}; pass the trainer's config with --config "
            "if it set them"
        )


def find_run_folder(adapter: str | Path, *, configs: bool = True, logs: bool = True) -> RunFolder:
    """The training config files and trainer log beside ``adapter`` (see the module docstring).

    A config file found there that does not read is not used, and a note says why: the run goes on with what the
    other inputs say, where an explicit ``--config`` would have been refused.

    Args:
        configs, logs: look for each (False: the caller was given its own).
    """
    from gradian.audit.logs import find_trainer_state

    adapter = Path(adapter)
    if not adapter.is_dir():
        return RunFolder()
    found: list[Path] = []
    log: Path | None = None
    notes: list[str] = []
    for folder in _run_folders(adapter):
        if configs and not found:
            found = _configs_in(folder)
        if logs and log is None:
            try:  # the folder is a log when --logs would read one from it
                find_trainer_state(folder)
                log = folder
            except GradianUserError:
                pass
    if configs and not found:  # no text config in any of the folders: an HF Trainer's training_args.bin
        for folder in _run_folders(adapter):
            args, note = _training_args_in(folder)
            notes += [note] if note else []
            if args is not None or note is not None:
                found = [args] if args is not None else []
                break
    readable: list[Path] = []
    for path in found:
        try:
            read_config(path)
        except GradianUserError as e:
            notes.append(
                f"run folder: {path} is not used: {e.what} (fix it, or pass the run's config with --config; "
                "--no-run-folder for Gradian's defaults)"
            )
        else:
            readable.append(path)
    card = None
    if configs and not readable:
        card = next((c for c in map(trainer_card, _run_folders(adapter)) if c is not None), None)
    return RunFolder(tuple(readable), log, tuple(notes), card=card)
