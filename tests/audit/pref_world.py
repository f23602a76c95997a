"""Preference-data fixtures, each after a documented format (see :mod:`gradian.data.preference`).

- :func:`trl_rows`: TRL "Dataset formats", preference, conversational with an explicit prompt
  (``prompt``/``chosen``/``rejected`` message lists; which hub datasets use this form was not checked; the
  handbook's HuggingFaceH4/ultrafeedback_binarized form, a string prompt + whole conversations, is in
  published_examples.py).
- :func:`trl_kto_rows`: TRL "Dataset formats", unpaired preference (``prompt``/``completion``/``label``).
- :func:`axolotl_rows`: axolotl docs, RLHF, ``chatml.intel`` (``system``/``question``/``chosen``/``rejected``).
- :func:`llamafactory_rows`: LLaMA-Factory data/README.md, preference dataset in sharegpt format
  (``conversations`` of ``from``/``value`` + ``chosen`` + ``rejected`` message objects).

Written for these tests (facts about capitals); the clean sets alternate which response is longer, so they have
no length bias, no duplicates and no empty or identical pairs.
"""

from __future__ import annotations

CAPITALS = [
    ("France", "Paris"), ("Japan", "Tokyo"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Canada", "Ottawa"),
    ("Egypt", "Cairo"), ("Norway", "Oslo"), ("Chile", "Santiago"), ("Ghana", "Accra"), ("Spain", "Madrid"),
    ("India", "New Delhi"), ("Italy", "Rome"), ("Poland", "Warsaw"), ("Cuba", "Havana"), ("Nepal", "Kathmandu"),
    ("Greece", "Athens"), ("Iran", "Tehran"), ("Mali", "Bamako"), ("Fiji", "Suva"), ("Laos", "Vientiane"),
    ("Oman", "Muscat"), ("Chad", "N'Djamena"), ("Togo", "Lome"), ("Iraq", "Baghdad"),
]  # fmt: skip


def _pair(i: int, biased: bool = False) -> tuple[str, str, str]:
    country, capital = CAPITALS[i]
    wrong = CAPITALS[(i + 7) % len(CAPITALS)][1]
    q = f"What is the capital city of {country}?"
    short_good, long_good = f"{capital}.", f"The capital city of {country} is {capital}, its largest political centre."
    short_bad, long_bad = f"{wrong}.", f"I believe the capital city of {country} is {wrong}, but I am not sure."
    if biased:
        return q, long_good, short_bad
    return (q, short_good, long_bad) if i % 2 else (q, long_good, short_bad)


def kto_items(n_desirable: int, n_undesirable: int, pair) -> list[tuple[int, str, str, bool]]:
    """Unpaired preference (KTO) items ``(i, question, answer, label)`` for i < n_desirable + n_undesirable, where
    ``pair(i)`` gives ``(question, good, bad)``: the first ``n_desirable`` answer well (label True), the rest badly."""
    out = []
    for i in range(n_desirable + n_undesirable):
        q, good, bad = pair(i)
        label = i < n_desirable
        out.append((i, q, good if label else bad, label))
    return out


def sharegpt_pair(q: str, good: str, bad: str) -> dict:
    """One LLaMA-Factory sharegpt preference row: ``conversations`` (one human turn), ``chosen`` / ``rejected`` (one
    gpt message object each)."""
    return {
        "conversations": [{"from": "human", "value": q}],
        "chosen": {"from": "gpt", "value": good},
        "rejected": {"from": "gpt", "value": bad},
    }


def trl_rows(n: int = 24, biased: bool = False) -> list[dict]:
    """TRL conversational preference rows with an explicit prompt."""
    out = []
    for i in range(n):
        q, good, bad = _pair(i, biased)
        out.append(
            {
                "prompt": [{"role": "user", "content": q}],
                "chosen": [{"role": "assistant", "content": good}],
                "rejected": [{"role": "assistant", "content": bad}],
            }
        )
    return out


def trl_kto_rows(n_desirable: int = 12, n_undesirable: int = 12) -> list[dict]:
    """TRL unpaired preference (KTO) rows: one desirable or undesirable completion each."""
    return [
        {"prompt": q + f" (#{i})", "completion": answer, "label": label}
        for i, q, answer, label in kto_items(n_desirable, n_undesirable, lambda i: _pair(i % len(CAPITALS)))
    ]


def axolotl_rows(n: int = 24, biased: bool = False) -> list[dict]:
    """axolotl ``chatml.intel`` rows."""
    out = []
    for i in range(n):
        q, good, bad = _pair(i, biased)
        out.append({"system": "You are a geography tutor.", "question": q, "chosen": good, "rejected": bad})
    return out


def llamafactory_rows(n: int = 24, biased: bool = False) -> list[dict]:
    """LLaMA-Factory sharegpt preference rows."""
    return [sharegpt_pair(*_pair(i, biased)) for i in range(n)]


def plant_pair_faults(rows: list[dict], name: str) -> list[dict]:
    """A copy of ``rows`` (one fixture's, ``name`` its format: ``trl``, ``axolotl``, ``llamafactory``) with row 3's
    chosen response identical to its rejected one and row 5's rejected response empty, in that format's shape."""
    import json

    rows = json.loads(json.dumps(rows))
    rows[3]["rejected"] = rows[3]["chosen"]
    if name == "trl":
        rows[5]["rejected"] = [{"role": "assistant", "content": "  "}]
    elif name == "llamafactory":
        rows[5]["rejected"] = {"from": "gpt", "value": ""}
    else:
        rows[5]["rejected"] = ""
    return rows
