"""Healthy datasets built from templates, for D15 (near-copies of eval rows), and light paraphrases of
training rows planted in their eval sets.

Three shapes that share a lot of text across rows without any eval row being a copy of a training row:

* ``support``: customer-support tickets answered with recombined macros (greeting, policy and closing
  sentences reused across tickets; some pairs of macros usually come together), plus the ticket's own
  details (name, order number, product, what happened, what was done);
* ``qa``: geography/institution QA whose rows repeat long entity names ("the Democratic Republic of the
  Congo", "the United Kingdom of Great Britain and Northern Ireland") inside a few prompt templates, each
  entity asked several questions;
* ``chat``: conversations under one long shared system prompt, users opening with a handful of stock
  phrases, then their own question.

Each world splits into train and eval by held-out items (an eval row is a ticket, question or conversation
that is not in training). :func:`paraphrase` makes a light paraphrase of a row (about one word in nine
swapped for a synonym, a filler word dropped), the near-copy D15 must still catch.
"""

from __future__ import annotations

import random

FIRST = [
    "Maria",
    "James",
    "Aisha",
    "Chen",
    "Olga",
    "Pedro",
    "Fatima",
    "Liam",
    "Yuki",
    "Noah",
    "Amara",
    "Lucas",
    "Ingrid",
    "Ravi",
    "Sofia",
    "Mateo",
    "Hana",
    "Omar",
    "Elena",
    "Kwame",
    "Zara",
    "Tomas",
    "Leila",
    "Arjun",
    "Nina",
    "Diego",
    "Mei",
    "Jonas",
    "Priya",
    "Ivan",
]
LAST = [
    "Garcia",
    "Smith",
    "Khan",
    "Wang",
    "Ivanova",
    "Santos",
    "Haddad",
    "Murphy",
    "Tanaka",
    "Brown",
    "Okafor",
    "Silva",
    "Larsen",
    "Patel",
    "Rossi",
    "Lopez",
    "Kim",
    "Farouk",
    "Petrova",
    "Mensah",
    "Ahmed",
    "Novak",
    "Karimi",
    "Sharma",
    "Weber",
    "Torres",
    "Lin",
    "Schmidt",
    "Iyer",
    "Popov",
]
PRODUCTS = [
    "wireless headphones",
    "standing desk",
    "espresso machine",
    "hiking backpack",
    "smart thermostat",
    "robot vacuum",
    "electric kettle",
    "office chair",
    "yoga mat",
    "bluetooth speaker",
    "air purifier",
    "cast iron skillet",
    "mechanical keyboard",
    "baby monitor",
    "winter jacket",
    "water filter",
    "camping tent",
    "desk lamp",
    "running shoes",
    "phone case",
]
PROBLEMS = [
    ("arrived with a cracked {part}", "replacement", "I have arranged a replacement {product} that ships today"),
    ("stopped working after {days} days", "repair", "I have opened a repair case for your {product}"),
    ("was charged twice on my card", "refund", "I have refunded the duplicate charge of {amount} dollars"),
    (
        "never arrived even though tracking says delivered",
        "investigation",
        "I have asked the courier to investigate the delivery of your {product}",
    ),
    ("is missing the {part}", "missing part", "I have sent the missing {part} separately at no cost"),
    ("is the wrong colour", "exchange", "I have started an exchange for the {product} in the colour you ordered"),
    ("makes a loud rattling noise", "repair", "I have booked a technician visit for your {product}"),
    ("came without the manual", "document", "I have emailed you the manual for the {product}"),
]
PARTS = [
    "lid",
    "power cable",
    "handle",
    "base plate",
    "remote control",
    "charging dock",
    "side panel",
    "strap",
    "filter cartridge",
    "mounting bracket",
]
GREETINGS = [
    "Thank you for contacting Acme Support.",
    "Thanks for reaching out to us, and sorry for the trouble.",
    "I'm sorry to hear that your order did not go as planned.",
    "Thank you for your patience while we looked into this.",
]
POLICY_PAIRS = [  # macros that usually come together, in this order
    (
        "Refunds are processed within five to seven business days after we receive the item back.",
        "Please keep the original packaging until the return has been completed.",
    ),
    (
        "You can track the status of your case at any time from the Orders page in your account.",
        "We will send you an email as soon as anything changes.",
    ),
    (
        "Our warranty covers manufacturing defects for two full years from the date of delivery.",
        "Accidental damage is not included in the standard warranty.",
    ),
]
POLICIES = [
    "If the courier needs a signature, someone will have to be at home to receive the parcel.",
    "Replacement items ship by standard delivery and usually arrive within three business days.",
    "A prepaid return label is attached to this message for your convenience.",
    "Please do not send the item back before you receive the return label.",
    "Our support team is available every day from eight in the morning until eight in the evening.",
]
CLOSINGS = [
    "Is there anything else I can help you with today?",
    "Please let us know if there is anything else we can do for you.",
    "We appreciate your business and hope you enjoy your purchase.",
]
SIGNOFF = "Best regards,\nThe Acme Support Team"


