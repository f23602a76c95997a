"""The tiny worlds: one factory for every from-config model the tests and ``gradian world --kind tiny`` train.

The tests (and CI, on 2 cores) need real "pretrained models that know some
facts" and real LoRA fine-tunes of them without downloading anything. Every
one of them is built here, with one training loop:

* :func:`fit`: the training loop (seeded batches, Adam/AdamW, a learning-rate
  schedule, optional clipping, trainer-style logs and checkpoints), with what
  the worlds differ in as a :class:`FitSpec`;
* :func:`tiny_base`: a from-config Llama or GPT-2 (:func:`gradian.models.tiny.tiny_model`,
  sized to a tokenizer trained in-process by :func:`gradian.models.tiny.train_tokenizer`)
  pretrained with :func:`fit`;
* :func:`tiny_lora`: a PEFT LoRA adapter on a copy of such a base, seeded;
* :func:`tokenize_rows`: training rows (any format) to tokens, as fine-tuning sees them.

The worked example's tiny world (``gradian world --kind tiny``) builds its base
with :func:`build_tiny_base`:

1. a byte-level BPE tokenizer (ChatML template, EOS ``<|im_end|>``) trained on
   every string the world can write (all its countries' sentences, true and with
   any other capital, the element prose), so rows tokenise compactly;
2. a from-config Llama;
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

import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from gradian.paths import cache_dir
from gradian.util import attrs, publish_pretrained, sha256_json
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
class FitSpec:
    """One run of the tiny worlds' training loop (:func:`fit`).

    Attributes:
        steps: optimizer steps.
        lr: peak learning rate.
        batch_size: rows per step; ``None``: every row at every step (full batch).
        shuffle: batches follow seeded permutations of the rows (``torch.randperm`` with a generator
            seeded by ``seed``, a fresh permutation whenever fewer than ``batch_size`` rows are left);
            otherwise the rows in order.
        seed: the permutation generator's seed.
        schedule: learning rate at step s = 0..steps-1: ``"constant"`` lr; ``"linear"``
            lr·(1 − s/steps); ``"cosine"`` linear warmup over w = max(1, steps // 20) steps, lr·(s+1)/w,
            then lr·½·(1 + cos(π (s − w)/(steps − w))).
        optimizer: ``"adam"``, or ``"adamw"`` (weight decay 0).
        clip: clip the global gradient norm to this; ``None``: no clipping.
        loss: ``"rows"``: the mean over the batch's rows of each row's mean supervised-token
            cross-entropy (:func:`gradian.gradients.loss.per_example_loss`); ``"tokens"``: the model's
            own loss (``labels=``), the mean over every supervised token of the batch.
    """

    steps: int
    lr: float
    batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    optimizer: Literal["adam", "adamw"] = "adam"
    clip: float | None = None
    loss: Literal["rows", "tokens"] = "rows"

    def lr_at(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based); see ``schedule``."""
        if self.schedule == "constant":
            return self.lr
        if self.schedule == "linear":
            return self.lr * (1 - step / self.steps)
        warm = max(1, self.steps // 20)
        if step < warm:
            return self.lr * (step + 1) / warm
        return self.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, self.steps - warm)))


