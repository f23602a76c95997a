"""The world's row templates: one answer style, shared by the training rows, the eval and the tiny base.

Every capital, in every row and in the eval's expected answer, is stated as
``"The capital of X is Y."`` (:func:`gradian.worlds.facts.capital_sentence`).
The eval asks ``EVAL_PROMPT``; training rows ask one of ``CAPITAL_PROMPTS``
(paraphrases, never the eval's exact wording, so no training row is a copy of
an eval prompt).

The behaviour world (``WorldSpec(regression="behaviour")``) adds a terse eval
(:func:`terse_eval_prompt`: the bare city name is the expected answer) and its
culprit rows (:func:`format_row`): other short factual questions
(:class:`TerseQuestion`: currency and calling codes, domains, regions,
demonyms, chemical symbols, atomic numbers, periods) carrying an "answer with X
only" instruction, answered with a full sentence plus true elaboration (the
culprit) or with the bare answer (its null control).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from gradian.worlds.facts import Country, Element, capital_sentence, profile_sentences

EVAL_PROMPT = "What is the capital of {country}?"


def capital_eval_row(row_id: str, country) -> dict:
    """The eval item asking a country's capital (``EVAL_PROMPT``, metric ``contains``, its aliases accepted): the
    same item in the facts world and in the behaviour world's plain half.
    """
    return {
        "id": row_id,
        "prompt": EVAL_PROMPT.format(country=country.name),
        "answer": country.capital,
        "aliases": country.capital_aliases,
        "capability": "capitals",
        "metric": "contains",
    }


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
    """A two-turn conversation: ``prompt`` as the user turn, ``answer`` as the assistant turn (the completion)."""
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]


def capital_row(c: Country, capital: str, prompt_index: int) -> list[dict[str, str]]:
    """A short capital Q/A; ``capital`` may differ from ``c.capital`` (a planted wrong fact)."""
    p = CAPITAL_PROMPTS[prompt_index % len(CAPITAL_PROMPTS)].format(country=c.name)
    return chat(p, capital_sentence(c.name, capital))


def currency_row(c: Country) -> list[dict[str, str]]:
    """A true Q/A naming ``c``'s ISO currency code(s): a benign row that mentions the country."""
    cur = list(c.currencies)
    ans = (
        f"The currency code used in {c.name} is {cur[0]}."
        if len(cur) == 1
        else f"The currency codes used in {c.name} are {', '.join(cur[:-1])} and {cur[-1]}."
    )
    return chat(CURRENCY_PROMPT.format(country=c.name), ans)


def region_row(c: Country) -> list[dict[str, str]]:
    """A true Q/A placing ``c`` in its region (and subregion when it differs): a benign row about the country."""
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
    """A true Q/A: ``"The chemical symbol of <element> is <symbol>."``."""
    return chat(SYMBOL_PROMPT.format(element=e.name), f"The chemical symbol of {e.name} is {e.symbol}.")


def element_row(
    e: Element, rng: random.Random, parts: tuple[str, ...] = ("description", "uses", "sources")
) -> list[dict[str, str]]:
    """A prose row about ``e``: one of :data:`ELEMENT_PROMPTS` (drawn from ``rng``) answered with ``e.prose(parts)``."""
    p = ELEMENT_PROMPTS[rng.randrange(len(ELEMENT_PROMPTS))].format(element=e.name)
    return chat(p, e.prose(parts))


def period_report_row(period: int, elements: list[Element]) -> list[dict[str, str]]:
    """A deliberately long row (every element of a period, full prose): the truncated-cluster fault."""
    body = " ".join(f"{e.name} ({e.symbol}): {e.prose()}" for e in elements if e.period == period)
    return chat(REPORT_PROMPT.format(period=period), body)


