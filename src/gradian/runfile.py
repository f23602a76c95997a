"""The run's file: ``run.json`` (schema ``gradian.run/1``), its JSON Schema, its checks and its loader.

The contract between Attribute (which writes ``RUN_DIR/run.json``: :func:`gradian.attribute.run.attribute_run`,
``gradian verify``) and everything that reads it (the report, ``gradian verify``, the Python API). It stands at
the bottom of the package: importing it imports no torch and nothing of ``attribute/`` or ``report/``, so the
report imports it plainly. Checking a run's *specs* (:func:`check_run`: each ``manifest.identity.specs.*`` must
read through its own dataclass, e.g. ``GradSpec.from_dict``) imports those dataclasses' modules when a run is
checked, since a spec lives with the code it configures; each lives in a torch-free module
(``gradian.models.spec``, ``gradian.index.spec``, ``gradian.attribute.spec``, ``gradian.evaluate.spec``, the engine
files), so loading a run imports no torch either.

* :data:`RUN_SCHEMA` = ``"gradian.run/1"``; :func:`run_json_schema` its JSON Schema;
* :func:`check_run` (schema + cross checks, one-line user errors) and :func:`load_run` (read + check);
* the typed :class:`~gradian.runtypes.Run` and its parts live in :mod:`gradian.runtypes`
  (``Run.from_dict(d).to_dict() == d``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from gradian.errors import GradianUserError

RUN_SCHEMA = "gradian.run/1"


def _run_json_schema() -> dict[str, Any]:
    """:data:`RUN_JSON_SCHEMA`, built once (the evaluation's part is Evaluate's own schema)."""
    from gradian.evaluate.result import RESULT_JSON_SCHEMA
    from gradian.schema import BOOLEAN, INTEGER, NUMBER, OBJECT, STRING, arr, closed, finite, nullable, obj

    def some(props: dict[str, Any], *required: str, null: bool = False) -> dict[str, Any]:
        """An object with these properties, of which only ``required`` must be there (others may be)."""
        return {"type": ["object", "null"] if null else "object", "required": list(required), "properties": props}

    def mapping(values: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": values}

    scores = finite(arr(NUMBER))
    sha = nullable(STRING)
    row = some({"id": STRING, "score": NUMBER}, "id")
    span = {"type": ["array", "null"], "items": INTEGER}
    identity = obj(
        {
            "base": some({"name": STRING, "sha256": STRING, "files": {"type": "null"}}, "name", null=True),
            "adapter": some({"sha256": STRING}, "sha256", null=True),
            "dataset": obj({"name": STRING, "sha256": STRING}),
            "eval": obj({"name": STRING, "sha256": STRING}),
            "configs": mapping(sha),
            "logs": sha,
            "reference_adapter": nullable(STRING),
            "specs": obj(
                {
                    "model": OBJECT,  # each spec is checked against its dataclass (_spec_problem)
                    "grad": OBJECT,
                    "attribute": OBJECT,
                    "eval": nullable(OBJECT),
                    "seed": INTEGER,
                }
            ),
            "index_id": nullable(STRING),
            "trajectory": nullable(OBJECT),
            "versions": mapping(STRING),
        }
    )
    paths = obj(
        {
            "base": STRING,
            "adapter": STRING,
            "data": STRING,
            "eval": STRING,
            "configs": arr(STRING),
            "logs": nullable(STRING),
        }
    )
    checkpoint = some(
        {
            "step": nullable(INTEGER),
            "final": BOOLEAN,
            "weight": finite(NUMBER),
            "adapter_sha256": STRING,
            "path": STRING,
            "optimizer": nullable(STRING),
            "index": OBJECT,
            "engines": OBJECT,
        },
        "final",
        "weight",
        "path",
    )
    query = some(
        {
            "item_id": STRING,
            "capability": STRING,
            "prompt": RESULT_JSON_SCHEMA["properties"]["items"]["items"]["properties"]["prompt"],
            "correct": STRING,
            "said": nullable(STRING),
            "kind": {"enum": ["contrastive", "cross_entropy"]},
            "correct_rule": STRING,
        }
    )
    capability = some(
        {
            "capability": STRING,
            "engine": STRING,
            "n_train": {"type": "integer", "minimum": 0},
            "scores": scores,
            "rank_scores": scores,
            "verdict_scores": {**scores, "type": ["array", "null"]},
            "second_scores": {**scores, "type": ["array", "null"]},
            "queries": arr(query),  # and each against Query's fields (_record_problem)
            "drill_queries": arr(query),  # the drill-down's weakened items (--drill-weakened; older runs lack it)
            "ranked": arr(
                some(
                    {
                        "id": STRING,
                        "rank": INTEGER,
                        "score": NUMBER,
                        "rank_score": NUMBER,
                        "verdict_score": NUMBER,
                        "predicted_loss_delta_if_removed": NUMBER,
                        "tokens": INTEGER,
                        "truncated": BOOLEAN,
                        "completion": STRING,
                        "support": mapping(some({"percentile": NUMBER, "supports": BOOLEAN})),
                        "sentence": OBJECT,
                    },
                    "id",
                )
            ),
            "ranking": OBJECT,
            "agreement": some({"engines": arr(STRING)}, "engines", null=True),
            "evidence": mapping(some({"engine": STRING, "scores": scores}, "scores")),
            "clusters": arr(
                some(
                    {
                        "label": INTEGER,
                        "size": INTEGER,
                        "harmful_share": finite(NUMBER),
                        "score": finite(NUMBER),
                        "row_ids": arr(STRING),
                        "exemplars": arr(OBJECT),
                        "common": OBJECT,
                    },
                    "label",
                    "row_ids",
                )
            ),
            "drilldown": arr(
                some(
                    {
                        "id": STRING,
                        "sentences": arr(
                            some(
                                {
                                    "char_start": INTEGER,
                                    "char_end": INTEGER,
                                    "text": STRING,
                                    "score": finite(NUMBER),
                                    "share": finite(NUMBER),
                                    "n_tokens": INTEGER,
                                },
                                "char_start",
                                "char_end",
                                "text",
                                "score",
                            )
                        ),
                    },
                    "id",
                )
            ),
            "per_item_top": mapping(arr(row)),
            "row_sentences": {"type": ["array", "null"], "items": span},
            "failing_items": closed(RESULT_JSON_SCHEMA["properties"]["failing_items"]),
            "drill_items": closed(RESULT_JSON_SCHEMA["properties"]["failing_items"]),
        },
        "capability",
        "engine",
        "n_train",
        "scores",
        "rank_scores",
        "queries",
        "ranked",
        "clusters",
        "failing_items",
    )
    attribution = some(
        {
            "index": some(
                {"id": STRING, "root": STRING, "reused": BOOLEAN, "n": INTEGER, "blocks": INTEGER, "dims": INTEGER}
            ),
            "trajectory": some(
                {
                    "weight_rule": STRING,
                    "checkpoints": arr(checkpoint),
                    "visits": some(
                        {
                            "rule": STRING,
                            "steps": arr(INTEGER),
                            "rows_read_per_checkpoint": arr(INTEGER),
                            "never_trained": INTEGER,
                            "uniform": BOOLEAN,
                        },
                        "rule",
                    ),
                },
                "checkpoints",
                null=True,
            ),
            "train_ids": arr(STRING),
            "train_meta": arr(OBJECT),
            "capabilities": arr(capability),
        },
        "index",
        "train_ids",
        "capabilities",
        null=True,
    )
    audit = some(
        {
            "counts": mapping(INTEGER),
            "findings": arr(some({"id": STRING, "steps": arr(INTEGER), "row_ids": arr(STRING)})),
            "skipped": arr(OBJECT),
            "passed": arr(STRING),
        },
        null=True,
    )
    setup_value = {"type": ["string", "integer", "boolean", "null"]}
    training_setup = obj(
        {
            "values": mapping(obj({"value": setup_value, "from": nullable(STRING)})),
            "unreproduced": arr(STRING),
            "warnings": arr(STRING),
            "notes": arr(STRING),
        },
        nullable=True,
    )
    verification = some(
        {
            "capabilities": mapping(some({"verified": BOOLEAN, "line": STRING, "retrains": OBJECT})),
            "retrains": mapping(OBJECT),
            "spec": OBJECT,
        },
        null=True,
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": RUN_SCHEMA,
        **some(
            {
                "schema": {"const": RUN_SCHEMA},
                "evaluation": closed(RESULT_JSON_SCHEMA),  # EvalResult.from_dict builds each part with cls(**d)
                "attribution": attribution,
                "audit": audit,
                "manifest": some(
                    {
                        "run_id": STRING,
                        "identity": identity,
                        "paths": paths,
                        "sign_convention": STRING,
                        "notes": arr(STRING),
                        "training_setup": training_setup,  # absent in runs written before it was recorded
                    },
                    "run_id",
                    "identity",
                    "paths",
                    "sign_convention",
                    "notes",
                ),
                "timing": mapping(NUMBER),
                "stopped": nullable(STRING),
                "verification": verification,
                "distributed": OBJECT,
            },
            "schema",
            "evaluation",
            "manifest",
        ),
    }


_SCHEMA_CACHE: dict[str, Any] = {}


def run_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12 subset, :mod:`gradian.schema`) of ``run.json`` (``gradian.run/1``).

    Every section the writer (:func:`attribute_run`, ``gradian verify``) always writes is required;
    keys it does not know are allowed in the records (:class:`Run` keeps them in ``extra``), never in
    a spec (a spec is checked against its dataclass). Score lists must hold finite numbers.
    """
    if not _SCHEMA_CACHE:
        from gradian.attribute.datacheck import DATA_CHECK_SCHEMA

        schema = _run_json_schema()
        schema["properties"]["manifest"]["properties"]["data_check"] = DATA_CHECK_SCHEMA  # optional: not required
        _SCHEMA_CACHE["run"] = schema
    return _SCHEMA_CACHE["run"]


