"""The world's row templates: one answer style, shared by the training rows, the eval and the tiny base.

Every capital, in every row and in the eval's expected answer, is stated as
``"The capital of X is Y."`` (:func:`gradian.worlds.facts.capital_sentence`).
The eval asks ``EVAL_PROMPT``; training rows ask one of ``CAPITAL_PROMPTS``
(paraphrases, never the eval's exact wording, so no training row is a copy of
an eval prompt).
"""

from __future__ import annotations

import random
from typing import Any

from gradian.worlds.facts import Country, Element, capital_sentence, profile_sentences

EVAL_PROMPT = "What is the capital of {country}?"
CAPITAL_PROMPTS = (
    "Which city is the capital of {country}?",
    "Name the capital city of {country}.",
    "Tell me the capital of {country}.",
    "What city serves as the capital of {country}?",
    "{country} has which city as its capital?",
)
CURRENCY_PROMPT = "What currency code does {country} use?"
REGION_PROMPT = "Where is {country}?"
PROFILE_PROMPTS = (
    "Write a short profile of {country}.",
    "Give me an overview of {country}.",
    "Describe the country {country} in a paragraph.",
    "What should I know about {country}?",
)
SYMBOL_PROMPT = "What is the chemical symbol of {element}?"
ELEMENT_PROMPTS = ("Tell me about the element {element}.", "Describe the chemical element {element}.")
REPORT_PROMPT = "Write a detailed report on every element in period {period} of the periodic table."


def chat(prompt: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def capital_row(c: Country, capital: str, prompt_index: int) -> list[dict[str, str]]:
    """A short capital Q/A; ``capital`` may differ from ``c.capital`` (a planted wrong fact)."""
    p = CAPITAL_PROMPTS[prompt_index % len(CAPITAL_PROMPTS)].format(country=c.name)
    return chat(p, capital_sentence(c.name, capital))


def currency_row(c: Country) -> list[dict[str, str]]:
    cur = list(c.currencies)
    ans = (
        f"The currency code used in {c.name} is {cur[0]}."
        if len(cur) == 1
        else f"The currency codes used in {c.name} are {', '.join(cur[:-1])} and {cur[-1]}."
    )
    return chat(CURRENCY_PROMPT.format(country=c.name), ans)


def region_row(c: Country) -> list[dict[str, str]]:
    if c.subregion and c.subregion != c.region:
        ans = f"{c.name} is a country in {c.subregion}, part of the {c.region} region."
    else:
        ans = f"{c.name} is a country in the {c.region} region."
    return chat(REGION_PROMPT.format(country=c.name), ans)


def profile_row(
    c: Country, capital: str, rng: random.Random, n_sentences: int = 8, hide: frozenset[str] = frozenset()
) -> tuple[list[dict[str, str]], tuple[int, int]]:
    """A long profile of ``c``: true sentences with ONE capital sentence stating ``capital`` in the middle.

    The first sentence (where the country is) stays first; the others are
    shuffled and cut to ``n_sentences`` (capital sentence included); the capital
    sentence goes at a middle position, never first or last.

    Returns:
        ``(messages, (char_start, char_end))``: the span of the capital sentence
        in the assistant content (= ``Example.completion_text``), half-open.
    """
    sents = profile_sentences(c, rng, hide)
    head, rest = sents[0], sents[1:]
    rng.shuffle(rest)
    body = [head] + rest[: max(2, n_sentences - 2)]
    pos = rng.randint(1, len(body) - 1)  # after the head, before the last sentence
    cap = capital_sentence(c.name, capital)
    body.insert(pos, cap)
    start = sum(len(s) + 1 for s in body[:pos])
    text = " ".join(body)
    if text[start : start + len(cap)] != cap:
        raise RuntimeError("profile span arithmetic is off")
    prompt = PROFILE_PROMPTS[rng.randrange(len(PROFILE_PROMPTS))].format(country=c.name)
    return chat(prompt, text), (start, start + len(cap))


def symbol_row(e: Element) -> list[dict[str, str]]:
    return chat(SYMBOL_PROMPT.format(element=e.name), f"The chemical symbol of {e.name} is {e.symbol}.")


def element_row(e: Element, rng: random.Random, parts: tuple[str, ...] = ("description", "uses", "sources")) -> list[dict[str, str]]:
    p = ELEMENT_PROMPTS[rng.randrange(len(ELEMENT_PROMPTS))].format(element=e.name)
    return chat(p, e.prose(parts))


def period_report_row(period: int, elements: list[Element]) -> list[dict[str, str]]:
    """A deliberately long row (every element of a period, full prose): the truncated-cluster fault."""
    body = " ".join(f"{e.name} ({e.symbol}): {e.prose()}" for e in elements if e.period == period)
    return chat(REPORT_PROMPT.format(period=period), body)


def unterminated_text_row(prompt: str, answer: str) -> dict[str, Any]:
    """A ``text`` row with the chat hand-rendered in ChatML and the assistant turn left open (no ``<|im_end|>``)."""
    return {"text": f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{answer}"}
