"""A family of planted worlds: the worked example and variants it was not tuned on (issue 23).

``gradian world --family DIR [--kind smollm2|tiny] [--seed S]`` writes one world per variant of
:data:`FAMILY` into ``DIR/<name>/`` (the files of ``gradian world``: train/valid/eval JSONL,
``ground_truth.json``, ``train.yaml``, ``world.json``) plus ``DIR/<name>/variant.json`` (the knobs
asked for and what they resolved to) and ``DIR/family.json`` (every variant, in order).

The variants move one or several axes of :class:`gradian.worlds.knobs.WorldKnobs` away from the
worked example (``worked``): LoRA targets and rank, culprit share (5–35%), the buried share, the number
and share of long benign rows, the profile length, epochs and learning rate. The two ``held_out``
variants were written down before any default was tuned on the family, and differ from the worked
example on several axes at once; a default is judged on them, never chosen on them.

Learning rates and epochs are given relative to the kind's default training config
(:func:`gradian.worlds.spec.default_train_spec`: SmolLM2 4e-4 × 3 epochs, tiny 3e-3 × 5), so one
family definition serves both kinds; ``variant.json`` records the absolute values. Benign row counts
are given for SmolLM2 and scaled by the tiny world's benign size (56 against 180 rows) for ``tiny``.
The seed (``--seed``) is the world seed of every variant (eval split, wrong capitals, row order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gradian.worlds.knobs import WorldKnobs

SCHEMA = "gradian.world-family/1"


@dataclass(frozen=True)
class Variant:
    """One world of the family.

    Attributes:
        name: its folder name.
        note: what it tests, in a line.
        held_out: written before tuning; a default is judged on it, never chosen on it.
        knobs: the world and training knobs, except the relative ones below.
        benign_rows: benign rows at SmolLM2 scale (tiny: scaled by 56/180); ``None``: the kind's.
        lr_factor: learning rate = the kind default's × this.
        extra_epochs: epochs = the kind default's + this.
    """

    name: str
    note: str
    held_out: bool = False
    knobs: WorldKnobs = field(default_factory=WorldKnobs)
    benign_rows: int | None = None
    lr_factor: float = 1.0
    extra_epochs: int = 0


#: The family, in table order. The worked example first; the two held-out variants last.
FAMILY: tuple[Variant, ...] = (
    Variant(
        "worked",
        "the worked example, as `gradian world` writes it by default (SmolLM2: 35% culprits, a quarter direct)",
    ),
    Variant(
        "qv-r8",
        "LoRA r=8 on q and v only (the worked example's data)",
        knobs=WorldKnobs(targets="q,v", rank=8),
    ),
    Variant(
        "share15",
        "15% culprits in more benign rows, 40% of them buried; r=16 on every projection",
        knobs=WorldKnobs(culprit_share=0.15, buried_share=0.4, targets="all-linear", rank=16),
        benign_rows=340,
    ),
    Variant(
        "share5",
        "5% culprits: few culprits among many benign rows",
        knobs=WorldKnobs(culprit_share=0.05, buried_share=0.5),
        benign_rows=380,
    ),
    Variant(
        "long-benign",
        "60% of the benign rows are long profiles (many sentences per benign row)",
        knobs=WorldKnobs(culprit_share=0.2, long_share=0.6),
        benign_rows=260,
    ),
    Variant(
        "buried-heavy",
        "85% of the culprits buried, in longer profiles",
        knobs=WorldKnobs(culprit_share=0.25, buried_share=0.85, sentences=10),
    ),
    Variant(
        "direct-heavy",
        "80% of the culprits direct one-sentence rows",
        knobs=WorldKnobs(culprit_share=0.2, buried_share=0.2),
        benign_rows=260,
    ),
    Variant(
        "low-lr-long",
        "half the learning rate, two more epochs (a gentler, longer run)",
        lr_factor=0.5,
        extra_epochs=2,
    ),
    Variant(
        "heldout-a",
        "held out: 12% culprits, 40% buried, 50% long benign rows, q/k/v/o r=16, 9-sentence profiles, 1.5x lr",
        held_out=True,
        knobs=WorldKnobs(culprit_share=0.12, buried_share=0.4, long_share=0.5, targets="q,k,v,o", rank=16, sentences=9),
        benign_rows=320,
        lr_factor=1.5,
    ),
    Variant(
        "heldout-b",
        "held out: 8% culprits, 65% buried, 40% long benign rows, r=4 on every projection, one epoch less",
        held_out=True,
        knobs=WorldKnobs(culprit_share=0.08, buried_share=0.65, long_share=0.4, targets="all-linear", rank=4),
        benign_rows=360,
        extra_epochs=-1,
    ),
)

#: Benign rows of the SmolLM2 and tiny worked examples (the family's benign counts scale by their ratio).
BENIGN = {"smollm2": 180, "tiny": 56}


def resolved_knobs(variant: Variant, kind: str, seed: int = 0) -> WorldKnobs:
    """``variant``'s knobs for ``kind`` with the relative ones (learning rate, epochs, benign rows) made absolute."""
    from dataclasses import replace

    from gradian.worlds.spec import default_train_spec

    t = default_train_spec(kind, seed)
    kw: dict[str, Any] = {}
    if variant.lr_factor != 1.0:
        kw["learning_rate"] = t.learning_rate * variant.lr_factor
    if variant.extra_epochs:
        kw["epochs"] = t.num_train_epochs + variant.extra_epochs
    if variant.benign_rows is not None:
        kw["benign_rows"] = round(variant.benign_rows * BENIGN[kind] / BENIGN["smollm2"])
    return replace(variant.knobs, **kw)


def build_family(
    out: str | Path, kind: str = "smollm2", seed: int = 0, cache: str | Path | None = None, say: Callable = print
) -> dict[str, Any]:
    """Write every variant of :data:`FAMILY` into ``out/<name>/`` and ``out/family.json``; return the latter's dict."""
    from gradian.util import atomic_write_json
    from gradian.worlds.builder import build_world
    from gradian.worlds.knobs import apply_knobs, apply_train_knobs, describe
    from gradian.worlds.spec import WorldSpec, default_train_spec

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for v in FAMILY:
        knobs = resolved_knobs(v, kind, seed)
        spec = apply_knobs(WorldSpec.default(kind, "poisoned", seed), knobs)
        tspec = apply_train_knobs(default_train_spec(kind, seed), knobs)
        w = build_world(spec, out / v.name, cache=cache, train_spec=tspec)
        gt = w.load_ground_truth()
        entry = {
            "name": v.name,
            "note": v.note,
            "held_out": v.held_out,
            "kind": kind,
            "seed": seed,
            "knobs": knobs.to_dict(),
            "resolved": describe(spec, tspec),
            "sizes": gt["sizes"],
            "written": {  # after de-duplication: the shares of the rows actually written
                "culprit_share": round(gt["sizes"]["culprits"] / gt["sizes"]["train"], 4),
                "benign_rows": gt["sizes"]["benign"],
            },
        }
        atomic_write_json(out / v.name / "variant.json", entry)
        entries.append(entry)
        sz = gt["sizes"]
        say(
            f"{v.name}{' (held out)' if v.held_out else ''}: {sz['train']} rows, {sz['culprits']} culprits "
            f"({sz['direct_rows']} direct, {sz['buried_rows']} buried), r={tspec.r} on "
            f"{','.join(m.replace('_proj', '') for m in tspec.target_modules)}"
        )
    family = {"schema": SCHEMA, "kind": kind, "seed": seed, "variants": entries}
    atomic_write_json(out / "family.json", family)
    return family