def support_rows(n: int, seed: int, id_prefix: str) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    # order numbers are unique ids: train and eval draw from disjoint ranges
    orders = rng.sample(range(100000 + 400000 * (seed % 2), 500000 + 400000 * (seed % 2)), n)
    for k in range(n):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        product = rng.choice(PRODUCTS)
        problem, kind, action = rng.choice(PROBLEMS)
        part = rng.choice(PARTS)
        order = orders[k]
        fill = {"part": part, "days": rng.randint(2, 40), "amount": rng.randint(19, 480), "product": product}
        prompt = (
            f"Customer: {first} {last}\nOrder: #{order}\nProduct: {product}\n"
            f"Message: Hello, the {product} I bought {problem.format(**fill)}. "
            f"I would like a {kind}, please. Order number {order}."
        )
        body = [
            f"Hi {first},",
            rng.choice(GREETINGS),
            action.format(**fill) + f" (case {order}-{rng.randint(10, 99)}).",
        ]
        for pair in rng.sample(POLICY_PAIRS, rng.randint(1, 2)):
            body += list(pair)
        body += rng.sample(POLICIES, rng.randint(1, 2))
        body.append(rng.choice(CLOSINGS))
        rows.append({"id": f"{id_prefix}{k:04d}", "prompt": prompt, "completion": " ".join(body) + "\n" + SIGNOFF})
    return rows


# ---------------------------------------------------------------------- QA with long entity names
COUNTRIES = [
    "the Democratic Republic of the Congo",
    "the United Kingdom of Great Britain and Northern Ireland",
    "the Federated States of Micronesia",
    "the Lao People's Democratic Republic",
    "Saint Vincent and the Grenadines",
    "Bosnia and Herzegovina",
    "the Republic of the Marshall Islands",
    "the Democratic Socialist Republic of Sri Lanka",
    "the United Republic of Tanzania",
    "the Islamic Republic of Mauritania",
    "the Kingdom of Saudi Arabia",
    "the Plurinational State of Bolivia",
    "the Bolivarian Republic of Venezuela",
    "the Central African Republic",
    "the Independent State of Papua New Guinea",
    "the Republic of Trinidad and Tobago",
    "the Co-operative Republic of Guyana",
    "the Federal Democratic Republic of Ethiopia",
    "the Hashemite Kingdom of Jordan",
    "the Kingdom of the Netherlands",
    "the Grand Duchy of Luxembourg",
    "the Principality of Liechtenstein",
    "the Democratic Republic of Timor-Leste",
    "the Republic of North Macedonia",
    "Antigua and Barbuda",
    "Saint Kitts and Nevis",
    "the Commonwealth of the Bahamas",
    "the Sultanate of Oman",
    "the State of Eritrea",
    "the Union of the Comoros",
]
INSTITUTIONS = [
    f"the {a} {b} of {c}"
    for a in ("National", "Royal", "Federal", "Municipal")
    for b in ("Museum of Natural History", "Botanic Garden", "Library and Archives", "Academy of Sciences")
    for c in ("Lisbon", "Oslo", "Nairobi", "Montevideo", "Hanoi")
]
ATTRS_COUNTRY = [
    "capital city",
    "official currency",
    "most widely spoken language",
    "highest mountain",
    "longest river",
    "national day",
    "international calling code",
    "largest port",
    "head of state title",
]
ATTRS_INST = [
    "founding year",
    "current director",
    "most visited exhibit",
    "street address",
    "annual budget",
    "number of staff",
    "oldest collection",
    "sister institution",
    "opening hours",
]
TEMPLATES = [
    "You are a careful reference assistant. Answer in one sentence.\nTopic: {e}\nQuestion: what is the {a} of {e}?",
    "Answer briefly. Tell me about {e}: what is its {a}?",
    "Question about {e}. What is the {a}?",
]
SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ren",
    "sa",
    "tu",
    "vel",
    "do",
    "ra",
    "ni",
    "bo",
    "ze",
    "an",
    "qui",
    "mar",
    "tel",
    "os",
    "pe",
    "lu",
    "gri",
]
CLAUSES = [
    "records kept by {name} {name2} go back to {year}",
    "the {name} survey confirmed it in {year}, led by {name2}",
    "about {num} percent of residents of {name} name it first",
    "it changed once, in {year}, after the {name} reform of {name2}",
    "the {name} commission under {name2} reviews it every {num} years",
    "it was first described by {name} {name2} in {year}",
]


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(3, 4))).capitalize()


