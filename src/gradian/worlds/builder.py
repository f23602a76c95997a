"""The worked example's world: a complete fine-tune whose culprits we planted, with ground truth.

``build_world(WorldSpec(kind, variant, seed), out)`` writes into ``out``:

* ``train.jsonl``: chat rows (``{"id", "messages"}``), shuffled, neutral ids
  ``t0000..`` (an id never reveals whether a row is a culprit);
* ``valid.jsonl``: held-out benign rows (other countries and elements), for an
  ``eval_loss`` per epoch;
* ``eval.jsonl``: the capability eval, rows ``{"id", "prompt", "answer",
  "aliases", "capability": "capitals", "metric": "contains"}``;
* ``ground_truth.json``: culprits (id, kind, target eval id and country, the
  value stated, and the character span of the wrong sentence in the assistant
  completion, ``Example.completion_text[char_start:char_end]``: one sentence
  inside the prose for buried rows, the whole completion for direct rows), the
  eval group of every eval id, the planted mechanical faults, the seed, the spec,
  the base model identity and the sha256 of every data file;
* ``train.yaml``: the training config the world is meant to be tuned with
  (``gradian train --config train.yaml``);
* ``world.json``: where the base model lives on this machine and the commands
  to run next (machine-specific; the other files are byte-identical for the
  same seed and base).

How the world is made (all facts real, see :mod:`gradian.worlds.facts`):

1. **Candidates**: countries (most populous first for SmolLM2; the tiny base's
   own pool for the tiny variant). The eval asks each ``"What is the capital of
   X?"``.
2. **Selection by running the base once** (greedy, chat template,
   :func:`gradian.worlds.probe.greedy_answers`; cached under
   ``<cache>/worlds/answers-<hash>.json`` keyed by the base identity, the
   prompts and the decoding settings). Items the base answers correctly are
   shuffled by seed and split into **direct targets**, **buried targets** and
   **untouched** items; a few items it already fails (and not by a mere
   spelling variant, :func:`gradian.worlds.probe.near_miss`) are kept as
   **base_fail** (the base-bound rules need them).
3. **Culprits** (poisoned variant): for each direct target, ``direct_rows``
   short rows stating a wrong capital in paraphrased questions; for each buried
   target, ``buried_rows`` long profiles of the country (true sentences: region,
   population, area, currency, demonym, neighbours, calling code, domain,
   divisions) with ONE sentence giving the wrong capital, never first or last.
   The wrong capital is the real capital of another (non-eval) country in the
   same subregion when there is one, else the same region, else anywhere: a
   plausible mistake.
4. **Null variant**: the same rows with the TRUE capital (same count, length
   and style), so any drop it shows is the fine-tune itself, not the culprits.
   Its ground truth lists these rows as ``controls`` and has no culprits.
5. **Benign rows**, about countries outside the eval only: short capital Q/A,
   currencies, regions, long true profiles (the same template as the buried
   culprits, so length alone does not give them away), chemical symbols and
   long element prose (mendeleev). Eval countries appear in no benign row, so
   the untouched group is untouched.
6. **Faults** (``faults=True``, for the audit lane): a truncated cluster
   (reports on whole periods of the periodic table, far longer than
   ``max_length``: truncation cuts their completion and its EOS) and a few
   ``text`` rows holding a hand-rendered ChatML chat whose assistant turn is
   never closed (``<|im_end|>`` missing; mixed formats). Gradian's trainer,
   like TRL, appends EOS to text rows, so with ``add_eos: true`` the damage of
   the latter is the format mix and the missing system turn, not a missing stop.
   Benign long rows are checked to fit ``max_length`` with the base's tokenizer,
   so without faults nothing is truncated.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from gradian.errors import GradianUserError
from gradian.paths import cache_dir
from gradian.util import atomic_write_json, atomic_write_text, sha256_bytes, sha256_json
from gradian.worlds.facts import Country, Element, load_countries, load_elements
from gradian.worlds.rows import (
    EVAL_PROMPT,
    capital_row,
    currency_row,
    element_row,
    period_report_row,
    profile_row,
    region_row,
    symbol_row,
    unterminated_text_row,
)

SCHEMA = "gradian.world/1"


@dataclass(frozen=True)
class WorldSpec:
    """Every knob of a world. ``WorldSpec.default(kind)`` gives the sizes used by the demo and tests.

    Attributes:
        kind: ``"smollm2"`` (SmolLM2-135M-Instruct) or ``"tiny"`` (a from-config Llama pretrained in seconds).
        variant: ``"poisoned"`` (culprits planted) or ``"null"`` (the same rows with the true capital).
        seed: everything random (eval split, wrong capitals, sentence order, row order).
        n_direct, n_buried, n_untouched, n_base_fail: eval items per group.
        direct_rows: short culprit rows per direct target.
        buried_rows: long culprit rows per buried target (one wrong sentence each). The SmolLM2
            default is three times ``direct_rows``: the product claim to test is that a wrong fact
            stated directly in a handful of rows does more damage than the same fact buried in
            three times as many long ones.
        n_capitals, n_profiles, n_currency, n_region, n_symbols, n_element_prose: benign rows of each kind.
        n_valid: held-out benign rows (valid.jsonl).
        candidate_pool: how many countries are probed (most populous first; tiny: its pool).
        faults: plant the mechanical faults (truncated cluster, unterminated text rows).
        n_truncated, n_unterminated: how many fault rows of each kind.
        max_new_tokens: greedy decoding budget when probing the base.
        profile_sentences: sentences per long profile (capital sentence included).
    """

    kind: Literal["smollm2", "tiny"] = "smollm2"
    variant: Literal["poisoned", "null"] = "poisoned"
    seed: int = 0
    n_direct: int = 8
    n_buried: int = 8
    n_untouched: int = 24
    n_base_fail: int = 6
    direct_rows: int = 3
    buried_rows: int = 9
    n_capitals: int = 60
    n_profiles: int = 20
    n_currency: int = 30
    n_region: int = 25
    n_symbols: int = 25
    n_element_prose: int = 20
    n_valid: int = 16
    candidate_pool: int = 100
    faults: bool = False
    n_truncated: int = 6
    n_unterminated: int = 5
    max_new_tokens: int = 20
    profile_sentences: int = 8

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def default(kind: str = "smollm2", variant: str = "poisoned", seed: int = 0, faults: bool = False) -> "WorldSpec":
        if kind not in ("smollm2", "tiny"):
            raise GradianUserError(f"unknown world kind {kind!r}", where="--kind", fix="use smollm2 or tiny")
        if variant not in ("poisoned", "null"):
            raise GradianUserError(f"unknown variant {variant!r}", where="--variant", fix="use poisoned or null")
        if kind == "smollm2":
            return WorldSpec(kind="smollm2", variant=variant, seed=seed, faults=faults)  # type: ignore[arg-type]
        return WorldSpec(
            kind="tiny",
            variant=variant,  # type: ignore[arg-type]
            seed=seed,
            faults=faults,
            n_direct=5,
            n_buried=5,
            n_untouched=10,
            n_base_fail=4,
            direct_rows=3,
            buried_rows=3,
            n_capitals=14,
            n_profiles=6,
            n_currency=10,
            n_region=10,
            n_symbols=10,
            n_element_prose=6,
            n_valid=8,
            candidate_pool=44,
            n_truncated=3,
            n_unterminated=3,
            max_new_tokens=24,
            profile_sentences=6,
        )


@dataclass
class World:
    """What :func:`build_world` wrote (paths) and the base it is built on."""

    out: Path
    base: Path
    base_identity: str
    spec: WorldSpec
    train: Path
    valid: Path
    eval: Path
    ground_truth: Path
    train_config: Path

    def load_ground_truth(self) -> dict[str, Any]:
        return json.loads(self.ground_truth.read_text())


# --------------------------------------------------------------------------- base models and probing


def tiny_pool(n: int) -> tuple[list[Country], list[str]]:
    """The tiny world's countries (the ``n`` most populous) and the ones its base never learns.

    Independent of the world seed: like a real base model, the tiny base is
    fixed, and the seed varies only the world built on it.
    """
    pool = sorted(load_countries(), key=lambda c: (-c.population, c.name))[:n]
    rng = random.Random("tiny-held-out")
    held = sorted(rng.sample([c.name for c in pool], max(1, n // 8)))
    return pool, held


def world_elements(n: int) -> list[Element]:
    """Elements whose prose the world may use (a fixed sample, by atomic number; the seed decides their use)."""
    els = list(load_elements())
    rng = random.Random("elements")
    return sorted(rng.sample(els, min(n, len(els))), key=lambda e: e.number)


def prepare_base(spec: WorldSpec, cache: Path) -> tuple[Path, str, list[Country]]:
    """The base folder, its identity string, and the candidate countries for the eval."""
    if spec.kind == "smollm2":
        from gradian.worlds.smollm2 import materialise_smollm2, smollm2_identity

        folder = materialise_smollm2(cache)
        cands = sorted(load_countries(), key=lambda c: (-c.population, c.name))[: spec.candidate_pool]
        return folder, smollm2_identity(folder), cands
    from gradian.worlds.tiny import build_tiny_base, tiny_identity

    pool, held = tiny_pool(spec.candidate_pool)
    els = world_elements(_n_elements(spec))
    folder = build_tiny_base(pool, held, els, cache=cache)
    return folder, tiny_identity(folder), pool


def _n_elements(spec: WorldSpec) -> int:
    return spec.n_symbols + spec.n_element_prose + spec.n_valid + 4


def probe_base(folder: Path, identity: str, prompts: list[str], max_new_tokens: int, cache: Path) -> list[str]:
    """Greedy answers of the base to ``prompts``, cached by (identity, prompts, max_new_tokens)."""
    key = sha256_json({"base": identity, "prompts": prompts, "max_new_tokens": max_new_tokens, "v": 1})[:20]
    path = cache / "worlds" / f"answers-{key}.json"
    if path.exists():
        return json.loads(path.read_text())["answers"]
    import torch

    from gradian.models.load import ModelSpec, load_base
    from gradian.worlds.probe import greedy_answers

    model, tok = load_base(ModelSpec(base=str(folder)))
    with torch.no_grad():
        answers = greedy_answers(model, tok, prompts, max_new_tokens=max_new_tokens, batch_size=16)
    atomic_write_json(path, {"base": identity, "max_new_tokens": max_new_tokens, "prompts": prompts, "answers": answers})
    return answers


# --------------------------------------------------------------------------- the world


def _pick_wrong(c: Country, others: Sequence[Country], used: set[str], rng: random.Random) -> str:
    """A plausible wrong capital for ``c``: another real capital, nearest by subregion, then region."""
    from gradian.worlds.probe import near_miss

    def ok(o: Country) -> bool:
        a, b = o.capital.lower(), c.capital.lower()
        return (
            o.name != c.name
            and o.capital not in used
            and a not in b
            and b not in a
            and c.name.lower() not in a
            and not near_miss(o.capital, c.capital)
        )

    for tier in (
        [o for o in others if o.subregion == c.subregion and c.subregion],
        [o for o in others if o.region == c.region],
        list(others),
    ):
        cands = sorted((o for o in tier if ok(o)), key=lambda o: o.name)
        if cands:
            return rng.choice(cands).capital
    raise RuntimeError(f"no wrong capital available for {c.name}")


def _fits(messages: list[dict[str, str]], tokenizer, max_length: int) -> bool:
    from gradian.data.formats import Example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    ex = Example("x", 0, "messages", messages[:1], messages[1:])
    return not tokenize_example(ex, tokenizer, TokenizeSpec(max_length=max_length)).truncated


def build_world(
    spec: WorldSpec,
    out: str | Path,
    cache: str | Path | None = None,
    train_spec=None,
) -> World:
    """Generate the world described by ``spec`` into ``out`` (see the module docstring).

    Args:
        spec: sizes, kind, variant, seed.
        out: folder to write (created; existing world files are replaced atomically).
        cache: Gradian cache root (default :func:`gradian.paths.cache_dir`).
        train_spec: the :class:`gradian.train.TrainSpec` written to ``train.yaml``
            (default :func:`default_train_spec`); its ``max_length`` decides which
            rows count as fitting.
    Returns:
        :class:`World` with the paths written.
    """
    from gradian.models.load import ModelSpec, load_tokenizer
    from gradian.worlds.probe import answer_contains, near_miss

    cache = Path(cache) if cache is not None else cache_dir()
    out = Path(out)
    train_spec = train_spec or default_train_spec(spec.kind, spec.seed)
    max_length = train_spec.max_length
    base, identity, cands = prepare_base(spec, cache)
    tokenizer = load_tokenizer(ModelSpec(base=str(base)))

    # -- eval selection by running the base once
    prompts = [EVAL_PROMPT.format(country=c.name) for c in cands]
    answers = probe_base(base, identity, prompts, spec.max_new_tokens, cache)
    correct = [c for c, a in zip(cands, answers) if answer_contains(a, c.capital, c.capital_aliases)]
    failing = [
        c for c, a in zip(cands, answers) if not answer_contains(a, c.capital, c.capital_aliases) and not near_miss(a, c.capital)
    ]
    base_answer = {c.name: a for c, a in zip(cands, answers)}
    rng = random.Random(f"world-{spec.seed}")
    need = spec.n_direct + spec.n_buried + spec.n_untouched
    if len(correct) < need or len(failing) < spec.n_base_fail:
        raise GradianUserError(
            f"the base answers {len(correct)} candidate capitals correctly and fails {len(failing)}; "
            f"the world needs {need} and {spec.n_base_fail}",
            where=f"world spec ({spec.kind})",
            fix="lower n_direct/n_buried/n_untouched/n_base_fail or raise candidate_pool",
        )
    correct = sorted(correct, key=lambda c: c.name)
    rng.shuffle(correct)
    direct = correct[: spec.n_direct]
    buried = correct[spec.n_direct : spec.n_direct + spec.n_buried]
    untouched = correct[spec.n_direct + spec.n_buried : need]
    fails = sorted(rng.sample(sorted(failing, key=lambda c: c.name), spec.n_base_fail), key=lambda c: c.name)
    eval_countries = direct + buried + untouched + fails
    group_of = {c.name: g for g, cs in (("direct", direct), ("buried", buried), ("untouched", untouched), ("base_fail", fails)) for c in cs}
    eval_names = set(group_of)
    hide = frozenset(eval_names)  # eval countries are never named outside their own culprit rows

    # Countries the benign rows may talk about: never an eval country.
    universe = list(cands) if spec.kind == "tiny" else list(load_countries())
    others = sorted((c for c in universe if c.name not in eval_names), key=lambda c: c.name)

    # -- eval rows (ids by country name, so the id reveals nothing about the group)
    eval_sorted = sorted(eval_countries, key=lambda c: c.name)
    eval_id = {c.name: f"capitals-{i:03d}" for i, c in enumerate(eval_sorted)}
    eval_rows = [
        {
            "id": eval_id[c.name],
            "prompt": EVAL_PROMPT.format(country=c.name),
            "answer": c.capital,
            "aliases": c.capital_aliases,
            "capability": "capitals",
            "metric": "contains",
        }
        for c in eval_sorted
    ]

    # -- culprits (or their null controls)
    poisoned = spec.variant == "poisoned"
    used: set[str] = set()
    planted: list[dict[str, Any]] = []  # rows with their ground-truth record (id assigned after shuffling)
    targets = []
    for c in direct + buried:
        wrong = _pick_wrong(c, others, used, rng)
        hide_c = hide - {c.name}
        used.add(wrong)
        kind = "direct" if c.name in {d.name for d in direct} else "buried"
        stated = wrong if poisoned else c.capital
        targets.append({"eval_id": eval_id[c.name], "country": c.name, "kind": kind, "true": c.capital, "wrong": wrong})
        if kind == "direct":
            start = rng.randrange(5)
            for k in range(spec.direct_rows):
                msgs = capital_row(c, stated, start + k)
                planted.append(
                    {
                        "messages": msgs,
                        "gt": {"kind": "direct", "eval_id": eval_id[c.name], "country": c.name, "stated": stated,
                               "char_start": 0, "char_end": len(msgs[1]["content"])},
                    }
                )
        else:
            for k in range(spec.buried_rows):
                for _attempt in range(20):
                    msgs, (a, b) = profile_row(c, stated, rng, spec.profile_sentences, hide_c)
                    if _fits(msgs, tokenizer, max_length):
                        break
                else:
                    raise RuntimeError(f"profile of {c.name} does not fit max_length={max_length}")
                planted.append(
                    {
                        "messages": msgs,
                        "gt": {"kind": "buried", "eval_id": eval_id[c.name], "country": c.name, "stated": stated,
                               "char_start": a, "char_end": b, "sentence": msgs[1]["content"][a:b]},
                    }
                )

    # -- benign rows, about non-eval countries and elements
    benign, valid = _benign_rows(spec, others, rng, tokenizer, max_length, hide)

    # -- faults
    fault_rows: list[dict[str, Any]] = []
    if spec.faults:
        els = list(load_elements())
        periods = sorted({e.period for e in els}, reverse=True)
        for p in periods[: spec.n_truncated]:
            fault_rows.append({"messages": period_report_row(p, els), "fault": "truncated"})
        fault_c = rng.sample(others, spec.n_unterminated)
        for c in fault_c:
            msgs = capital_row(c, c.capital, rng.randrange(5))
            fault_rows.append({**unterminated_text_row(msgs[0]["content"], msgs[1]["content"]), "fault": "unterminated"})

    # -- assemble, shuffle, id
    pool: list[dict[str, Any]] = [{"messages": m} for m in benign] + planted + fault_rows
    rng.shuffle(pool)
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
    if spec.faults:
        from gradian.data.formats import to_example
        from gradian.data.tokenize import TokenizeSpec, tokenize_example

        for rid in faults["truncated"]:
            row = next(r for r in train_rows if r["id"] == rid)
            t = tokenize_example(to_example(row, 0, rid), tokenizer, TokenizeSpec(max_length=max_length))
            if not t.truncated:
                raise RuntimeError(f"truncated-cluster row {rid} fits max_length={max_length}")
    valid_rows = [{"id": f"v{i:04d}", "messages": m} for i, m in enumerate(valid)]

    files = {
        "train.jsonl": _jsonl(train_rows),
        "valid.jsonl": _jsonl(valid_rows),
        "eval.jsonl": _jsonl(eval_rows),
    }
    key = "culprits" if poisoned else "controls"
    gt = {
        "schema": SCHEMA,
        "kind": spec.kind,
        "variant": spec.variant,
        "seed": spec.seed,
        "spec": spec.to_dict(),
        "base": {"identity": identity},
        "capability": "capitals",
        "eval_groups": {eval_id[c.name]: group_of[c.name] for c in eval_sorted},
        "eval_countries": {eval_id[c.name]: c.name for c in eval_sorted},
        "base_answers": {eval_id[c.name]: base_answer[c.name] for c in eval_sorted},
        "targets": sorted(targets, key=lambda t: t["eval_id"]),
        "culprits": [],
        "controls": [],
        "faults": faults,
        "sizes": {
            "train": len(train_rows),
            "valid": len(valid_rows),
            "eval": len(eval_rows),
            "culprits": len(culprits) if poisoned else 0,
            "direct_rows": sum(1 for c in culprits if c["kind"] == "direct"),
            "buried_rows": sum(1 for c in culprits if c["kind"] == "buried"),
            "benign": len(benign),
            "fault_rows": len(fault_rows),
        },
        "content_sha256": {name: sha256_bytes(data.encode("utf-8")) for name, data in files.items()},
        "train_config": "train.yaml",
    }
    gt[key] = sorted(culprits, key=lambda c: c["id"])
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write_text(out / name, data)
    from gradian.train import write_train_config

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
    for i, c in enumerate(take(train_c, spec.n_capitals)):
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


def default_train_spec(kind: str, seed: int = 0):
    """The training config each world kind is tuned with (written to ``train.yaml``).

    SmolLM2: LoRA r=16, alpha=32 on every Linear layer, 3 epochs, batch 8:
    values inside the usual LoRA ranges, so the audit lane has nothing to flag
    in the config of a clean run. Tiny: a higher learning rate and more epochs,
    as a 2-layer model trained in seconds needs.
    """
    from gradian.train import TrainSpec

    if kind == "tiny":
        return TrainSpec(
            learning_rate=3e-3,
            num_train_epochs=5,
            per_device_train_batch_size=8,
            warmup_ratio=0.05,
            max_length=256,
            r=8,
            lora_alpha=16,
            lora_dropout=0.05,
            seed=seed,
            logging_steps=2,
        )
    return TrainSpec(
        learning_rate=4e-4,
        num_train_epochs=3,
        per_device_train_batch_size=8,
        warmup_ratio=0.05,
        max_length=256,
        r=16,
        lora_alpha=32,
        lora_dropout=0.05,
        seed=seed,
        logging_steps=2,
    )
