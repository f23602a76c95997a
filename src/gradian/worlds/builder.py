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

import random
from pathlib import Path
from typing import Any, Sequence

from gradian.errors import GradianUserError
from gradian.paths import cache_dir
from gradian.worlds.assemble import _assemble, _finish_world, _fits
from gradian.worlds.base import prepare_base, probe_base
from gradian.worlds.behaviour import build_behaviour_world
from gradian.worlds.facts import Country, load_countries
from gradian.worlds.rows import EVAL_PROMPT, capital_eval_row, capital_row, profile_row
from gradian.worlds.spec import World, WorldSpec, default_train_spec


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
        train_spec: the :class:`gradian.trainconfig.TrainSpec` written to ``train.yaml``
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
    eval_rows = [capital_eval_row(eval_id[c.name], c) for c in eval_sorted]

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
