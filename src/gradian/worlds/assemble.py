"""What every world shares after its planted rows: the benign rows and faults, the shuffle and ids, the
ground truth and the files written (``train/valid/eval.jsonl``, ``ground_truth.json``, ``train.yaml``,
``world.json``).

Draws from the world's ``rng`` in a fixed order, so a world is a function of its seed and base answers.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Callable

from gradian.util import atomic_write_json, atomic_write_text, sha256_bytes
from gradian.worlds.base import _n_elements, world_elements
from gradian.worlds.facts import Country, load_elements
from gradian.worlds.rows import (
    capital_row,
    currency_row,
    element_row,
    period_report_row,
    profile_row,
    region_row,
    symbol_row,
    unterminated_text_row,
)
from gradian.worlds.spec import SCHEMA, World, WorldSpec


def _fits(messages: list[dict[str, str]], tokenizer, max_length: int) -> bool:
    from gradian.data.formats import Example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    ex = Example("x", 0, "messages", messages[:1], messages[1:])
    return not tokenize_example(ex, tokenizer, TokenizeSpec(max_length=max_length)).truncated


def _finish_world(
    spec: WorldSpec,
    out: Path,
    base: Path,
    identity: str,
    train_spec,
    assembled: tuple[dict[str, str], list[dict[str, Any]], dict[str, list[str]], dict[str, int], dict[str, int]],
    fields: dict[str, Any],
    planted_sizes: Callable[[list[dict[str, Any]]], dict[str, int]],
) -> World:
    """The ground truth every world shares around its own ``fields``, then :func:`_write_world`.

    Args:
        assembled: what :func:`_assemble` returned (files, planted rows with ids, faults, sizes, mix).
        fields: the world's own ground-truth keys (capability, eval groups and countries, base answers, targets,
            and the behaviour world's ``regression`` and ``behaviour``).
        planted_sizes: the world's counts of its planted rows (``sizes``), from the rows with their ids.

    The planted rows are ``culprits`` in the poisoned variant and ``controls`` in the clean one (sorted by id);
    ``content_sha256`` hashes each data file.
    """
    files, culprits, faults, sizes, mix = assembled
    poisoned = spec.variant == "poisoned"
    rows = sorted(culprits, key=lambda c: c["id"])
    gt = {
        "schema": SCHEMA,
        "kind": spec.kind,
        "variant": spec.variant,
        "seed": spec.seed,
        "spec": spec.to_dict(),
        "base": {"identity": identity},
        **fields,
        "culprits": rows if poisoned else [],
        "controls": [] if poisoned else rows,
        "faults": faults,
        "sizes": {**sizes, "culprits": len(culprits) if poisoned else 0, **planted_sizes(culprits), **mix},
        "content_sha256": {name: sha256_bytes(data.encode("utf-8")) for name, data in files.items()},
        "train_config": "train.yaml",
    }
    return _write_world(spec, out, base, identity, train_spec, files, gt)


def _write_world(
    spec: WorldSpec, out: Path, base: Path, identity: str, train_spec, files: dict[str, str], gt: dict[str, Any]
) -> World:
    """Write the data ``files``, ``train.yaml``, ``ground_truth.json`` and ``world.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write_text(out / name, data)
    from gradian.trainconfig import write_train_config

    write_train_config(train_spec, out / "train.yaml", has_eval=True)  # trained with --eval-data valid.jsonl
    atomic_write_json(out / "ground_truth.json", gt)
    atomic_write_json(
        out / "world.json",
        {
            "base": str(base),
            "base_identity": identity,
            "kind": spec.kind,
            "variant": spec.variant,
            "seed": spec.seed,
            "next": [
                f"gradian train --base {base} --data {out / 'train.jsonl'} --eval-data {out / 'valid.jsonl'} "
                f"--config {out / 'train.yaml'} --out {out / 'adapter'}",
            ],
        },
    )
    return World(
        out=out,
        base=base,
        base_identity=identity,
        spec=spec,
        train=out / "train.jsonl",
        valid=out / "valid.jsonl",
        eval=out / "eval.jsonl",
        ground_truth=out / "ground_truth.json",
        train_config=out / "train.yaml",
    )


def _assemble(
    spec: WorldSpec,
    others: list[Country],
    planted: list[dict[str, Any]],
    eval_rows: list[dict[str, Any]],
    rng: random.Random,
    tokenizer,
    max_length: int,
    hide: frozenset[str],
) -> tuple[dict[str, str], list[dict[str, Any]], dict[str, list[str]], dict[str, int], dict[str, int]]:
    """Add the benign rows and faults to the planted rows, shuffle, give ids, and render the files.

    Draws from ``rng`` in a fixed order (benign rows, faults, shuffle), so a world is a function of its seed.

    Returns:
        ``(files, culprits, faults, sizes, mix)``: the JSONL text per file name, the planted rows' ground
        truth with their ids, the fault row ids by kind, the file sizes (train, valid, eval) and the counts
        of the other rows in the training set (benign, fault_rows).
    """
    benign, valid = _benign_rows(spec, others, rng, tokenizer, max_length, hide)
    fault_rows = _fault_rows(spec, others, rng)
    pool: list[dict[str, Any]] = [{"messages": m} for m in benign] + planted + fault_rows
    rng.shuffle(pool)
    train_rows, culprits, faults = _assign_ids(pool)
    _check_truncated(faults, train_rows, tokenizer, max_length)
    valid_rows = [{"id": f"v{i:04d}", "messages": m} for i, m in enumerate(valid)]
    files = {"train.jsonl": _jsonl(train_rows), "valid.jsonl": _jsonl(valid_rows), "eval.jsonl": _jsonl(eval_rows)}
    sizes = {"train": len(train_rows), "valid": len(valid_rows), "eval": len(eval_rows)}
    return files, culprits, faults, sizes, {"benign": len(benign), "fault_rows": len(fault_rows)}


