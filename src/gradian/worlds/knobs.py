"""World knobs: the axes along which a family of worlds varies (issue 23).

A :class:`WorldKnobs` names what a user of ``gradian world`` may change about a world of a given kind;
:func:`apply_knobs` turns it into the sizes of a :class:`~gradian.worlds.spec.WorldSpec` and the
:class:`~gradian.trainconfig.TrainSpec` written to the world's ``train.yaml``. Every knob left at ``None``
keeps the kind's default, so ``WorldKnobs()`` reproduces :meth:`WorldSpec.default` and
:func:`~gradian.worlds.spec.default_train_spec` exactly (the same files, byte for byte).

How the shares become row counts (``B`` benign rows, ``C`` culprit rows, shares as fractions):

* **benign rows** ``B`` (``benign_rows``) and **long-row share** ``L`` (``long_share``): ``round(L·B)``
  benign rows are long country profiles (``n_profiles``); the other ``B − round(L·B)`` benign rows are
  short capital, currency and region rows, split in the kind default's proportions (largest remainder).
  Element rows (chemical symbols and element prose) keep the kind's counts and count as short and long
  rows respectively: the tiny base is pretrained on the world's element list, so changing it would
  change the base. Benign rows repeat when asked for more than their countries give; exact repeats are
  dropped, so the written sizes (``ground_truth.json``'s ``sizes``) may be a little lower.
* **culprit share** ``s`` (``culprit_share``): ``C = round(s·B / (1 − s))`` culprit rows, so that culprits
  are ``s`` of the training rows; **buried share** ``b`` (``buried_share``): ``round(b·C)`` of them are
  buried (one wrong sentence in a long profile), the rest direct (a short wrong Q/A).
* Each kind's culprit rows go to that kind's targets (eval items) as evenly as possible: the kind
  default's number of targets, fewer when there are fewer rows than targets (then the freed eval items
  join the untouched group, so the eval keeps its size). ``direct_total`` / ``buried_total`` carry the
  exact counts into the builder.
* **row length** (``sentences``): sentences per long profile, the capital sentence included (at most
  11: what the facts give).

Training knobs (``train.yaml``): ``targets`` (LoRA target modules: ``all-linear`` or a comma list of
module names, short names ``q,k,v,o,gate,up,down`` allowed), ``rank`` (``lora_alpha`` = 2·rank unless
``alpha`` is given), ``epochs`` and ``learning_rate``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from gradian.errors import GradianUserError

#: Short names a user may give for the Llama projections.
SHORT_TARGETS = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "down": "down_proj",
}
#: Most sentences a long profile can hold (the facts give at most ten true ones, plus the capital's).
MAX_SENTENCES = 11
#: The benign short country-row kinds whose counts the benign knobs scale (elements are kept).
SHORT_KINDS = ("n_capitals", "n_currency", "n_region")


@dataclass(frozen=True)
class WorldKnobs:
    """What a family of worlds varies; ``None`` everywhere = the kind's default world.

    Attributes:
        culprit_share: culprit rows / training rows, in [0.02, 0.6].
        buried_share: buried culprit rows / culprit rows, in [0, 1].
        benign_rows: benign training rows before de-duplication (``B`` in the module docstring).
        long_share: long benign rows (country profiles and element prose) / benign rows, in [0, 0.9].
        sentences: sentences per long profile (capital sentence included), 4..11.
        targets: LoRA target modules, ``"all-linear"`` or comma-separated names (``"q,v"``).
        rank: LoRA rank r.
        alpha: lora_alpha (default 2·rank when ``rank`` is given, else the kind's).
        epochs: training epochs.
        learning_rate: peak learning rate.
    """

    culprit_share: float | None = None
    buried_share: float | None = None
    benign_rows: int | None = None
    long_share: float | None = None
    sentences: int | None = None
    targets: str | None = None
    rank: int | None = None
    alpha: int | None = None
    epochs: float | None = None
    learning_rate: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """The knobs that are set (``None`` ones left out)."""
        return {k: v for k, v in asdict(self).items() if v is not None}

    def check(self) -> None:
        """Raise :class:`GradianUserError` naming the flag of the first knob out of range."""
        ranges = {
            "culprit_share": (0.02, 0.6),
            "buried_share": (0.0, 1.0),
            "long_share": (0.0, 0.9),
            "benign_rows": (10, 5000),
            "sentences": (4, MAX_SENTENCES),
            "rank": (1, 256),
            "alpha": (1, 1024),
            "epochs": (1, 50),
            "learning_rate": (1e-6, 0.1),
        }
        for name, (lo, hi) in ranges.items():
            v = getattr(self, name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise GradianUserError(
                    f"{name} must be between {lo:g} and {hi:g} (got {v!r})",
                    where=f"--{name.replace('_', '-')}",
                    fix=f"give a value in [{lo:g}, {hi:g}]",
                )
        if self.targets is not None:
            target_modules(self.targets)


def target_modules(text: str) -> tuple[str, ...]:
    """``"all-linear"`` → every Llama projection; ``"q,v"`` → ``("q_proj", "v_proj")``; names kept as given."""
    from gradian.trainconfig import ALL_LINEAR_LLAMA

    t = text.strip()
    if t == "all-linear":
        return ALL_LINEAR_LLAMA
    names = [SHORT_TARGETS.get(x.strip(), x.strip()) for x in t.split(",") if x.strip()]
    if not names or len(set(names)) != len(names):
        raise GradianUserError(
            f"bad LoRA targets {text!r}",
            where="--targets",
            fix="give all-linear or distinct comma-separated module names, e.g. q,v or q_proj,v_proj",
        )
    return tuple(names)


def _split(total: int, weights: dict[str, int]) -> dict[str, int]:
    """``total`` split over ``weights``' keys in proportion to their values (largest remainder, ties by key order)."""
    w = sum(weights.values())
    if w == 0:
        keys = list(weights)
        return {k: total // len(keys) + (i < total % len(keys)) for i, k in enumerate(keys)}
    raw = {k: total * v / w for k, v in weights.items()}
    out = {k: int(r) for k, r in raw.items()}
    left = total - sum(out.values())
    for k in sorted(weights, key=lambda k: -(raw[k] - out[k]))[:left]:
        out[k] += 1
    return out


def benign_total(spec) -> int:
    """Benign training rows ``spec`` asks for (before de-duplication)."""
    return spec.n_capitals + spec.n_profiles + spec.n_currency + spec.n_region + spec.n_symbols + spec.n_element_prose


def culprit_total(spec) -> tuple[int, int]:
    """``(direct rows, buried rows)`` ``spec`` plants."""
    d = spec.direct_total if spec.direct_total is not None else spec.n_direct * spec.direct_rows
    b = spec.buried_total if spec.buried_total is not None else spec.n_buried * spec.buried_rows
    return d, b


def apply_knobs(spec, knobs: WorldKnobs):
    """The :class:`WorldSpec` of ``spec`` with ``knobs`` applied (see the module docstring); ``spec`` if none is set."""
    knobs.check()
    kw: dict[str, Any] = {}
    world_knobs = (knobs.culprit_share, knobs.buried_share, knobs.benign_rows, knobs.long_share, knobs.sentences)
    if all(v is None for v in world_knobs):
        return spec
    if spec.regression != "facts" and any(v is not None for v in world_knobs[:4]):
        raise GradianUserError(
            "the share and row knobs apply to the facts world only",
            where="--culprit-share/--buried-share/--benign-rows/--long-share",
            fix="leave them out with --regression behaviour (its knobs: the training ones)",
        )
    if knobs.sentences is not None:
        kw["profile_sentences"] = knobs.sentences
    b0 = benign_total(spec)
    if knobs.benign_rows is not None or knobs.long_share is not None:
        B = knobs.benign_rows if knobs.benign_rows is not None else b0
        long0 = spec.n_profiles + spec.n_element_prose
        L = knobs.long_share if knobs.long_share is not None else long0 / b0
        n_long = round(L * B)
        n_prof = max(0, n_long - spec.n_element_prose)
        n_short = max(0, B - n_prof - spec.n_element_prose - spec.n_symbols)
        kw["n_profiles"] = n_prof
        kw.update(_split(n_short, {k: getattr(spec, k) for k in SHORT_KINDS}))
    B = b0 if not kw else benign_total(replace(spec, **kw))
    if knobs.culprit_share is not None or knobs.buried_share is not None:
        d0, bu0 = culprit_total(spec)
        c0 = d0 + bu0
        s = knobs.culprit_share if knobs.culprit_share is not None else c0 / (c0 + b0)
        b = knobs.buried_share if knobs.buried_share is not None else bu0 / c0
        C = max(1, round(s * B / (1 - s)))
        Cb = round(b * C)
        Cd = C - Cb
        n_d, n_b = min(spec.n_direct, Cd), min(spec.n_buried, Cb)
        kw.update(
            n_direct=n_d,
            n_buried=n_b,
            n_untouched=spec.n_untouched + (spec.n_direct - n_d) + (spec.n_buried - n_b),
            direct_total=Cd,
            buried_total=Cb,
        )
    return replace(spec, **kw)


def apply_train_knobs(train_spec, knobs: WorldKnobs):
    """The :class:`~gradian.trainconfig.TrainSpec` of a world (its ``train.yaml``) with the training knobs applied."""
    knobs.check()
    kw: dict[str, Any] = {}
    if knobs.targets is not None:
        kw["target_modules"] = target_modules(knobs.targets)
    if knobs.rank is not None:
        kw["r"] = knobs.rank
        kw["lora_alpha"] = 2 * knobs.rank
    if knobs.alpha is not None:
        kw["lora_alpha"] = knobs.alpha
    if knobs.epochs is not None:
        kw["num_train_epochs"] = knobs.epochs
    if knobs.learning_rate is not None:
        kw["learning_rate"] = knobs.learning_rate
    return train_spec.replace(**kw) if kw else train_spec


def describe(spec, train_spec) -> dict[str, Any]:
    """The resolved axes of a world, as written to a family's ``variant.json`` (requested counts, before de-dup)."""
    d, b = culprit_total(spec)
    B = benign_total(spec)
    return {
        "culprit_rows": d + b,
        "direct_rows": d,
        "buried_rows": b,
        "benign_rows": B,
        "culprit_share": round((d + b) / (d + b + B), 4),
        "buried_share": round(b / (d + b), 4) if d + b else 0.0,
        "long_share": round((spec.n_profiles + spec.n_element_prose) / B, 4) if B else 0.0,
        "sentences": spec.profile_sentences,
        "targets": list(train_spec.target_modules),
        "rank": train_spec.r,
        "alpha": train_spec.lora_alpha,
        "epochs": train_spec.num_train_epochs,
        "learning_rate": train_spec.learning_rate,
        "regression": spec.regression,
    }
