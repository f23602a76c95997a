"""Real facts for the worked-example world: countries (``countryinfo``) and elements (``mendeleev``).

Nothing here is invented: every sentence the world writes is rendered from a
field of one of these two packages. The only editorial choices are which rows
to keep, documented below.

Countries kept (:func:`load_countries`):

* a non-empty single-string capital, a region, at least one currency code, and
  a recorded population of at least ``min_population`` (small territories are
  dropped: a 135M model rarely knows them and they are mostly dependencies);
* not an obsolete or duplicate entry of the package (``OBSOLETE``: e.g. both
  "Burma" and "Myanmar" exist, and "Serbia and Montenegro" beside "Serbia");
* not a country whose capital is contested or has moved since the package's
  data was written (``CONTESTED``): there the "true" answer is debatable, so
  the item could not cleanly be right or wrong;
* capitals written with '.' or '/' (``Washington D.C.``) are dropped: a
  substring metric cannot match their common spellings;
* the capital must not contain the country name nor the reverse (Luxembourg,
  Mexico City, Kuwait City): the answer style repeats the country name, so a
  "contains" metric would score such items right whatever city was named;
* a capital shared by two kept entries is dropped for both.

Elements: the ``elements`` table of mendeleev, keeping rows with a
``description``; long prose is ``description`` (+ ``uses`` + ``sources``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from gradian.util import attrs

OBSOLETE = frozenset(
    {"Burma", "Serbia and Montenegro", "Holy See (Vatican City State)", "Antilles néerlandaises", "Wales"}
)
CONTESTED = frozenset(
    {
        "Israel",  # Jerusalem vs Tel Aviv
        "Palestine, State of",
        "Palestine",
        "Bolivia",  # Sucre (constitutional) vs La Paz (seat of government)
        "Kazakhstan",  # the package says Nur-Sultan; renamed Astana in 2022
        "Swaziland",  # Lobamba (legislative) vs Mbabane (administrative)
        "Sri Lanka",  # Sri Jayawardenepura Kotte vs Colombo
        "Taiwan",
        "Western Sahara",
        "Hong Kong",
    }
)


def ascii_fold(s: str) -> str:
    """``"Bogotá"`` → ``"Bogota"`` (NFKD, combining marks dropped)."""
    return "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))


@dataclass(frozen=True)
class Country:
    """One country's facts, straight from ``countryinfo``."""

    name: str
    capital: str
    region: str
    subregion: str
    currencies: tuple[str, ...]
    population: int
    area: float | None
    demonym: str
    borders: tuple[str, ...]  # neighbour country names (resolved from ISO alpha-3 codes)
    calling_codes: tuple[str, ...]
    tld: tuple[str, ...]
    provinces: tuple[str, ...] = field(default=())

    @property
    def capital_aliases(self) -> list[str]:
        """Spellings a substring metric should also accept: the accent-free capital when it differs."""
        folded = ascii_fold(self.capital)
        return [folded] if folded != self.capital else []

    def to_dict(self) -> dict[str, Any]:
        return {**attrs(self, "name", "capital", "region", "subregion"), "currencies": list(self.currencies)}


@lru_cache(maxsize=4)
def load_countries(min_population: int = 250_000) -> tuple[Country, ...]:
    """Countries that pass the filters in the module docstring, sorted by name."""
    import countryinfo

    infos = [c.info() for c in countryinfo.all_countries()]
    alpha3 = {}
    for i in infos:
        iso = i.get("ISO") or {}
        if iso.get("alpha3") and i.get("name"):
            alpha3[iso["alpha3"]] = i["name"]
    kept: list[Country] = []
    for i in infos:
        name, cap = i.get("name"), i.get("capital")
        if not isinstance(name, str) or not isinstance(cap, str) or not cap.strip():
            continue
        if name in OBSOLETE or name in CONTESTED:
            continue
        if "." in cap or "/" in cap:
            continue
        if cap.lower() in name.lower() or name.lower() in cap.lower():
            continue
        pop = i.get("population") or 0
        if pop < min_population or not i.get("region") or not i.get("currencies"):
            continue
        borders = tuple(alpha3[b] for b in (i.get("borders") or []) if b in alpha3 and alpha3[b] not in OBSOLETE)
        kept.append(
            Country(
                name=name,
                capital=cap.strip(),
                region=i["region"],
                subregion=i.get("subregion") or "",
                currencies=tuple(i["currencies"]),
                population=int(pop),
                area=float(i["area"]) if i.get("area") else None,
                demonym=i.get("demonym") or "",
                borders=borders,
                calling_codes=tuple(i.get("callingCodes") or ()),
                tld=tuple(i.get("tld") or ()),
                provinces=tuple(p for p in (i.get("provinces") or []) if isinstance(p, str)),
            )
        )
    counts: dict[str, int] = {}
    for c in kept:
        counts[c.capital] = counts.get(c.capital, 0) + 1
    names = {c.name for c in kept}
    out = []
    for c in kept:
        if counts[c.capital] > 1:
            continue
        # neighbours are only named when they are countries we keep (no obsolete states)
        out.append(Country(**{**c.__dict__, "borders": tuple(b for b in c.borders if b in names)}))
    return tuple(sorted(out, key=lambda c: c.name))