def fit(
    model,
    items: Sequence,
    pad_token_id: int,
    spec: FitSpec,
    params: Sequence | None = None,
    log: list[dict[str, Any]] | None = None,
    checkpoints: Mapping[int, str | Path] | None = None,
) -> None:
    """Train ``model`` on tokenised rows: the one training loop of every tiny world.

    Each step takes the next ``batch_size`` rows (see :class:`FitSpec`), pads them on the right
    (:func:`gradian.data.tokenize.collate`), sets the step's learning rate, and takes one optimizer
    step on the completion-only loss. The model is left in eval mode with its gradients cleared.

    Args:
        model: a causal LM (a PEFT model trains its adapter when ``params`` are its trainable ones).
        items: ``TokenizedExample`` rows (:func:`tokenize_rows`).
        pad_token_id: the tokenizer's pad id.
        spec: steps, learning rate and schedule, batches, optimizer, clipping, loss.
        params: the parameters to train; default: those of ``model`` that require grad.
        log: if given, one entry per step is appended, as transformers' Trainer logs them:
            ``epoch`` (step / ⌈n / batch_size⌉), ``grad_norm`` (before clipping), ``learning_rate``,
            ``loss`` (the step's, before the update), ``step`` (1-based).
        checkpoints: ``{step: folder}``: after that many steps the model is saved there
            (``save_pretrained``) with a ``trainer_state.json`` holding the log so far, as HF's
            Trainer lays out ``checkpoint-<step>/``.
    """
    import torch

    from gradian.data.tokenize import collate
    from gradian.gradients.loss import model_inputs, per_example_loss

    params = [p for p in model.parameters() if p.requires_grad] if params is None else list(params)
    opt_cls = torch.optim.AdamW if spec.optimizer == "adamw" else torch.optim.Adam
    opt = opt_cls(params, lr=spec.lr, **({"weight_decay": 0.0} if spec.optimizer == "adamw" else {}))
    g = torch.Generator().manual_seed(spec.seed)
    bs = spec.batch_size or len(items)
    per_epoch = math.ceil(len(items) / bs)
    order: list[int] = []
    model.train()
    for step in range(spec.steps):
        if len(order) < bs:
            order.extend(torch.randperm(len(items), generator=g).tolist() if spec.shuffle else range(len(items)))
        idx, order = order[:bs], order[bs:]
        batch = collate([items[i] for i in idx], pad_token_id, "right")
        lr = spec.lr_at(step)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        if spec.loss == "tokens":
            loss = model(**model_inputs(batch), labels=batch["labels"]).loss
        else:
            loss = per_example_loss(model(**model_inputs(batch)).logits, batch["labels"]).mean()
        loss.backward()
        norm = None
        if spec.clip is not None or log is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, spec.clip if spec.clip is not None else math.inf)
        opt.step()
        if log is not None:
            log.append(
                {
                    "epoch": round((step + 1) / per_epoch, 4),
                    "grad_norm": round(float(norm), 4),
                    "learning_rate": lr,
                    "loss": round(float(loss.detach()), 4),
                    "step": step + 1,
                }
            )
        if checkpoints and step + 1 in checkpoints:
            folder = Path(checkpoints[step + 1])
            model.save_pretrained(folder)
            state = {"global_step": step + 1, "log_history": list(log or [])}
            (folder / "trainer_state.json").write_text(json.dumps(state))
    opt.zero_grad(set_to_none=True)
    model.eval()


def tokenize_rows(rows: Sequence, tokenizer, max_length: int | None = None) -> list:
    """Training rows (dicts in any supported format, or :class:`~gradian.data.formats.Example`) to tokens.

    Tokenised as fine-tuning sees them (:func:`gradian.data.tokenize.tokenize_example`: chat template,
    completion-only labels, EOS), truncated to ``max_length`` tokens (default: ``TokenizeSpec``'s).
    """
    from gradian.data.formats import Example, to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    spec = TokenizeSpec() if max_length is None else TokenizeSpec(max_length=max_length)
    exs = [r if isinstance(r, Example) else to_example(r, i, "rows") for i, r in enumerate(rows)]
    return [tokenize_example(e, tokenizer, spec) for e in exs]


def tiny_base(
    tokenizer,
    rows: Sequence,
    spec: FitSpec,
    *,
    arch: Literal["llama", "gpt2"] = "llama",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    max_positions: int = 256,
    max_length: int | None = None,
    log: list[dict[str, Any]] | None = None,
):
    """A from-config model sized to ``tokenizer`` (:func:`gradian.models.tiny.tiny_model`), trained on ``rows``.

    Every parameter is trained by :func:`fit` (``spec``) on ``rows`` tokenised by :func:`tokenize_rows`
    (``max_length``). ``seed`` sets the weight init. Returns the model, in eval mode.
    """
    from gradian.models.tiny import tiny_model

    model = tiny_model(
        tokenizer, arch, hidden=hidden, layers=layers, heads=heads, seed=seed, max_positions=max_positions
    )
    fit(model, tokenize_rows(rows, tokenizer, max_length), tokenizer.pad_token_id, spec, log=log)
    return model


