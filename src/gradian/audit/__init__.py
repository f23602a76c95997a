"""Audit: deterministic checks over a fine-tune's data, config, tokenizer and logs (no GPU, no weights).

Public API::

    from gradian.audit import diagnose, load_config
    result = diagnose(data="train.jsonl", eval="eval.jsonl", configs=["sft.yaml", "adapter/"],
                      logs="trainer_state.json", tokenizer="base_model_dir", versions={"trl": "0.19.0"})
    result.findings      # ordered by what to fix first; each has id, severity, row_ids, evidence, fix
    result.skipped       # checks whose input was not given / that do not apply, with the reason
    result.counts        # {"error": .., "warning": .., "info": .., "skipped": .., "passed": .., "checks": ..}
    result.to_dict()     # JSON (schema gradian.audit/1, see docs/diagnose.md)

    cfg = load_config(["axolotl.yaml"])   # one TrainConfig view of any supported config format
    cfg.learning_rate, cfg.source("learning_rate")   # 0.0002, "axolotl.yaml: learning_rate"

Importing this package imports the check modules, so :data:`REGISTRY` holds every check as soon as it is imported.
"""

from gradian.audit import (  # noqa: F401  (fill REGISTRY)
    checks_config,
    checks_content,
    checks_dataset,
    checks_eval,
    checks_export,
    checks_logs,
    checks_preference,
    checks_setup,
    checks_template,
    checks_tokens,
)
from gradian.audit.config import TrainConfig, load_config
from gradian.audit.logs import TrainLog, load_logs
from gradian.audit.model import JSON_SCHEMA, AuditResult, Finding, SkippedCheck
from gradian.audit.registry import REGISTRY, CheckSpec, all_checks
from gradian.audit.runner import diagnose

__all__ = [
    "diagnose",
    "load_config",
    "load_logs",
    "TrainConfig",
    "TrainLog",
    "AuditResult",
    "Finding",
    "SkippedCheck",
    "JSON_SCHEMA",
    "REGISTRY",
    "CheckSpec",
    "all_checks",
]