def _answer(e: str, a: str, seed: int) -> str:
    """A specific answer for (entity, attribute): invented names and numbers, so no two facts share a value."""
    rng = random.Random(seed)
    clause = rng.choice(CLAUSES).format(
        year=rng.randint(1700, 2020), name=_name(rng), name2=_name(rng), num=rng.randint(2, 95)
    )
    return f"The {a} of {e} is {_name(rng)} {_name(rng)}; {clause}."


def qa_rows(seed: int, per_entity: int, id_prefix: str, held_out: bool) -> list[dict]:
    """Each entity asked ``per_entity`` questions (train), or one other question (``held_out``: eval)."""
    rng = random.Random(seed)
    rows = []
    for ei, e in enumerate(COUNTRIES + INSTITUTIONS):
        attrs = ATTRS_COUNTRY if ei < len(COUNTRIES) else ATTRS_INST
        order = random.Random(ei).sample(attrs, len(attrs))  # the same split of questions for train and eval
        chosen = order[per_entity : per_entity + 1] if held_out else order[:per_entity]
        for a in chosen:
            t = rng.choice(TEMPLATES)
            rows.append(
                {
                    "id": f"{id_prefix}{len(rows):04d}",
                    "prompt": t.format(e=e, a=a),
                    "completion": _answer(e, a, seed=ei * 100 + attrs.index(a)),
                }
            )
    return rows


# ---------------------------------------------------------------------- chat under a shared system prompt
SYSTEM = (
    "You are Nimbus, the virtual assistant of Nimbus Cloud Storage. Be friendly, concise and accurate. "
    "Never ask for a password or a full card number. If you are not sure of an answer, say so and offer to "
    "connect the user with a human agent. Answer in the language of the user."
)
OPENERS = [
    "Hi, I have a question about my account.",
    "Hello there, quick question.",
    "Good morning, I need some help.",
    "Hey, something is not working for me.",
    "Hi, I hope you can help me with this.",
]
TOPICS = [
    (
        "share a folder with {n} colleagues",
        "Open the folder, choose Share, and add the {n} email addresses; each colleague receives an invitation link.",
    ),
    (
        "restore a file I deleted {n} days ago",
        "Deleted files stay in the Bin for thirty days, so a file deleted {n} "
        "days ago can be restored from the Bin with Restore.",
    ),
    (
        "upgrade to the {plan} plan",
        "Go to Settings, then Billing, and pick {plan}; the price difference is charged "
        "pro rata for the current month.",
    ),
    (
        "turn on two-step verification on my {device}",
        "In Settings under Security, enable two-step verification and "
        "scan the code with the authenticator app on your {device}.",
    ),
    (
        "stop the sync on my {device} using mobile data",
        "On your {device}, open Preferences and switch off Sync over mobile data; syncing then waits for Wi-Fi.",
    ),
    (
        "find out why my storage shows {n} GB used",
        "Storage includes the Bin and old file versions; emptying the Bin "
        "and pruning versions usually frees part of the {n} GB.",
    ),
    (
        "change the email address of my {plan} account",
        "Under Profile, choose Change email; we send a confirmation link to the new address of your {plan} account.",
    ),
]
PLANS = ["Basic", "Plus", "Family", "Business", "Pro"]
DEVICES = ["laptop", "phone", "tablet", "work computer", "Chromebook"]


FILES = [
    "budget",
    "roadmap",
    "invoices",
    "holiday photos",
    "thesis draft",
    "client contracts",
    "tax return",
    "wedding video",
    "lecture notes",
    "design mockups",
]


