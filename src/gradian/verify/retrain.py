"""Retraining for ``gradian verify``: the same training run on an edited training set.

Two trainers:

* :class:`GradianTrainer` (default): ``gradian train`` with the run's own settings, read from the
  adapter's ``training_config.yaml`` (what ``gradian train`` leaves behind) or mapped from a TRL,
  axolotl, LLaMA-Factory or torchtune config through Audit's readers. Settings that cannot be
  mapped are named (``unmapped``), never silently dropped.
* :class:`CommandTrainer`: the user's own trainer, ``--train-command 'my_trainer --data {data}
  --out {out} --seed {seed}'``. ``{data}`` is the edited JSONL, ``{out}`` the adapter folder to
  write, ``{seed}`` the training seed, ``{base}`` the base model. Each placeholder is shell-quoted.

Every finished retrain is cached by content, ``<cache>/verify/<key>/`` with
``key = sha256(trainer identity, base identity, edited data sha256, seed)``, so a resumed verify
reuses it. A retrain is trained into a temporary folder and published with one rename: a failed
or interrupted one leaves nothing behind.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gradian.errors import GradianUserError
from gradian.paths import cache_dir
from gradian.util import publish_folder, sha256_json

# Audit's TrainConfig field -> TrainSpec field (what a foreign config can tell gradian train).
_MAP = {
    "learning_rate": "learning_rate",
    "num_epochs": "num_train_epochs",
    "micro_batch_size": "per_device_train_batch_size",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "warmup_ratio": "warmup_ratio",
    "lr_scheduler": "lr_scheduler_type",
    "max_grad_norm": "max_grad_norm",
    "max_length": "max_length",
    "lora_r": "r",
    "lora_alpha": "lora_alpha",
    "lora_dropout": "lora_dropout",
    "use_rslora": "use_rslora",
    "use_dora": "use_dora",
    "seed": "seed",
}
# Settings a foreign config may carry that gradian train cannot reproduce (named in the result).
_NOT_REPRODUCED = ("max_steps", "warmup_steps", "packing", "modules_to_save", "weight_decay", "optim")


@dataclass
class GradianTrainer:
    """``gradian train`` with fixed settings; ``unmapped`` names what a foreign config said that is not reproduced."""

    base: str
    spec: Any  # gradian.trainconfig.TrainSpec
    source: str
    unmapped: list[str] = field(default_factory=list)
    trust_remote_code: bool = False  # only ever from the command line / API call, never from run.json
    #: the run's own rendering (a TokenizeSpec with a chat template, axolotl's or torchtune's mask) that the
    #: retrains tokenise with (:func:`with_run_tokenize`); None: the one ``spec`` gives
    tokenize: Any = None

    def identity(self) -> dict[str, Any]:
        out = {"trainer": "gradian train", "spec": self.spec.to_dict()}
        if self.tokenize is not None:  # only when set: the retrain cache keys of other runs do not move
            out["tokenize"] = self.tokenize.to_dict()
        return out

    def train(self, data: Path, out: Path, seed: int) -> None:
        from gradian.train import train_lora

        train_lora(
            self.base,
            data,
            out,
            self.spec.replace(seed=seed),
            overwrite=True,
            trust_remote_code=self.trust_remote_code,
            tokenize=self.tokenize,
        )

    def describe(self) -> dict[str, Any]:
        out = {
            "trainer": "gradian train",
            "config": self.source,
            "spec": self.spec.to_dict(),
            "unmapped": self.unmapped,
        }
        if self.tokenize is not None:
            out["tokenize"] = self.tokenize.to_dict()
        return out


def with_run_tokenize(trainer, tokenize):
    """``trainer`` retraining with the run's tokenisation when ``gradian train``'s own fields cannot say it.

    A run whose gradients were taken with a chat template (:attr:`TokenizeSpec.chat_template`), axolotl's mask
    (``train_roles``) or torchtune's rendering (``chat_rule``) is retrained with that whole
    :class:`~gradian.data.tokenize.TokenizeSpec` (its max length and loss mask too), so the retrains see the tokens
    the gradients saw. Other runs, and a ``--train-command`` trainer, are returned as they are.
    """
    import dataclasses

    if not isinstance(trainer, GradianTrainer) or tokenize is None:
        return trainer
    if tokenize.chat_template is None and tokenize.train_roles is None and tokenize.chat_rule is None:
        return trainer
    return dataclasses.replace(trainer, tokenize=tokenize)


@dataclass
class CommandTrainer:
    """The user's trainer as a command line template (module docstring)."""

    template: str
    base: str

    def identity(self) -> dict[str, Any]:
        return {"trainer": "command", "template": self.template}

    def train(self, data: Path, out: Path, seed: int) -> None:
        try:
            cmd = self.template.format(
                data=shlex.quote(str(data)), out=shlex.quote(str(out)), seed=seed, base=shlex.quote(self.base)
            )
        except (KeyError, IndexError, ValueError) as e:
            raise GradianUserError(
                f"--train-command has an unknown placeholder ({e})",
                where="--train-command",
                fix="use only {data}, {out}, {seed} and {base}",
            ) from None
        log = out.parent / f"{out.name}.log"
        with open(log, "w") as f:
            proc = subprocess.run(cmd, shell=True, stdout=f, stderr=subprocess.STDOUT)
        tail = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()][-1:] or ["(no output)"]
        log.unlink(missing_ok=True)
        if proc.returncode != 0:
            raise GradianUserError(
                f"the train command failed with exit code {proc.returncode}: {tail[0][:200]}",
                where="--train-command",
                fix="run the command by hand with {data}/{out} filled in",
            )
        if not (
            (out / "adapter_config.json").is_file()
            and any((out / n).is_file() for n in ("adapter_model.safetensors", "adapter_model.bin"))
        ):
            raise GradianUserError(
                "the train command wrote no PEFT adapter into {out}",
                where="--train-command",
                fix="make the trainer save the adapter (save_pretrained) into the {out} folder",
            )

    def describe(self) -> dict[str, Any]:
        return {"trainer": "command", "template": self.template}


