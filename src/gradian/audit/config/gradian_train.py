"""The ``training_config.yaml`` that ``gradian train`` writes: TRL names, read as TRL (same masks, same EOS rule)."""

from __future__ import annotations

from typing import Any

from gradian.audit.config import trl
from gradian.audit.config.reader import BY_GRADIAN_TRAIN, Format


def _claims(raw: dict[str, Any]) -> bool:
    # gradian train writes messages_loss (older versions did not, but always wrote the header line)
    return (raw.get("messages_loss") is not None and "use_peft" in raw) or bool(raw.get(BY_GRADIAN_TRAIN))


#: what ``gradian train`` uses where its config is silent and TRL's default differs
#: (:class:`gradian.trainconfig.TrainSpec`; tests/audit/test_hf_order.py holds the two equal): the reader fills in
#: TRL's, so a reader of the run's order asks here
TRAIN_DEFAULTS = {"group_by_length": True, "seed": 0}


FORMAT = Format(
    name="gradian",
    title="gradian train",
    read=trl.read,
    order=1,
    claims=_claims,
    trainer="trl",
    trainer_note="format: gradian train, TRL semantics",
)