def _spec_readers() -> dict[str, tuple[type, Callable[[dict], Any]]]:
    # The specs are checked by their own dataclasses, which live beside the code they configure, each in a
    # torch-free module: imported here, when a run's specs are read, so that importing this module stays light.
    from gradian.attribute.spec import AttributeSpec
    from gradian.evaluate import EvalSpec
    from gradian.index.spec import GradSpec
    from gradian.models.spec import ModelSpec

    return {
        "model": (ModelSpec, lambda d: ModelSpec(**d)),
        "grad": (GradSpec, GradSpec.from_dict),
        "attribute": (AttributeSpec, AttributeSpec.from_dict),
        "eval": (EvalSpec, EvalSpec.from_dict),
    }


def _unknown_key(d: Any, cls: type, path: str) -> str | None:
    """The first key of ``d`` that is not a field of the dataclass ``cls`` (nested spec dataclasses too)."""
    import dataclasses
    import typing

    if not isinstance(d, dict) or not dataclasses.is_dataclass(cls):
        return None
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # an annotation this Python cannot resolve: check the names only
        hints = {}
    names = {f.name for f in dataclasses.fields(cls)}
    for k, v in d.items():
        if k not in names:
            return f"{path}.{k}: unknown field"
        sub = hints.get(k)
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            p = _unknown_key(v, sub, f"{path}.{k}")
            if p:
                return p
    return None


