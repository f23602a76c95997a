"""The behaviour world (``WorldSpec.regression="behaviour"``, SmolLM2 only): it regresses *how* the model
answers instead of which capital it names; see :func:`build_behaviour_world`.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from gradian.errors import GradianUserError
from gradian.worlds.assemble import _assemble, _finish_world, _fits
from gradian.worlds.base import prepare_base, probe_base, probe_base_chat
from gradian.worlds.facts import Country, Element, load_countries, load_elements
from gradian.worlds.rows import EVAL_PROMPT, capital_eval_row
from gradian.worlds.spec import World, WorldSpec


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
    ] + [capital_eval_row(eval_id[c.name], c) for c in plain]

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
