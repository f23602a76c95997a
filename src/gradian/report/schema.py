"""The JSON Schema of the report (``gradian.report/1``): :data:`REPORT_JSON_SCHEMA`."""

from __future__ import annotations

from typing import Any

from gradian.report.views import LEVELS, REPORT_SCHEMA
from gradian.runfile import RUN_SCHEMA
from gradian.schema import BOOLEAN, INTEGER, NUMBER, OBJECT, STRING, arr, nullable, obj

_S = STRING
_NS = nullable(STRING)
_I = INTEGER
_N = nullable(NUMBER)  # null where a number is undefined (NaN)
_B = BOOLEAN
_O = OBJECT
_NO = nullable(OBJECT)


_QUALIFIER = obj({"kind": _S, "level": {"enum": list(LEVELS)}, "text": _S})
_PROFILE = obj(
    {
        "n": _I,
        "n_negative": _I,
        "n_positive": _I,
        "min": _N,
        "max": _N,
        "median": _N,
        "total_negative": _N,
        "tail_n": _I,
        "tail_mass": _N,
        "points": arr({"type": "array", "prefixItems": [_I, _N, _B]}),
    }
)
_EXPLANATION = obj(
    {
        "source": {"enum": ["audit", "cluster"]},
        "check": _NS,
        "finding": {"type": ["integer", "null"]},
        "name": _NS,
        "severity": _NS,
        "kind": {"enum": ["untrained", "holds_all", "majority", "enriched"]},
        "overlap": _I,
        "size": _I,
        "finding_rows": {"type": ["integer", "null"]},
        "cluster_share": _N,
        "finding_share": _N,
        "dataset_share": _N,
        "text": _S,
    }
)
_CLUSTER = obj(
    {
        "label": _I,
        "size": _I,
        "harmful_share": _N,
        "score": _N,
        "row_ids": arr(_S),
        "exemplars": arr(_O),
        "common": _O,
        "explanations": arr(_EXPLANATION),
        "mechanics": _O,
        "best_rank": _I,
        "verdict_score": _N,
    }
)
_DRILL = obj(
    {
        "id": _S,
        "item_id": _S,
        "row_score_for_item": _N,
        "text": _S,
        "text_source": {"enum": ["row", "sentences"]},
        "segments": arr(obj({"text": _S, "sentence": {"type": ["integer", "null"]}})),
        "sentences": arr(_O),
        "verdict_score": _N,
        "item_note": _S,
    }
)
_ATTRIBUTION = obj(
    {
        "engine": _S,
        "engines": arr(_S),
        "n_train": _I,
        "n_failing": _I,
        "query_kinds": _O,
        "agreement": _NO,
        "profile": _PROFILE,
        "clusters": arr(_CLUSTER),
        "explained_share": _N,
        "ranked": arr(_O),
        "drilldown": arr(_DRILL),
        "failing_items": arr(_O),
        "evidence": _NO,
        "blamed": arr(_S),
    },
    nullable=True,
)
_CAPABILITY = obj(
    {
        "name": _S,
        "metric": _S,
        "unit": {"enum": ["accuracy", "nats"]},
        "n": _I,
        "reference_score": _N,
        "tuned_score": _N,
        "delta": _N,
        "ci_low": _N,
        "ci_high": _N,
        "confidence": _N,
        "verdict": {"enum": ["regressed", "improved", "within_noise"]},
        "diagnosed": _B,
        "reason": _S,
        "sign_test_p": _N,
        "n_kept": _I,
        "n_lost": _I,
        "n_gained": _I,
        "n_both_fail": _I,
        "base_bounds": _O,
        "qualifiers": arr(_QUALIFIER),
        "attribution": _ATTRIBUTION,
    }
)
_FINDING = obj(
    {
        "id": _S,
        "name": _S,
        "title": _S,
        "severity": {"enum": ["error", "warning", "info"]},
        "reads": arr(_S),
        "message": _S,
        "fix": _S,
        "evidence": _O,
        "n_rows": _I,
        "row_ids": arr(_S),
        "n_steps": _I,
        "steps": arr(_I),
        "fraction": _N,
        "clusters": arr(obj({"capability": _S, "label": _I, "overlap": _I, "explains": _B})),
    }
)
_AUDIT = obj(
    {"counts": _O, "findings": arr(_FINDING), "passed": arr(_S), "skipped": arr(_O), "notes": arr(_S)}, nullable=True
)
_POINTS = arr({"type": "array", "prefixItems": [_I, _N]})
_LOG = obj(
    {
        "path": _NS,
        "status": {"enum": ["plotted", "changed", "missing", "unreadable", "not_read"]},
        "note": _NS,
        "loss": _POINTS,
        "eval_loss": _POINTS,
        "learning_rate": _POINTS,
        "anomalies": arr(obj({"check": _S, "name": _S, "severity": _S, "steps": arr(_I), "message": _S})),
    },
    nullable=True,
)

#: JSON Schema (draft 2020-12 subset: type, required, properties, items, prefixItems, enum) of ``Report.to_dict()``
#: as written by :func:`gradian.report.io.report_json`. ``docs/report.md`` documents every field.
REPORT_JSON_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": REPORT_SCHEMA,
    **obj(
        {
            "schema": {"enum": [REPORT_SCHEMA]},
            "run_id": _S,
            "status": {"enum": ["attributed", "stopped", "not_attributed"]},
            "headline": arr(_S),
            "capabilities": arr(_CAPABILITY),
            "audit": _AUDIT,
            "training_log": _LOG,
            "manifest": _O,
            "timing": _O,
            "stopped": _NS,
            "notes": arr(_S),
            "gradian_version": _S,
            "verification": _NO,
            "run_schema": {"enum": [RUN_SCHEMA]},
        }
    ),
}