def chat_rows(n: int, seed: int, id_prefix: str) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for k in range(n):
        q, a = rng.choice(TOPICS)
        fill = {"n": rng.randint(2, 29), "plan": rng.choice(PLANS), "device": rng.choice(DEVICES)}
        name = rng.choice(FIRST)
        thing = (
            f"{rng.choice(FILES)} {rng.choice(['folder', 'file', 'archive'])} {_name(rng)} {rng.randint(2015, 2025)}"
        )
        who = f"{rng.choice(FIRST)} {_name(rng)}"
        user = (
            f"{rng.choice(OPENERS)} My name is {name}. How do I {q.format(**fill)}? "
            f"It is about my {thing}, which {who} from the {_name(rng)} office also uses."
        )
        reply = (
            f"Hi {name}! {a.format(**fill)} For your {thing}, the same steps apply, and {who} keeps access. "
            f"Ticket {rng.randint(1000, 9999)}-{_name(rng)} has the details if you need them."
        )
        rows.append(
            {
                "id": f"{id_prefix}{k:04d}",
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": user},
                    {"role": "assistant", "content": reply},
                ],
            }
        )
    return rows


# ---------------------------------------------------------------------- worlds and paraphrases
SYNONYMS = {
    "arranged": "organised",
    "replacement": "substitute",
    "ships": "goes out",
    "today": "this afternoon",
    "processed": "handled",
    "receive": "get",
    "original": "initial",
    "completed": "finished",
    "status": "progress",
    "anything": "something",
    "warranty": "guarantee",
    "covers": "includes",
    "help": "assist",
    "sorry": "sad",
    "trouble": "problem",
    "opened": "created",
    "refunded": "returned",
    "sent": "posted",
    "separately": "apart",
    "what": "which",
    "tell": "inform",
    "careful": "precise",
    "briefly": "shortly",
    "question": "query",
    "folder": "directory",
    "colleagues": "coworkers",
    "choose": "select",
    "restore": "recover",
    "deleted": "removed",
    "open": "launch",
    "switch": "turn",
    "confirmation": "verification",
    "usually": "normally",
    "price": "cost",
    "invitation": "invite",
    "details": "information",
    "would": "could",
    "bought": "purchased",
    "like": "want",
    "hello": "hi",
    "please": "kindly",
    "number": "no.",
    "message": "note",
    "email": "mail",
    "hope": "trust",
}


def paraphrase(row: dict, rng: random.Random) -> dict:
    """A light paraphrase: every word with a synonym here is swapped with probability 1/3, capped at one
    swap in nine words; chat rows keep their roles and system prompt."""

    def one(w: str) -> str:
        core = w.strip(".,?!:;").lower()
        rep = SYNONYMS[core]
        return w.lower().replace(core, rep) if w[:1].islower() else w.replace(w.strip(".,?!:;"), rep.capitalize())

    def swap(text: str) -> str:
        words = text.split(" ")
        budget = max(1, len(words) // 9)
        out = []
        for w in words:
            if budget and w.strip(".,?!:;").lower() in SYNONYMS and rng.random() < 1 / 3:
                out.append(one(w))
                budget -= 1
            else:
                out.append(w)
        if out == words:  # always change something: a verbatim copy is D14's, not D15's
            k = next((k for k, w in enumerate(words) if w.strip(".,?!:;").lower() in SYNONYMS), None)
            if k is not None:
                out[k] = one(words[k])
            elif "the" in words:
                out.remove("the")
            else:
                out.append("thanks")
        return " ".join(out)

    new = {k: v for k, v in row.items()}
    if "messages" in row:
        new["messages"] = [
            dict(m, content=swap(m["content"]) if m["role"] != "system" else m["content"]) for m in row["messages"]
        ]
    else:
        new["prompt"] = swap(row["prompt"])
        new["completion"] = swap(row["completion"])
    return new


def world(kind: str) -> tuple[list[dict], list[dict]]:
    """``(train rows, eval rows)`` of a healthy world: no eval row is a copy of a training row."""
    if kind == "support":
        return support_rows(1500, seed=1, id_prefix="t"), support_rows(80, seed=2, id_prefix="e")
    if kind == "qa":
        return qa_rows(seed=3, per_entity=6, id_prefix="t", held_out=False), qa_rows(
            seed=4, per_entity=6, id_prefix="e", held_out=True
        )
    if kind == "chat":
        return chat_rows(1500, seed=5, id_prefix="t"), chat_rows(80, seed=6, id_prefix="e")
    raise ValueError(kind)


def with_paraphrases(kind: str, k: int = 8, seed: int = 7) -> tuple[list[dict], list[dict], list[tuple[str, str]]]:
    """The world, plus ``k`` light paraphrases of training rows appended to its eval set.

    Returns ``(train, eval, [(eval id, source training id)])``.
    """
    train, ev = world(kind)
    rng = random.Random(seed)
    planted = []
    for src in rng.sample(train, k):
        p = paraphrase(src, rng)
        p["id"] = f"para-{src['id']}"
        ev.append(p)
        planted.append((p["id"], src["id"]))
    return train, ev, planted