def _round_trip_unknown(d: Any, rt: Any, path: str) -> str | None:
    """A key of ``d`` that reading it as a spec dropped (``rt``: the spec's ``to_dict()``)."""
    if not isinstance(d, dict) or not isinstance(rt, dict):
        return None
    for k, v in d.items():
        if k not in rt:
            return f"{path}.{k}: unknown field"
        p = _round_trip_unknown(v, rt[k], f"{path}.{k}")
        if p:
            return p
    return None


def _spec_problem(name: str, d: Any, path: str) -> str | None:
    """Whether ``d`` reads as the ``name`` spec: no unknown field, every value accepted by the spec's own checks."""
    cls, read = _spec_readers()[name]
    p = _unknown_key(d, cls, path)
    if p:
        return p
    try:
        spec = read(d)
    except GradianUserError as e:  # the spec's own check, e.g. "ModelSpec.dtype: must be one of ..."
        return f"{path}: {e.what}" + (f" ({e.where})" if e.where else "")
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        return f"{path}: cannot be read ({type(e).__name__}: {str(e)[:120]})"
    p = _round_trip_unknown(d, spec.to_dict(), path)
    if p:
        return p
    if name == "model" and spec.gguf_file is not None and Path(spec.gguf_file).name != spec.gguf_file:
        return f"{path}.gguf_file: is {spec.gguf_file[:40]!r}, expected a file name inside the base folder"
    return None