def trainer_for(
    run: dict[str, Any], config: str | Path | None, train_command: str | None, *, trust_remote_code: bool = False
):
    """The trainer ``gradian verify`` retrains with (module docstring).

    ``train_command`` and ``trust_remote_code`` come from the caller only; run.json names no command.
    """
    import dataclasses

    base = run["manifest"]["paths"]["base"]
    if train_command:
        return CommandTrainer(train_command, base)
    trainer = _trainer_from_config(run, config, base)
    return dataclasses.replace(trainer, trust_remote_code=trust_remote_code)


def _trainer_from_config(run: dict[str, Any], config: str | Path | None, base: str) -> GradianTrainer:
    from gradian.trainconfig import CONFIG_NAME, spec_from_config

    adapter = Path(run["manifest"]["paths"]["adapter"])
    if config is None and (adapter / CONFIG_NAME).is_file():
        return GradianTrainer(base, spec_from_config(adapter / CONFIG_NAME), str(adapter / CONFIG_NAME))
    if config is None:
        cands = [Path(c) for c in run["manifest"]["paths"].get("configs") or []]
        config = next((c for c in cands if c.is_file()), None)
    if config is None:
        raise GradianUserError(
            "no training config to retrain with",
            where=str(adapter),
            fix=f"pass --config (a TRL/axolotl/LLaMA-Factory/torchtune file or gradian's {CONFIG_NAME}) "
            "or --train-command",
        )
    config = Path(config)
    try:  # gradian's own format first
        return GradianTrainer(base, spec_from_config(config), str(config))
    except GradianUserError:
        pass
    return _from_foreign(base, config, adapter)


def _from_foreign(base: str, config: Path, adapter: Path) -> GradianTrainer:
    from gradian.audit.config import read_config
    from gradian.trainconfig import TrainSpec

    tc = read_config(config)
    if getattr(tc, "finetuning", None) not in (None, "lora"):
        raise GradianUserError(
            f"the config describes a {tc.finetuning} run; gradian verify retrains LoRA adapters",
            where=str(config),
            fix="pass the LoRA run's config, or --train-command",
        )
    kw: dict[str, Any] = {}
    for src, dst in _MAP.items():
        v = getattr(tc, src, None)
        if v is not None:
            kw[dst] = v
    tm = getattr(tc, "lora_target_modules", None)
    if tm:
        kw["target_modules"] = tuple(tm) if isinstance(tm, (list, tuple)) else tuple(str(tm).split(","))
    else:  # the adapter itself says which layers it trained
        cfg = json.loads((adapter / "adapter_config.json").read_text())
        if isinstance(cfg.get("target_modules"), list):
            kw["target_modules"] = tuple(cfg["target_modules"])
    if getattr(tc, "train_on_inputs", None) is True or getattr(tc, "completion_only_loss", None) is False:
        kw["completion_only_loss"] = False
    unmapped = [k for k in _NOT_REPRODUCED if getattr(tc, k, None) not in (None, False, 0)]
    try:
        spec = TrainSpec().replace(**kw)
        spec.validate(str(config))
    except (TypeError, ValueError) as e:
        raise GradianUserError(
            f"cannot map the config to gradian train ({e})",
            where=str(config),
            fix="pass --train-command to retrain with your own trainer",
        ) from None
    return GradianTrainer(base, spec, f"{config} ({tc.trainer or 'config'})", unmapped)


def retrain_cached(trainer, base_identity: Any, data: Path, data_sha: str, seed: int, say=None) -> tuple[Path, bool]:
    """The adapter trained on ``data`` with ``seed``: from the cache, else trained now and cached.

    Returns:
        ``(adapter folder, reused)``.
    """
    key = sha256_json({"trainer": trainer.identity(), "base": base_identity, "data": data_sha, "seed": seed})[:16]
    folder = cache_dir() / "verify" / key
    adapter = folder / "adapter"
    if (adapter / "adapter_config.json").is_file():
        return adapter, True
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".adapter.", dir=str(folder)))
    try:
        trainer.train(data, tmp, seed)
        publish_folder(tmp, adapter)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return adapter, False