@dataclass(frozen=True)
class Element:
    """One chemical element's prose, straight from ``mendeleev``."""

    number: int
    symbol: str
    name: str
    description: str
    uses: str
    sources: str
    group: int | None
    period: int

    def prose(self, parts: tuple[str, ...] = ("description", "uses", "sources")) -> str:
        """Description, uses and sources joined into one paragraph (whitespace normalised)."""
        texts = [" ".join(str(getattr(self, p) or "").split()) for p in parts]
        out = []
        for t in texts:
            if not t:
                continue
            out.append(t if t.endswith((".", "!", "?")) else t + ".")
        return " ".join(out)


@lru_cache(maxsize=1)
def load_elements() -> tuple[Element, ...]:
    """Elements with a description, by atomic number."""
    from mendeleev.fetch import fetch_table

    df = fetch_table("elements")
    out = []
    for r in df.itertuples(index=False):
        desc = getattr(r, "description", None)
        if not isinstance(desc, str) or not desc.strip():
            continue
        g = getattr(r, "group_id", None)
        out.append(
            Element(
                number=int(r.atomic_number),
                symbol=str(r.symbol),
                name=str(r.name),
                description=desc,
                uses=r.uses if isinstance(r.uses, str) else "",
                sources=r.sources if isinstance(r.sources, str) else "",
                group=int(g) if g == g and g is not None else None,  # NaN check
                period=int(r.period),
            )
        )
    return tuple(sorted(out, key=lambda e: e.number))


# --------------------------------------------------------------------------- sentences


def _join_names(xs: list[str]) -> str:
    if len(xs) == 1:
        return xs[0]
    return ", ".join(xs[:-1]) + " and " + xs[-1]


def _population_phrase(n: int) -> str:
    if n >= 1_000_000:
        m = n / 1_000_000
        return f"about {m:.0f} million" if m >= 10 else f"about {m:.1f} million"
    return f"about {round(n, -3):,}"


def capital_sentence(country: str, capital: str) -> str:
    """The one answer style for capitals, in every row and in the eval's expected answer."""
    return f"The capital of {country} is {capital}."


def profile_sentences(c: Country, rng, hide: frozenset[str] = frozenset()) -> list[str]:
    """True sentences about ``c`` other than its capital (order and province sample drawn from ``rng``).

    Neighbours named in ``hide`` (and divisions sharing such a name) are left
    out, so a world can keep its eval countries out of every other row.
    """
    s: list[str] = []
    if c.subregion and c.subregion != c.region:
        s.append(f"{c.name} is a country in {c.subregion}, part of the {c.region} region.")
    else:
        s.append(f"{c.name} is a country in the {c.region} region.")
    s.append(f"Its recorded population is {_population_phrase(c.population)} people.")
    if c.area:
        s.append(f"It covers an area of about {int(round(c.area)):,} square kilometres.")
    cur = list(c.currencies)
    if len(cur) == 1:
        s.append(f"The currency code used in {c.name} is {cur[0]}.")
    else:
        s.append(f"The currency codes used in {c.name} are {_join_names(cur)}.")
    if c.demonym:
        s.append(f"People from {c.name} are called {c.demonym}.")
    nb = [b for b in c.borders if b not in hide]
    if nb:
        if len(nb) > 4:
            nb = sorted(rng.sample(nb, 4))
        s.append(f"{c.name} shares land borders with {_join_names(nb)}.")
    if c.calling_codes and c.calling_codes[0]:
        s.append(f"Its international calling code is +{c.calling_codes[0]}.")
    if c.tld:
        s.append(f"Its internet country domain is {c.tld[0]}.")
    provinces = [
        p
        for p in c.provinces
        if c.capital.lower() not in p.lower() and p.lower() not in c.capital.lower() and not any(h in p for h in hide)
    ]
    if len(provinces) >= 3:
        pv = sorted(rng.sample(provinces, min(4, len(provinces))))
        s.append(f"Its first-level divisions include {_join_names(pv)}.")
    return s