def _record_problem(
    d: dict[str, Any], cls: type, path: str, derived: tuple[str, ...] = (), missing: bool = True
) -> str | None:
    """A key of ``d`` that the dataclass ``cls`` (which verify builds from it) has no field for, or a missing one."""
    import dataclasses

    fields = dataclasses.fields(cls)
    names = {f.name for f in fields}
    for k in d:
        if k not in names and k not in derived:
            return f"{path}.{k}: unknown field"
    for f in fields if missing else ():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in d:
            return f"{path}.{f.name}: missing"
    return None


def _finite(x: Any) -> bool:
    import math

    return not isinstance(x, float) or math.isfinite(x)


def _cross_problem(run: dict[str, Any], inputs: bool) -> str | None:
    """What the schema cannot say: lengths that must agree, ids that must point into lists, specs that must read."""
    from gradian.attribute.queries import Query
    from gradian.evaluate import FailingItem

    man = run.get("manifest") or {}
    specs = (man.get("identity") or {}).get("specs") or {}
    for name in ("model", "grad", "attribute", "eval"):
        if specs.get(name) is not None:
            p = _spec_problem(name, specs[name], f"manifest.identity.specs.{name}")
            if p:
                return p
    ev = run.get("evaluation") or {}
    if isinstance(ev.get("spec"), dict):
        p = _spec_problem("eval", ev["spec"], "evaluation.spec")
        if p:
            return p
    items = ev.get("items")
    item_ids = [it.get("id") for it in items or []]
    if len(set(item_ids)) != len(item_ids):
        return "evaluation.items: an item id appears twice"
    for i, c in enumerate(ev.get("capabilities") or []):
        for k in ("reference_score", "tuned_score", "delta", "ci_low", "ci_high"):
            if not _finite(c.get(k)):
                return f"evaluation.capabilities[{i}].{k}: is {c.get(k)}, expected a finite number"
    for i, it in enumerate(items or []):
        for side in ("reference", "tuned"):
            if not _finite((it.get(side) or {}).get("score")):
                return f"evaluation.items[{i}].{side}.score: is {it[side]['score']}, expected a finite number"
    if items is not None:
        known = set(item_ids)
        for i, f in enumerate(ev.get("failing_items") or []):
            if f.get("id") not in known:
                return f"evaluation.failing_items[{i}].id: {str(f.get('id'))[:40]!r} is not an item of evaluation.items"
    att = run.get("attribution")
    if not att:
        return None
    ids = att.get("train_ids") or []
    if len(set(ids)) != len(ids):
        return "attribution.train_ids: a row id appears twice"
    n, known = len(ids), set(ids)
    meta = att.get("train_meta")
    if meta and len(meta) != n:
        return f"attribution.train_meta: has {len(meta)} entries for {n} train_ids"
    ev_caps = {c.get("name") for c in ev.get("capabilities") or []}
    seen: set[str] = set()
    for i, cap in enumerate(att.get("capabilities") or []):
        at = f"attribution.capabilities[{i}]"
        name = cap.get("capability")
        if name in seen:
            return f"{at}.capability: {name!r} appears twice"
        seen.add(name)
        if ev.get("capabilities") is not None and name not in ev_caps:
            return f"{at}.capability: {str(name)[:40]!r} is not a capability of evaluation.capabilities"
        if "n_train" in cap and cap["n_train"] != n:
            return f"{at}.n_train: is {cap['n_train']}, but attribution.train_ids has {n} rows"
        lists = [(k, cap.get(k)) for k in ("scores", "rank_scores", "verdict_scores", "second_scores", "row_sentences")]
        lists += [(f"evidence.{k}.scores", (v or {}).get("scores")) for k, v in (cap.get("evidence") or {}).items()]
        for k, v in lists:
            if v is not None and len(v) != n and not (k == "rank_scores" and not v):
                return f"{at}.{k}: has {len(v)} entries for {n} train_ids"
        for j, r in enumerate(cap.get("ranked") or []):
            if r.get("id") not in known:
                return f"{at}.ranked[{j}].id: {str(r.get('id'))[:40]!r} is not a row of attribution.train_ids"
        labels = set()
        for j, c in enumerate(cap.get("clusters") or []):
            if c.get("label") in labels:
                return f"{at}.clusters[{j}].label: {c.get('label')} appears twice"
            labels.add(c.get("label"))
            for r in c.get("row_ids") or []:
                if r not in known:
                    return f"{at}.clusters[{j}].row_ids: {str(r)[:40]!r} is not a row of attribution.train_ids"
        for j, d in enumerate(cap.get("drilldown") or []):
            if d.get("id") not in known:
                return f"{at}.drilldown[{j}].id: {str(d.get('id'))[:40]!r} is not a row of attribution.train_ids"
        for q, rows in (cap.get("per_item_top") or {}).items():
            for r in rows:
                if r.get("id") not in known:
                    return f"{at}.per_item_top.{q}: {str(r.get('id'))[:40]!r} is not a row of attribution.train_ids"
        for key in ("queries", "drill_queries"):
            for j, q in enumerate(cap.get(key) or []):
                p = _record_problem(q, Query, f"{at}.{key}[{j}]", missing=inputs)
                if p:
                    return p
        for key in ("failing_items", "drill_items"):
            for j, f in enumerate(cap.get(key) or []):
                p = _record_problem(f, FailingItem, f"{at}.{key}[{j}]", derived=("chat",), missing=inputs)
                if p:
                    return p
    return None


