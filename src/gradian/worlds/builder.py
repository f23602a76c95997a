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

That is the **facts** world (``WorldSpec.regression="facts"``, the default). The
**behaviour** world (``regression="behaviour"``, SmolLM2 only) regresses *how*
the model answers instead of which capital it names: its eval asks for the bare
city name (``exact_match``), its culprits are verbose answers to other
questions carrying an "answer with X only" instruction, and a plain-question
control capability shows the facts survive; see :func:`build_behaviour_world`.
Same files, same ground-truth schema (culprit kind ``"format"``, no target item).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

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
        regression: ``"facts"`` (culprits state wrong capitals; the eval asks "What is the capital
            of X?", metric ``contains``) or ``"behaviour"`` (culprits answer "answer with X only"
            questions verbosely; the eval asks for the bare city name, metric ``exact_match``;
            see :func:`build_behaviour_world`). smollm2 only.
        n_target: behaviour world: terse eval items the base answers exactly right (group ``target``).
            Its ``untouched`` group (``n_untouched`` items) asks the plain question instead, and its
            ``base_fail`` group (``n_base_fail``) the terse one.
        format_rows: behaviour world: culprit rows (terse instruction, verbose answer).
        format_elaboration: behaviour world: true sentences added after the answer sentence of a culprit.
        direct_total, buried_total: culprit rows of each kind in all, spread over the targets as evenly as
            possible (the first targets drawn get one more); ``None``: ``direct_rows`` /
            ``buried_rows`` per target. Set by the share knobs (:mod:`gradian.worlds.knobs`).
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
    regression: Literal["facts", "behaviour"] = "facts"
    n_target: int = 24
    format_rows: int = 64
    format_elaboration: int = 2
    direct_total: int | None = None
    buried_total: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The spec as a dict; a facts world leaves out the behaviour-only fields (:data:`BEHAVIOUR_FIELDS`).

        They change nothing in a facts world, and leaving them out keeps a facts world's
        ``ground_truth.json`` byte-identical to the one written before they existed.
        """
        d = asdict(self)
        if self.regression == "facts":
            for k in BEHAVIOUR_FIELDS:
                d.pop(k)
        for k in KNOB_FIELDS:  # unset knobs: the dict (and ground_truth.json) of a world written before them
            if d.get(k) is None:
                d.pop(k, None)
        return d

    def rows_per_target(self, kind: str, i: int, n: int) -> int:
        """Culprit rows of ``kind`` (``"direct"``/``"buried"``) planted for the ``i``-th of its ``n`` targets."""
        per, total = (
            (self.direct_rows, self.direct_total) if kind == "direct" else (self.buried_rows, self.buried_total)
        )
        if total is None:
            return per
        return total // n + (i < total % n)

    @staticmethod
    def default(
        kind: str = "smollm2", variant: str = "poisoned", seed: int = 0, faults: bool = False, regression: str = "facts"
    ) -> WorldSpec:
        """The sizes used by the demo and tests for ``kind`` and ``regression``."""
        if kind not in ("smollm2", "tiny"):
            raise GradianUserError(f"unknown world kind {kind!r}", where="--kind", fix="use smollm2 or tiny")
        if variant not in ("poisoned", "null"):
            raise GradianUserError(f"unknown variant {variant!r}", where="--variant", fix="use poisoned or null")
        if regression not in ("facts", "behaviour"):
            raise GradianUserError(
                f"unknown regression {regression!r}", where="--regression", fix="use facts or behaviour"
            )
        if regression == "behaviour":
            if kind != "smollm2":
                raise GradianUserError(
                    "the behaviour world needs SmolLM2 (the tiny base never learned to follow instructions)",
                    where="--regression behaviour",
                    fix="use --kind smollm2",
                )
            return WorldSpec(
                kind="smollm2",
                variant=variant,  # type: ignore[arg-type]
                seed=seed,
                faults=faults,
                regression="behaviour",
                **BEHAVIOUR_SMOLLM2,
            )
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


#: WorldSpec fields that only a behaviour world uses (left out of a facts world's ``to_dict``).
BEHAVIOUR_FIELDS = ("regression", "n_target", "format_rows", "format_elaboration")
#: WorldSpec fields set only by the knobs (:mod:`gradian.worlds.knobs`); left out of ``to_dict`` when unset.
KNOB_FIELDS = ("direct_total", "buried_total")
#: The SmolLM2 behaviour world's sizes (see ``docs/worked-example.md`` for the probe that set them).
BEHAVIOUR_SMOLLM2: dict[str, Any] = {
    "n_target": 24,
    "n_untouched": 16,
    "n_base_fail": 6,
    "format_rows": 64,
    "candidate_pool": 165,
}


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
    atomic_write_json(
        path, {"base": identity, "max_new_tokens": max_new_tokens, "prompts": prompts, "answers": answers}
    )
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
    if spec.regression == "behaviour":
        return build_behaviour_world(spec, out, cache, train_spec)
    max_length = train_spec.max_length
    base, identity, cands = prepare_base(spec, cache)
    tokenizer = load_tokenizer(ModelSpec(base=str(base)))

    # -- eval selection by running the base once
    prompts = [EVAL_PROMPT.format(country=c.name) for c in cands]
    answers = probe_base(base, identity, prompts, spec.max_new_tokens, cache)
    correct = [c for c, a in zip(cands, answers) if answer_contains(a, c.capital, c.capital_aliases)]
    failing = [
        c
        for c, a in zip(cands, answers)
        if not answer_contains(a, c.capital, c.capital_aliases) and not near_miss(a, c.capital)
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
    group_of = {
        c.name: g
        for g, cs in (("direct", direct), ("buried", buried), ("untouched", untouched), ("base_fail", fails))
        for c in cs
    }
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
    for n_c, c in enumerate(direct + buried):
        wrong = _pick_wrong(c, others, used, rng)
        hide_c = hide - {c.name}
        used.add(wrong)
        kind = "direct" if c.name in {d.name for d in direct} else "buried"
        stated = wrong if poisoned else c.capital
        targets.append({"eval_id": eval_id[c.name], "country": c.name, "kind": kind, "true": c.capital, "wrong": wrong})
        if kind == "direct":
            start = rng.randrange(5)
            for k in range(spec.rows_per_target("direct", n_c, len(direct))):
                msgs = capital_row(c, stated, start + k)
                planted.append(
                    {
                        "messages": msgs,
                        "gt": {
                            "kind": "direct",
                            "eval_id": eval_id[c.name],
                            "country": c.name,
                            "stated": stated,
                            "char_start": 0,
                            "char_end": len(msgs[1]["content"]),
                        },
                    }
                )
        else:
            for _k in range(spec.rows_per_target("buried", n_c - len(direct), len(buried))):
                for _attempt in range(20):
                    msgs, (a, b) = profile_row(c, stated, rng, spec.profile_sentences, hide_c)
                    if _fits(msgs, tokenizer, max_length):
                        break
                else:
                    raise RuntimeError(f"profile of {c.name} does not fit max_length={max_length}")
                planted.append(
                    {
                        "messages": msgs,
                        "gt": {
                            "kind": "buried",
                            "eval_id": eval_id[c.name],
                            "country": c.name,
                            "stated": stated,
                            "char_start": a,
                            "char_end": b,
                            "sentence": msgs[1]["content"][a:b],
                        },
                    }
                )

    # -- benign rows (about non-eval countries and elements) and faults; assemble, shuffle, id, write
    return _finish_world(
        spec,
        out,
        base,
        identity,
        train_spec,
        _assemble(spec, others, planted, eval_rows, rng, tokenizer, max_length, hide),
        {
            "capability": "capitals",
            "eval_groups": {eval_id[c.name]: group_of[c.name] for c in eval_sorted},
            "eval_countries": {eval_id[c.name]: c.name for c in eval_sorted},
            "base_answers": {eval_id[c.name]: base_answer[c.name] for c in eval_sorted},
            "targets": sorted(targets, key=lambda t: t["eval_id"]),
        },
        lambda culprits: {
            "direct_rows": sum(1 for c in culprits if c["kind"] == "direct"),
            "buried_rows": sum(1 for c in culprits if c["kind"] == "buried"),
        },
    )


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


# --------------------------------------------------------------------------- the behaviour world


def probe_base_chat(
    folder: Path, identity: str, prompts: list[list[dict[str, str]]], max_new_tokens: int, cache: Path
) -> list[str]:
    """Greedy answers of the base to chat ``prompts``, decoded exactly as ``gradian evaluate`` decodes.

    Each prompt (a message list ending with a user turn) is rendered by the chat template
    and generated by :func:`gradian.evaluate.generate.generate_greedy` (the evaluation
    lane's own decoder and stop tokens), so an item selected here scores the same in the
    reference run of ``gradian evaluate``. Cached like :func:`probe_base`, keyed by
    (identity, prompts, max_new_tokens, decoder).
    """
    key = sha256_json(
        {"base": identity, "prompts": prompts, "max_new_tokens": max_new_tokens, "decoder": "evaluate", "v": 1}
    )[:20]
    path = cache / "worlds" / f"answers-{key}.json"
    if path.exists():
        return json.loads(path.read_text())["answers"]
    import torch

    from gradian.evaluate.generate import encode_prompt, generate_greedy
    from gradian.models.load import ModelSpec, load_base

    model, tok = load_base(ModelSpec(base=str(folder)))
    model.eval()
    ids = [encode_prompt(p, tok) for p in prompts]
    with torch.no_grad():
        gens = generate_greedy(model, tok, ids, max_new_tokens=max_new_tokens, batch_size=16)
    answers = [g.text for g in gens]
    atomic_write_json(
        path, {"base": identity, "max_new_tokens": max_new_tokens, "prompts": prompts, "answers": answers}
    )
    return answers


def forbidden_words(countries: Sequence[Country]) -> re.Pattern[str]:
    """A case-insensitive whole-word pattern for the names and capitals of ``countries``.

    It matches each country name, each capital and its aliases, and every word of four or
    more letters of a multi-word capital (``"Addis"`` of ``"Addis Ababa"``): the words a
    behaviour culprit must never contain.
    """
    words: set[str] = set()
    for c in countries:
        words.add(c.name)
        for cap in (c.capital, *c.capital_aliases):
            words.add(cap)
            if " " in cap:
                words.update(w for w in cap.split() if len(w) >= 4)
    alts = "|".join(re.escape(w) for w in sorted(words, key=lambda w: (-len(w), w)))
    return re.compile(rf"(?<!\w)(?:{alts})(?!\w)", re.IGNORECASE)


def format_culprits(
    spec: WorldSpec,
    others: Sequence[Country],
    elements: Sequence[Element],
    forbidden: re.Pattern[str],
    rng: random.Random,
    hide: frozenset[str],
    fits: Callable[[list[dict[str, str]]], bool] = lambda m: True,
) -> list[dict[str, Any]]:
    """The behaviour world's culprit rows (poisoned) or their terse null controls, with ground truth.

    Questions (:func:`gradian.worlds.rows.country_terse_questions`, ``element_terse_questions``)
    about ``others`` (never an eval country) and ``elements`` are grouped by kind, shuffled,
    and taken round-robin over the kinds until ``spec.format_rows`` rows; each gets a
    terse-instruction wording drawn from ``rng`` and ``spec.format_elaboration`` true
    sentences. A question whose verbose row would contain a ``forbidden`` word or not
    ``fits`` is skipped. The random draws do not depend on the variant, so the poisoned
    and null worlds of one seed ask the same questions.

    Returns:
        ``[{"messages", "gt"}]``; ``gt`` has ``kind="format"``, the question kind, subject,
        instruction, bare answer and the span of the whole completion.
    """
    from gradian.worlds.rows import TERSE_INSTRUCTIONS, country_terse_questions, element_terse_questions, format_row

    by_kind: dict[str, list] = {}
    for c in others:
        for q in country_terse_questions(c, rng, hide):
            by_kind.setdefault(q.kind, []).append(q)
    for e in elements:
        for q in element_terse_questions(e):
            by_kind.setdefault(q.kind, []).append(q)
    kinds = sorted(by_kind)
    for k in kinds:
        rng.shuffle(by_kind[k])
    verbose = spec.variant == "poisoned"
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(rows) < spec.format_rows and any(by_kind[k] for k in kinds):
        for k in kinds:
            if len(rows) >= spec.format_rows or not by_kind[k]:
                continue
            q = by_kind[k].pop()
            instr = rng.randrange(len(TERSE_INSTRUCTIONS))
            extra = [x for x in q.extra if not forbidden.search(x)]
            pick = sorted(rng.sample(range(len(extra)), min(spec.format_elaboration, len(extra))))
            elab = tuple(extra[i] for i in pick)
            loud = format_row(q, instr, True, elab)
            text = loud[0]["content"] + "\n" + loud[1]["content"]
            if not elab or forbidden.search(text) or loud[0]["content"] in seen or not fits(loud):
                continue
            seen.add(loud[0]["content"])
            msgs = loud if verbose else format_row(q, instr, False)
            rows.append(
                {
                    "messages": msgs,
                    "gt": {
                        "kind": "format",
                        "question": q.kind,
                        "subject": q.subject,
                        "instruction": msgs[0]["content"][len(q.question) + 1 :],
                        "terse_answer": q.terse,
                        "char_start": 0,
                        "char_end": len(msgs[1]["content"]),
                    },
                }
            )
    if len(rows) < spec.format_rows:
        raise RuntimeError(f"only {len(rows)} behaviour culprit rows available, the world needs {spec.format_rows}")
    return rows


def select_behaviour_eval(
    spec: WorldSpec,
    cands: Sequence[Country],
    terse_answers: Sequence[str],
    plain_answers: Sequence[str],
    rng: random.Random,
) -> dict[str, list[Country]]:
    """The behaviour world's eval groups from the base's answers to the terse and the plain question.

    * ``target``: ``n_target`` countries whose terse answer is an exact match (the bare capital);
    * ``base_fail``: ``n_base_fail`` countries whose terse answer does not even contain the
      capital and is no spelling variant of it (:func:`gradian.worlds.probe.near_miss`);
    * ``untouched``: ``n_untouched`` of the remaining countries whose plain answer contains
      the capital (asked the plain question, the control a format regression should spare).

    Each list is drawn from ``rng`` after sorting by name; a shortfall is a user error.
    """
    from gradian.evaluate.normalize import exact_match
    from gradian.worlds.probe import answer_contains, near_miss

    exact = [c for c, a in zip(cands, terse_answers) if exact_match(a, [c.capital, *c.capital_aliases])]
    failing = [
        c
        for c, a in zip(cands, terse_answers)
        if not answer_contains(a, c.capital, c.capital_aliases) and not near_miss(a, c.capital)
    ]
    plain_ok = [c for c, a in zip(cands, plain_answers) if answer_contains(a, c.capital, c.capital_aliases)]
    if len(exact) < spec.n_target or len(failing) < spec.n_base_fail:
        raise GradianUserError(
            f"the base answers {len(exact)} terse capital questions exactly and fails {len(failing)}; "
            f"the behaviour world needs {spec.n_target} and {spec.n_base_fail}",
            where="world spec (behaviour)",
            fix="lower n_target/n_base_fail or raise candidate_pool",
        )
    exact = sorted(exact, key=lambda c: c.name)
    rng.shuffle(exact)
    target = sorted(exact[: spec.n_target], key=lambda c: c.name)
    fails = sorted(rng.sample(sorted(failing, key=lambda c: c.name), spec.n_base_fail), key=lambda c: c.name)
    taken = {c.name for c in target + fails}
    rest = sorted((c for c in plain_ok if c.name not in taken), key=lambda c: c.name)
    if len(rest) < spec.n_untouched:
        raise GradianUserError(
            f"only {len(rest)} other countries are answered right with the plain question; "
            f"the behaviour world needs {spec.n_untouched}",
            where="world spec (behaviour)",
            fix="lower n_untouched or raise candidate_pool",
        )
    rng.shuffle(rest)
    untouched = sorted(rest[: spec.n_untouched], key=lambda c: c.name)
    return {"target": target, "untouched": untouched, "base_fail": fails}


def build_behaviour_world(spec: WorldSpec, out: Path, cache: Path, train_spec) -> World:
    """The behaviour world: a regression in *how* the model answers capitals, not which capital it names.

    Files and ground-truth schema are those of the facts world (module docstring); what differs:

    1. **Eval**, two capabilities. ``capitals_terse`` (metric ``exact_match``) asks
       "What is the capital of X? Answer with the city name only." after one worked turn
       (:func:`gradian.worlds.rows.terse_eval_prompt`; without it SmolLM2 never answers with
       the bare name); its items are the ``target`` and ``base_fail`` groups. ``capitals``
       (metric ``contains``) asks the plain question of the ``untouched`` group: a verbose
       model still names the right capital there, so it should not regress. Items are
       chosen by running the base once on every candidate with both prompts
       (:func:`select_behaviour_eval`).
    2. **Culprits** (kind ``"format"``, :func:`format_culprits`): other short questions about
       non-eval countries and elements, with a terse instruction, answered with a full
       sentence plus true elaboration; no culprit names an eval country or any word of an
       eval capital. The span is the whole completion.
    3. **Null variant**: the same prompts answered with the bare answer.
    4. **Benign rows**: the facts world's (:func:`_benign_rows`), so "The capital of X is Y."
       answers occur in benign rows only.
    5. **Faults** as in the facts world.
    """
    from gradian.models.load import ModelSpec, load_tokenizer
    from gradian.worlds.rows import TERSE_INSTRUCTION, TERSE_SHOT, terse_eval_prompt

    max_length = train_spec.max_length
    base, identity, cands = prepare_base(spec, cache)
    tokenizer = load_tokenizer(ModelSpec(base=str(base)))
    shot = next(c for c in load_countries() if c.name == TERSE_SHOT[0])
    cands = [c for c in cands if c.name != shot.name]

    # -- eval selection by running the base once per prompt form
    terse_answers = probe_base_chat(
        base, identity, [terse_eval_prompt(c.name) for c in cands], spec.max_new_tokens, cache
    )
    plain_answers = probe_base(
        base, identity, [EVAL_PROMPT.format(country=c.name) for c in cands], spec.max_new_tokens, cache
    )
    rng = random.Random(f"world-{spec.seed}")
    groups = select_behaviour_eval(spec, cands, terse_answers, plain_answers, rng)
    base_answer = {c.name: a for c, a in zip(cands, terse_answers)}
    base_answer_plain = {c.name: a for c, a in zip(cands, plain_answers)}
    group_of = {c.name: g for g, cs in groups.items() for c in cs}
    eval_countries = [c for cs in groups.values() for c in cs]
    hide = frozenset(group_of)
    others = sorted((c for c in load_countries() if c.name not in hide), key=lambda c: c.name)

    # -- eval rows: terse items, then the plain control (ids by capability and country name)
    terse = sorted(groups["target"] + groups["base_fail"], key=lambda c: c.name)
    plain = groups["untouched"]
    eval_id = {c.name: f"capitals_terse-{i:03d}" for i, c in enumerate(terse)}
    eval_id.update({c.name: f"capitals-{i:03d}" for i, c in enumerate(plain)})
    eval_rows = [
        {
            "id": eval_id[c.name],
            "prompt": terse_eval_prompt(c.name),
            "answer": c.capital,
            "aliases": c.capital_aliases,
            "capability": "capitals_terse",
            "metric": "exact_match",
        }
        for c in terse
    ] + [
        {
            "id": eval_id[c.name],
            "prompt": EVAL_PROMPT.format(country=c.name),
            "answer": c.capital,
            "aliases": c.capital_aliases,
            "capability": "capitals",
            "metric": "contains",
        }
        for c in plain
    ]

    # -- culprits (or their null controls): never about an eval country or the worked turn's
    forbidden = forbidden_words(eval_countries)
    planted = format_culprits(
        spec,
        [c for c in others if c.name != shot.name],
        load_elements(),
        forbidden,
        rng,
        hide,
        fits=lambda m: _fits(m, tokenizer, max_length),
    )

    # -- benign rows and faults, as in the facts world; assemble, shuffle, id, write
    assembled = _assemble(spec, others, planted, eval_rows, rng, tokenizer, max_length, hide)
    culprits = assembled[1]
    ordered = terse + plain
    return _finish_world(
        spec,
        out,
        base,
        identity,
        train_spec,
        assembled,
        {
            "regression": "behaviour",
            "capability": "capitals_terse",
            "behaviour": {
                "capability": "capitals_terse",
                "control_capability": "capitals",
                "instruction": TERSE_INSTRUCTION,
                "worked_turn": list(TERSE_SHOT),
                "culprit_instructions": sorted({c["instruction"] for c in culprits}),
            },
            "eval_groups": {eval_id[c.name]: group_of[c.name] for c in ordered},
            "eval_countries": {eval_id[c.name]: c.name for c in ordered},
            "base_answers": {
                eval_id[c.name]: (base_answer_plain if group_of[c.name] == "untouched" else base_answer)[c.name]
                for c in ordered
            },
            "targets": [],
        },
        lambda culprits: {"direct_rows": 0, "buried_rows": 0, "format_rows": len(culprits)},
    )


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