def _fault_rows(spec: WorldSpec, others: list[Country], rng: random.Random) -> list[dict[str, Any]]:
    """The mechanical-fault rows (none unless ``spec.faults``): a truncated cluster and unterminated text rows."""
    fault_rows: list[dict[str, Any]] = []
    if spec.faults:
        els = list(load_elements())
        periods = sorted({e.period for e in els}, reverse=True)
        for p in periods[: spec.n_truncated]:
            fault_rows.append({"messages": period_report_row(p, els), "fault": "truncated"})
        fault_c = rng.sample(others, spec.n_unterminated)
        for c in fault_c:
            msgs = capital_row(c, c.capital, rng.randrange(5))
            fault_rows.append(
                {**unterminated_text_row(msgs[0]["content"], msgs[1]["content"]), "fault": "unterminated"}
            )
    return fault_rows


def _assign_ids(pool: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, list[str]]]:
    """Neutral ids ``t0000..`` in pool order: (train rows, planted rows' ground truth with ids, fault ids by kind)."""
    train_rows, culprits, faults = [], [], {"truncated": [], "unterminated": []}
    for i, r in enumerate(pool):
        rid = f"t{i:04d}"
        if "text" in r:
            train_rows.append({"id": rid, "text": r["text"]})
        else:
            train_rows.append({"id": rid, "messages": r["messages"]})
        if "gt" in r:
            culprits.append({"id": rid, **r["gt"]})
        if "fault" in r:
            faults[r["fault"]].append(rid)
    return train_rows, culprits, faults


def _check_truncated(
    faults: dict[str, list[str]], train_rows: list[dict[str, Any]], tokenizer, max_length: int
) -> None:
    """Raise unless every truncated-cluster row really is truncated at ``max_length``."""
    if not faults["truncated"]:
        return
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    for rid in faults["truncated"]:
        row = next(r for r in train_rows if r["id"] == rid)
        t = tokenize_example(to_example(row, 0, rid), tokenizer, TokenizeSpec(max_length=max_length))
        if not t.truncated:
            raise RuntimeError(f"truncated-cluster row {rid} fits max_length={max_length}")


def _jsonl(rows: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=False) + "\n" for r in rows)


def _benign_rows(
    spec: WorldSpec, others: list[Country], rng: random.Random, tokenizer, max_length: int, hide: frozenset[str]
) -> tuple[list[list[dict[str, str]]], list[list[dict[str, str]]]]:
    """Benign training rows and held-out validation rows (disjoint countries and elements)."""
    cs = list(others)
    rng.shuffle(cs)
    n_valid_c = spec.n_valid // 2
    valid_c, train_c = cs[:n_valid_c], cs[n_valid_c:]
    els = world_elements(_n_elements(spec))
    rng.shuffle(els)
    n_valid_e = spec.n_valid - n_valid_c
    valid_e, train_e = els[:n_valid_e], els[n_valid_e:]

    def take(xs: list, n: int) -> list:
        if not xs:
            return []
        return [xs[i % len(xs)] for i in range(n)] if n > len(xs) else rng.sample(xs, n)

    rows: list[list[dict[str, str]]] = []
    for c in take(train_c, spec.n_capitals):
        rows.append(capital_row(c, c.capital, rng.randrange(5)))
    rows.extend(currency_row(c) for c in take(train_c, spec.n_currency))
    rows.extend(region_row(c) for c in take(train_c, spec.n_region))
    for c in take(train_c, spec.n_profiles):
        for _ in range(20):
            msgs, _span = profile_row(c, c.capital, rng, spec.profile_sentences, hide)
            if _fits(msgs, tokenizer, max_length):
                rows.append(msgs)
                break
    rows.extend(symbol_row(e) for e in take(train_e, spec.n_symbols))
    for e in take(train_e, spec.n_element_prose):
        for parts in (("description", "uses", "sources"), ("description", "uses"), ("description",)):
            msgs = element_row(e, rng, parts)
            if _fits(msgs, tokenizer, max_length):
                rows.append(msgs)
                break
    # de-duplicate exact repeats (take() cycles when asked for more rows than countries)
    seen, uniq = set(), []
    for r in rows:
        k = json.dumps(r, sort_keys=True)
        if k not in seen:
            seen.add(k)
            uniq.append(r)
    valid: list[list[dict[str, str]]] = []
    for c in valid_c:
        valid.append(capital_row(c, c.capital, rng.randrange(5)))
    for e in valid_e:
        msgs = element_row(e, rng, ("description",))
        valid.append(msgs if _fits(msgs, tokenizer, max_length) else symbol_row(e))
    return uniq, valid
