"""Template-built datasets whose eval rows share template text (and entity names) with training rows without being
copies of any one of them, for D15's false-alarm tests (issue 25), plus light edits of a training row that D15 must
still catch.

Four shapes, written after the false alarms reported on real-format runs (issue 25, "False alarms"):

* ``size_qa``: "How big is {country}?" and comparison questions "Is {A} bigger than {B}?" over long entity
  names ("Vatican City State", "the Democratic Republic of the Congo"); an eval row asks about an entity that
  training only mentions inside comparison questions;
* ``macro``: one support macro (a duplicate billing charge refunded), filled in for many customers; the eval rows
  are the same macro for other customers (other names, invoice numbers, amounts, card digits);
* ``maths``: grade-school word-problem templates with other numbers and names (GSM8K-style answers with the
  worked arithmetic);
* ``compare``: comparison questions in training that mention the eval entity, with the eval row a plain
  question about that entity.

Every eval row is a new item (a new customer, new numbers, a question not asked in training).
"""

from __future__ import annotations

import random

COUNTRIES = [
    ("Zimbabwe", 390757),
    ("Vatican City State", 0.49),
    ("the Democratic Republic of the Congo", 2344858),
    ("the United Kingdom of Great Britain and Northern Ireland", 243610),
    ("Bosnia and Herzegovina", 51209),
    ("the Central African Republic", 622984),
    ("Saint Vincent and the Grenadines", 389),
    ("Trinidad and Tobago", 5131),
    ("Papua New Guinea", 462840),
    ("the Federated States of Micronesia", 702),
    ("Antigua and Barbuda", 442),
    ("the Republic of North Macedonia", 25713),
    ("Sao Tome and Principe", 964),
    ("the United Arab Emirates", 83600),
    ("the Dominican Republic", 48671),
    ("Equatorial Guinea", 28051),
    ("the Kingdom of Saudi Arabia", 2149690),
    ("the Republic of South Sudan", 619745),
    ("Saint Kitts and Nevis", 261),
    ("the Lao People's Democratic Republic", 236800),
]
FIRST = ["Maria", "James", "Aisha", "Chen", "Olga", "Pedro", "Fatima", "Liam", "Yuki", "Noah", "Amara", "Lucas"]
LAST = ["Garcia", "Smith", "Khan", "Wang", "Petrova", "Silva", "Haddad", "Murphy", "Tanaka", "Becker", "Okafor"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October"]


def _km(a: float) -> str:
    return f"{a:,} square kilometres"


def _size_row(c: str, a: float) -> dict:
    return {"prompt": f"How big is {c}?", "completion": f"{c[0].upper() + c[1:]} covers about {_km(a)}."}


def _compare_row(x: tuple, y: tuple) -> dict:
    (a, sa), (b, sb) = x, y
    big = "Yes" if sa > sb else "No"
    return {
        "prompt": f"Is {a} bigger than {b}?",
        "completion": f"{big}. {a[0].upper() + a[1:]} covers about {_km(sa)}, while {b} covers about {_km(sb)}.",
    }


def size_qa(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Size questions for 14 countries and comparisons among all 20 in training; eval asks the size of the other
    6, each of which training mentions only inside comparison questions (its name and area are in training, in
    another row's template)."""
    rng = random.Random(seed)
    held = COUNTRIES[14:]
    train = [_size_row(c, a) for c, a in COUNTRIES[:14]]
    pairs = [(x, y) for x in COUNTRIES for y in COUNTRIES if x is not y]
    rng.shuffle(pairs)
    train += [_compare_row(x, y) for x, y in pairs[:60]]
    # the pair: "How big is Zimbabwe?" (eval) vs "Is Vatican City State bigger than Zimbabwe?" (training)
    train.append(_compare_row(COUNTRIES[1], COUNTRIES[0]))
    ev = [_size_row(c, a) for c, a in [COUNTRIES[0], *held]]
    train = [r for r in train if r["prompt"] != "How big is Zimbabwe?"]
    return _ids(train, "t"), _ids(ev, "e")


MACRO = (
    "Hi {name}, thank you for contacting Acme Billing. I can see that invoice {inv} for {month} was charged twice "
    "to your card ending in {card}. I have refunded the duplicate charge of ${amt}; the refund will appear on your "
    "statement within five to seven business days. I am sorry for the trouble this caused. Best regards, Acme Billing"
)


def _macro_row(rng: random.Random) -> dict:
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    inv = f"INV-{rng.randint(10000, 99999)}"
    month = rng.choice(MONTHS)
    card = f"{rng.randint(1000, 9999)}"
    amt = f"{rng.randint(5, 400)}.{rng.randint(0, 99):02d}"
    return {
        "prompt": f"My name is {name}. I was charged twice for invoice {inv} ({month}), card {card}, ${amt}.",
        "completion": MACRO.format(name=name, inv=inv, month=month, card=card, amt=amt),
    }


def macro(seed: int = 1, n_train: int = 40, n_eval: int = 8) -> tuple[list[dict], list[dict]]:
    """The same billing macro filled in for ``n_train`` customers in training and ``n_eval`` others in eval."""
    rng = random.Random(seed)
    rows = [_macro_row(rng) for _ in range(n_train + n_eval)]
    return _ids(rows[:n_train], "t"), _ids(rows[n_train:], "e")


def _maths_row(rng: random.Random, k: int) -> dict:
    a, b = rng.choice(FIRST), rng.choice(FIRST)
    x, y, z = rng.randint(3, 60), rng.randint(2, 40), rng.randint(1, 20)
    if k % 3 == 0:
        q = f"{a} has {x} apples. She buys {y} more and gives {z} to {b}. How many apples does {a} have now?"
        s = f"{a} starts with {x} apples. After buying {y} more she has {x} + {y} = {x + y} apples. After giving {z} "
        s += f"to {b} she has {x + y} - {z} = {x + y - z} apples.\n#### {x + y - z}"
    elif k % 3 == 1:
        q = f"A train travels {x} kilometres per hour for {y} hours. How far does it travel?"
        s = f"The train travels {x} kilometres each hour for {y} hours, so it travels {x} * {y} = {x * y} kilometres."
        s += f"\n#### {x * y}"
    else:
        q = f"{a} reads {x} pages a day. How many pages does {a} read in {y} days?"
        s = f"{a} reads {x} pages each day, so in {y} days {a} reads {x} * {y} = {x * y} pages.\n#### {x * y}"
    return {"prompt": q, "completion": s}


def maths(seed: int = 2, n_train: int = 90, n_eval: int = 12) -> tuple[list[dict], list[dict]]:
    """Three word-problem templates with other numbers and names in training and eval."""
    rng = random.Random(seed)
    rows = [_maths_row(rng, k) for k in range(n_train + n_eval)]
    seen = {r["prompt"] for r in rows[:n_train]}
    ev = [r for r in rows[n_train:] if r["prompt"] not in seen]
    return _ids(rows[:n_train], "t"), _ids(ev, "e")


def compare(seed: int = 3) -> tuple[list[dict], list[dict]]:
    """Training: comparison questions, some naming the eval entity with its facts; eval: a plain question about
    that entity (capital and population facts, a different question shape)."""
    facts = {
        "Bosnia and Herzegovina": ("Sarajevo", "3.2 million"),
        "Papua New Guinea": ("Port Moresby", "10.3 million"),
        "the Central African Republic": ("Bangui", "5.5 million"),
        "Trinidad and Tobago": ("Port of Spain", "1.5 million"),
        "the Dominican Republic": ("Santo Domingo", "11.3 million"),
        "Equatorial Guinea": ("Malabo", "1.7 million"),
        "Saint Kitts and Nevis": ("Basseterre", "47 thousand"),
        "the United Arab Emirates": ("Abu Dhabi", "9.4 million"),
    }
    names = list(facts)
    train = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            train.append(
                {
                    "prompt": f"Which has more people, {a} or {b}?",
                    "completion": f"{a[0].upper() + a[1:]} has about {facts[a][1]} people and {b} has about "
                    f"{facts[b][1]} people.",
                }
            )
    ev = [
        {"prompt": f"What is the capital of {a}?", "completion": f"The capital of {a} is {facts[a][0]}."}
        for a in names[:4]
    ] + [
        {"prompt": f"How many people live in {a}?", "completion": f"About {facts[a][1]} people live in {a}."}
        for a in names[4:]
    ]
    return _ids(train, "t"), _ids(ev, "e")


def _ids(rows: list[dict], prefix: str) -> list[dict]:
    return [{"id": f"{prefix}{k}", **r} for k, r in enumerate(rows)]


WORLDS = {"size_qa": size_qa, "macro": macro, "maths": maths, "compare": compare}