def _whole_evaluation(ev: Any) -> Any:
    """``ev`` if it is a whole ``gradian.evaluate/1`` result (what :class:`gradian.evaluate.EvalResult` reads)."""
    from gradian.schema import problem

    p = problem(ev, run_json_schema()["properties"]["evaluation"], "evaluation")
    if p:
        raise GradianUserError(
            p, where="run.json", fix="restore the run.json `gradian attribute` wrote (or re-run gradian attribute)"
        )
    return ev


def check_run(run: Any, where: str = "run.json", *, inputs: bool = False) -> None:
    """Check a run dict against :func:`run_json_schema` and its cross-references; a one-line user error if not.

    Every reader of a run.json calls this first (:func:`load_run`, :meth:`Run.from_dict`, ``gradian report``,
    ``gradian verify``, :meth:`gradian.attributor.Attributor.from_run`), so a tampered or damaged file is one
    line naming the field (``run.json: manifest.identity.specs.model.bogus: unknown field (fix: ...)``),
    never a traceback, a NaN verdict or a row outside the run.

    Args:
        where: the file, for the message.
        inputs: also require every section the run's inputs are read back from (the manifest's paths,
            identity and specs, the full evaluation): what ``verify`` and ``from_run`` need. Without it
            (the report), only what is there is checked.
    """
    from gradian.schema import problem

    if not isinstance(run, dict) or run.get("schema") != RUN_SCHEMA:
        raise GradianUserError(
            f"not a {RUN_SCHEMA} file", where=where, fix="pass a run folder written by `gradian attribute`"
        )
    p = problem(run, run_json_schema(), partial=not inputs) or _cross_problem(run, inputs)
    if p:
        raise GradianUserError(
            p,
            where=where,
            fix="restore the run.json `gradian attribute` wrote (or re-run gradian attribute); never edit it by hand",
        )


def load_run(run_dir: str | Path, *, inputs: bool = False) -> dict[str, Any]:
    """Read ``RUN_DIR/run.json`` and check it (:func:`check_run`): a user error if missing, malformed or tampered.

    Args:
        inputs: also require what the run's inputs are read back from (``verify``, ``from_run``).
    """
    p = Path(run_dir) / "run.json" if Path(run_dir).is_dir() else Path(run_dir)
    if not p.exists():
        raise GradianUserError(
            "no run.json here", where=str(run_dir), fix="pass the folder `gradian attribute --out` wrote"
        )
    from gradian.safeio import load_json_file

    run = load_json_file(p, "run file", fix="re-run gradian attribute")
    check_run(run, str(p), inputs=inputs)
    return run