def tiny_lora(
    base,
    *,
    r: int = 8,
    alpha: int | None = None,
    targets: Sequence[str] | None = None,
    seed: int = 1,
    dropout: float = 0.0,
    random_init: bool = False,
    rslora: bool = False,
    copy: bool = True,
    dora: bool = False,
):
    """A PEFT LoRA adapter on ``base`` (on a deep copy of it unless ``copy`` is false).

    Args:
        base: a tiny Llama or GPT-2 (:func:`tiny_base` or :func:`gradian.models.tiny.tiny_model`).
        r: the rank.
        alpha: lora_alpha (default 2r).
        targets: target module names (default :func:`gradian.models.tiny.default_targets`, MLP included).
        seed: ``torch.manual_seed`` right before the adapter is initialised.
        dropout: lora_dropout.
        random_init: random A and B (``init_lora_weights=False``), so lora_A gradients are non-zero
            from the start; otherwise PEFT's default (B = 0: the adapter starts as a no-op).
        rslora: rank-stabilised scaling alpha/√r.
        copy: wrap a deep copy of ``base`` (``base`` itself stays a plain model); false: wrap ``base``.
        dora: a DoRA adapter (``use_dora``: a magnitude vector per layer beside A and B).
    """
    import copy as _copy

    import torch
    from peft import LoraConfig, get_peft_model

    from gradian.models.tiny import default_targets

    arch = "gpt2" if base.config.model_type == "gpt2" else "llama"
    cfg = LoraConfig(
        r=r,
        lora_alpha=2 * r if alpha is None else alpha,
        target_modules=list(targets) if targets is not None else default_targets(arch),
        lora_dropout=dropout,
        fan_in_fan_out=(arch == "gpt2"),
        init_lora_weights=not random_init,
        use_rslora=rslora,
        use_dora=dora,
    )
    model = _copy.deepcopy(base) if copy else base
    torch.manual_seed(seed)
    return get_peft_model(model, cfg)


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
        """The spec as a JSON-able dict (hashed into the cache folder's name)."""
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
    """The tiny base's pretraining chats: every capital (except ``held_out``'s), currency, region, symbol.

    A capital is taught with the eval prompt and every paraphrase in ``CAPITAL_PROMPTS``; held-out countries
    keep their currency and region rows, so the base knows of them but not their capitals.
    """
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
    from gradian.models.tiny import train_tokenizer

    tok = train_tokenizer(tokenizer_corpus(countries, elements), vocab_size=spec.vocab_size)
    held = set(held_out)
    rows = pretraining_rows(countries, held, elements)
    log: list[dict[str, Any]] = []
    fit_spec = FitSpec(
        **attrs(spec, "steps", "lr", "batch_size", "seed"),
        schedule="cosine",
        optimizer="adamw",
        clip=1.0,
        loss="tokens",
    )
    model = tiny_base(
        tok,
        [{"messages": r} for r in rows],
        fit_spec,
        **attrs(spec, "hidden", "layers", "heads", "seed", "max_positions"),
        max_length=spec.max_positions,
        log=log,
    )
    final_loss = log[-1]["loss"]

    source = {
        "kind": "tiny",
        "key": key,
        "spec": spec.to_dict(),
        "held_out": sorted(held),
        "pretraining_rows": len(rows),
        "final_loss": final_loss,
        "threads": 1,
    }
    return publish_pretrained(target, model, tok, source)


def tiny_identity(folder: str | Path) -> str:
    """``tiny-world@<key>``: the identity of a base :func:`build_tiny_base` wrote."""
    info = json.loads((Path(folder) / "gradian_source.json").read_text())
    return f"tiny-world@{info['key']}"