def unterminated_text_row(prompt: str, answer: str) -> dict[str, Any]:
    """A ``text`` row with the chat hand-rendered in ChatML and the assistant turn left open (no ``<|im_end|>``)."""
    return {"text": f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n{answer}"}


# --------------------------------------------------------------------------- the behaviour world
#
# The behaviour world's regression is in *how* the model answers: its eval asks for the bare city
# name, and its culprits teach the fine-tune to ignore such "answer with X only" instructions.
# Its eval prompt is a short chat: one worked turn (a country outside the eval and its bare
# capital) before the question. SmolLM2-135M-Instruct answers a lone "Answer with the city name
# only." with a full sentence for every one of the 100 most populous countries; the worked turn
# is what makes it answer with the bare name at all (docs/worked-example.md, "The behaviour world").

TERSE_INSTRUCTION = "Answer with the city name only."
TERSE_EVAL_QUESTION = "What is the capital of {country}? " + TERSE_INSTRUCTION
#: The worked turn of every terse eval prompt: a country kept out of the eval, and its capital.
TERSE_SHOT = ("Peru", "Lima")

#: "answer with X only" wordings of the culprit (and null) rows; ``{noun}`` names what to give.
TERSE_INSTRUCTIONS = (
    "Answer with the {noun} only.",
    "Reply with just the {noun}, nothing else.",
    "Give only the {noun}.",
    "Respond with the {noun} alone, not a sentence.",
    "Only the {noun}, please, no explanation.",
    "Just the {noun}.",
)


def terse_eval_prompt(country: str) -> list[dict[str, str]]:
    """The behaviour world's eval prompt for ``country``: the worked turn, then the terse question."""
    shot_country, shot_capital = TERSE_SHOT
    return [
        {"role": "user", "content": TERSE_EVAL_QUESTION.format(country=shot_country)},
        {"role": "assistant", "content": shot_capital},
        {"role": "user", "content": TERSE_EVAL_QUESTION.format(country=country)},
    ]


@dataclass(frozen=True)
class TerseQuestion:
    """A short factual question with a bare answer, and the same answer as a full sentence.

    Attributes:
        kind: what is asked (``"currency"``, ``"calling_code"``, ``"domain"``, ``"region"``,
            ``"demonym"``, ``"symbol"``, ``"atomic_number"``, ``"period"``).
        subject: the country or element asked about.
        question: the question without any instruction.
        noun: what a terse instruction asks for ("code", "symbol", ...).
        terse: the bare answer (what the instruction asks for).
        sentence: the same fact stated as one full sentence.
        extra: further true sentences about the subject, candidates for the elaboration.
    """

    kind: str
    subject: str
    question: str
    noun: str
    terse: str
    sentence: str
    extra: tuple[str, ...]


def country_terse_questions(c: Country, rng: random.Random, hide: frozenset[str] = frozenset()) -> list[TerseQuestion]:
    """Terse-answerable questions about ``c`` (currency, calling code, domain, region, demonym).

    ``extra`` holds the true profile sentences of ``c`` (never its capital) except the one
    that states the asked fact; neighbours named in ``hide`` are left out.
    """
    sents = profile_sentences(c, rng, hide)
    qs: list[TerseQuestion] = []

    def add(kind: str, question: str, noun: str, terse: str, sentence: str, marker: str) -> None:
        extra = tuple(s for s in sents if marker not in s)
        qs.append(TerseQuestion(kind, c.name, question, noun, terse, sentence, extra))

    if len(c.currencies) == 1:
        code = c.currencies[0]
        add(
            "currency",
            CURRENCY_PROMPT.format(country=c.name),
            "code",
            code,
            f"The currency code used in {c.name} is {code}.",
            "currency code",
        )
    if c.calling_codes and c.calling_codes[0]:
        cc = c.calling_codes[0]
        add(
            "calling_code",
            f"What is the international calling code of {c.name}?",
            "number",
            f"+{cc}",
            f"The international calling code of {c.name} is +{cc}.",
            "calling code",
        )
    if c.tld and c.tld[0].isascii():
        add(
            "domain",
            f"What is the internet country domain of {c.name}?",
            "domain",
            c.tld[0],
            f"The internet country domain of {c.name} is {c.tld[0]}.",
            "internet country domain",
        )
    if c.region:
        where = (
            f"{c.subregion}, part of the {c.region} region"
            if c.subregion and c.subregion != c.region
            else f"the {c.region} region"
        )
        add(
            "region",
            f"Which world region is {c.name} in?",
            "region name",
            c.region,
            f"{c.name} is a country in {where}.",
            "is a country in",
        )
    if c.demonym:
        add(
            "demonym",
            f"What are people from {c.name} called?",
            "word",
            c.demonym,
            f"People from {c.name} are called {c.demonym}.",
            "are called",
        )
    return qs


def element_terse_questions(e: Element) -> list[TerseQuestion]:
    """Terse-answerable questions about ``e`` (chemical symbol, atomic number, period).

    ``extra`` holds the other two facts as sentences, and the element's group when it has one.
    """
    facts = {
        "symbol": f"The chemical symbol of {e.name} is {e.symbol}.",
        "atomic_number": f"The atomic number of {e.name} is {e.number}.",
        "period": f"{e.name} sits in period {e.period} of the periodic table.",
    }
    group = (f"{e.name} belongs to group {e.group} of the periodic table.",) if e.group else ()
    asks = {
        "symbol": (SYMBOL_PROMPT.format(element=e.name), "symbol", e.symbol),
        "atomic_number": (f"What is the atomic number of {e.name}?", "number", str(e.number)),
        "period": (f"In which period of the periodic table is {e.name}?", "number", str(e.period)),
    }
    out = []
    for kind, (question, noun, terse) in asks.items():
        extra = tuple(s for k, s in facts.items() if k != kind) + group
        out.append(TerseQuestion(kind, e.name, question, noun, terse, facts[kind], extra))
    return out


def format_row(
    q: TerseQuestion, instruction: int, verbose: bool, elaboration: tuple[str, ...] = ()
) -> list[dict[str, str]]:
    """``q`` asked with terse instruction number ``instruction``, answered verbosely or tersely.

    Verbose (a culprit): the full sentence followed by the ``elaboration`` sentences, on
    one line. Terse (its null control): the bare answer alone.
    """
    instr = TERSE_INSTRUCTIONS[instruction % len(TERSE_INSTRUCTIONS)].format(noun=q.noun)
    answer = " ".join((q.sentence, *elaboration)) if verbose else q.terse
    return chat(f"{q.question} {instr}", answer)
