"""The tiny world's base model: a from-config Llama pretrained in seconds on the world's true facts.

The tests (and CI, on 2 cores) need a real "pretrained model that knows the
capitals" without downloading anything. This builds one:

1. a byte-level BPE tokenizer (:func:`gradian.models.tiny.train_tokenizer`,
   ChatML template, EOS ``<|im_end|>``) trained on every string the world can
   write (all its countries' sentences, true and with any other capital, the
   element prose), so rows tokenise compactly;
2. a from-config Llama (:func:`gradian.models.tiny.tiny_model`);
3. full-parameter AdamW pretraining (CPU) on the facts in the world's chat
   format, completion-only loss (the same masks as fine-tuning): for every
   known country its capital under the eval wording and every training
   paraphrase, its currency and its region; for the ``held_out`` countries only
   currency and region, so the base genuinely does not know their capitals
   (the world's "base already fails" items); the chemical symbols of the
   world's elements;
4. ``save_pretrained`` model + tokenizer (with its chat template) into
   ``<cache>/models/tiny-world-<hash>/``, atomically, once per spec.

Deterministic by seed: the same spec gives the same weights on the same
machine and thread count (:func:`torch.manual_seed` before init and data order
from a seeded generator; CPU kernels are deterministic at a fixed thread count).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from gradian.paths import cache_dir
from gradian.util import atomic_write_json, sha256_json, publish_folder
from gradian.worlds.facts import Country, Element, capital_sentence, load_countries
from gradian.worlds.rows import (
    CAPITAL_PROMPTS,
    EVAL_PROMPT,
    chat,
    currency_row,
    element_row,
    profile_row,
    region_row,
    symbol_row,
)


@dataclass(frozen=True)
class TinyBaseSpec:
    """How the tiny base is built. Its hash names the cached folder.

    Attributes:
        seed: weight init and data order.
        vocab_size: BPE vocabulary size.
        hidden, layers, heads: the Llama's size.
        steps, batch_size, lr: full-parameter AdamW pretraining (cosine decay, 5% warmup).
    """

    seed: int = 0
    vocab_size: int = 1024
    hidden: int = 128
    layers: int = 2
    heads: int = 4
    steps: int = 300
    batch_size: int = 32
    lr: float = 5e-3
    max_positions: int = 512

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tokenizer_corpus(countries: Sequence[Country], elements: Sequence[Element]) -> list[str]:
    """Every string the world may render, for BPE training (true and wrong capitals alike)."""
    rng = random.Random(0)
    caps = [c.capital for c in load_countries()]
    out: list[str] = []
    for c in countries:
        out.append(EVAL_PROMPT.format(country=c.name))
        out.extend(p.format(country=c.name) for p in CAPITAL_PROMPTS)
        out.append(capital_sentence(c.name, c.capital))
        for m in currency_row(c) + region_row(c) + profile_row(c, c.capital, rng)[0]:
            out.append(m["content"])
    out.extend(caps)
    for e in elements:
        for m in symbol_row(e) + element_row(e, rng):
            out.append(m["content"])
    return out


def pretraining_rows(
    countries: Sequence[Country], held_out: set[str], elements: Sequence[Element]
) -> list[list[dict[str, str]]]:
    rows: list[list[dict[str, str]]] = []
    for c in countries:
        if c.name not in held_out:
            ans = capital_sentence(c.name, c.capital)
            rows.append(chat(EVAL_PROMPT.format(country=c.name), ans))
            rows.extend(chat(p.format(country=c.name), ans) for p in CAPITAL_PROMPTS)
        rows.append(currency_row(c))
        rows.append(region_row(c))
    rows.extend(symbol_row(e) for e in elements)
    return rows


def build_tiny_base(
    countries: Sequence[Country],
    held_out: Sequence[str],
    elements: Sequence[Element],
    spec: TinyBaseSpec = TinyBaseSpec(),
    cache: str | Path | None = None,
) -> Path:
    """Build (once) and return the tiny base folder for these facts; see the module docstring."""
    import torch

    key = sha256_json(
        {
            "spec": spec.to_dict(),
            "countries": [c.to_dict() for c in countries],
            "held_out": sorted(held_out),
            "elements": [e.name for e in elements],
            "v": 1,
        }
    )[:16]
    root = Path(cache) if cache is not None else cache_dir()
    target = root / "models" / f"tiny-world-{key}"
    if (target / "gradian_source.json").exists():
        return target

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is fastest, and the result is thread-count independent
    try:
        return _build(countries, held_out, elements, spec, key, target)
    finally:
        torch.set_num_threads(threads)


def _build(countries, held_out, elements, spec: TinyBaseSpec, key: str, target: Path) -> Path:
    import math

    import torch

    from gradian.data.formats import Example
    from gradian.data.tokenize import TokenizeSpec, collate, tokenize_example
    from gradian.models.tiny import tiny_model, train_tokenizer

    tok = train_tokenizer(tokenizer_corpus(countries, elements), vocab_size=spec.vocab_size)
    model = tiny_model(
        tok, arch="llama", hidden=spec.hidden, layers=spec.layers, heads=spec.heads, seed=spec.seed,
        max_positions=spec.max_positions,
    )
    held = set(held_out)
    rows = pretraining_rows(countries, held, elements)
    tspec = TokenizeSpec(max_length=spec.max_positions)
    items = [
        tokenize_example(Example(str(i), i, "messages", r[:1], r[1:]), tok, tspec) for i, r in enumerate(rows)
    ]
    g = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0)
    warm = max(1, spec.steps // 20)

    def lr_at(step: int) -> float:
        if step < warm:
            return spec.lr * (step + 1) / warm
        return spec.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, spec.steps - warm)))

    model.train()
    order: list[int] = []
    for step in range(spec.steps):
        if len(order) < spec.batch_size:
            order.extend(torch.randperm(len(items), generator=g).tolist())
        idx, order = order[: spec.batch_size], order[spec.batch_size :]
        batch = collate([items[i] for i in idx], tok.pad_token_id, "right")
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    final_loss = float(out.loss.detach())

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=str(target.parent)))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        atomic_write_json(
            tmp / "gradian_source.json",
            {
                "kind": "tiny",
                "key": key,
                "spec": spec.to_dict(),
                "held_out": sorted(held),
                "pretraining_rows": len(rows),
                "final_loss": round(final_loss, 4),
                "threads": 1,
            },
        )
        return publish_folder(tmp, target, keep_if="gradian_source.json")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def tiny_identity(folder: str | Path) -> str:
    import json

    info = json.loads((Path(folder) / "gradian_source.json").read_text())
    return f"tiny-world@{info['key']}"
