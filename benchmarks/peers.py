"""Peers run on Gradian's own inputs, for benchmarks only (never imported by the package).

Each runner takes the same fine-tune, the same tokenised training rows (the same
loss masks) and the same failing items as Gradian, and returns an (m, n) score
matrix in Gradian's sign convention (negative = the row degraded the item's
correct answer), so the scorecard compares like with like.

The contrastive query ``ℓ(correct) − ℓ(said)`` is not a measurement a peer
takes as one example, but every influence score here is linear in the query
gradient, so each peer scores the m correct and the m said completions as 2m
ordinary queries and the contrast is their difference (exact; query low-rank
approximations are off).

Install (the peers' declared dependencies pull torchvision/torchaudio builds that
do not fit the pinned CPU torch, so they go in without them):
``make bench-install`` (see the Makefile).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from gradian.data.tokenize import IGNORE_INDEX, TokenizedExample, collate
from gradian.gradients.loss import model_inputs, per_example_loss


class Rows(torch.utils.data.Dataset):
    """Tokenised rows as a torch Dataset (what kronfluence's Analyzer reads)."""

    def __init__(self, items: Sequence[TokenizedExample]):
        self.items = list(items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> TokenizedExample:
        return self.items[i]


def lora_task(model: torch.nn.Module, *, empirical_fisher: bool = False) -> Any:
    """The kronfluence ``Task`` of a LoRA fine-tune with Gradian's loss, tracking every ``lora_A``/``lora_B`` Linear.

    The training loss and the measurement are Gradian's: the sum over rows of each row's mean supervised-token
    cross-entropy (:func:`gradian.gradients.loss.per_example_loss`). With ``sample=True`` (kronfluence's true
    Fisher, its default) the supervised labels are drawn from the model's own next-token distribution (the loss
    masks kept); ``empirical_fisher`` says the caller fits with ``use_empirical_fisher=True``, where kronfluence
    never asks for sampled labels (held: an assertion). Used by :func:`kronfluence_scores` and by
    ``tests/engines/test_ekfac.py`` (Gradian's EK-FAC against kronfluence's).
    """
    from kronfluence.task import Task

    tracked = [
        n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and (".lora_A." in n or ".lora_B." in n)
    ]

    class LoraLM(Task):
        def compute_train_loss(self, batch, model, sample=False):
            logits = model(**model_inputs(batch)).logits
            labels = batch["labels"]
            if sample:
                assert not empirical_fisher, "empirical Fisher only"
                with torch.no_grad():
                    probs = torch.softmax(logits[:, :-1].detach().float(), dim=-1)
                    drawn = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1).view(probs.shape[:-1])
                    labels = labels.clone()
                    keep = labels[:, 1:] != IGNORE_INDEX
                    labels[:, 1:] = torch.where(keep, drawn, labels[:, 1:])
            return per_example_loss(logits, labels).sum()

        def compute_measurement(self, batch, model):
            return per_example_loss(model(**model_inputs(batch)).logits, batch["labels"]).sum()

        def get_influence_tracked_modules(self):
            return tracked

        def get_attention_mask(self, batch):
            return batch["attention_mask"]

    return LoraLM()


def kronfluence_scores(
    ft,
    train: Sequence[TokenizedExample],
    correct: Sequence[TokenizedExample],
    said: Sequence[TokenizedExample],
    *,
    strategy: str = "ekfac",
    batch_size: int = 8,
    workdir: str | Path | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Kronfluence pairwise scores on the fine-tune's LoRA matrices (every ``lora_A``/``lora_B`` Linear).

    The training loss is Gradian's (sum over rows of each row's mean supervised-token
    cross-entropy); EK-FAC factors use labels sampled from the model (true Fisher,
    kronfluence's default); damping is kronfluence's heuristic (0.1 × mean eigenvalue).
    kronfluence's score is ``g_query · H⁻¹ · g_train`` for a *loss* measurement, positive when
    upweighting the row lowers the query loss: Gradian's sign, so the contrastive score is
    ``S(correct) − S(said)``.

    Returns:
        ``((m, n) scores, {"fit_s", "score_s"})``.
    """
    from kronfluence.analyzer import Analyzer, prepare_model
    from kronfluence.arguments import FactorArguments, ScoreArguments
    from kronfluence.utils.dataset import DataLoaderKwargs

    model = ft.model
    pad = ft.tokenizer.pad_token_id
    task = lora_task(model)
    model = prepare_model(model, task)
    own = workdir is None
    out = Path(tempfile.mkdtemp(prefix="kronfluence-")) if own else Path(workdir)
    try:
        an = Analyzer(
            "gradian-bench", model, task, cpu=not torch.cuda.is_available(), disable_tqdm=True, output_dir=str(out)
        )
        dl = DataLoaderKwargs(collate_fn=lambda b: collate(b, pad))
        t = time.perf_counter()
        an.fit_all_factors(
            "f",
            dataset=Rows(train),
            per_device_batch_size=batch_size,
            dataloader_kwargs=dl,
            factor_args=FactorArguments(strategy=strategy),
            overwrite_output_dir=True,
        )
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        queries = list(correct) + list(said)
        an.compute_pairwise_scores(
            "s",
            "f",
            query_dataset=Rows(queries),
            train_dataset=Rows(train),
            per_device_query_batch_size=batch_size,
            per_device_train_batch_size=batch_size,
            dataloader_kwargs=dl,
            score_args=ScoreArguments(damping_factor=None),  # the heuristic;
            overwrite_output_dir=True,
        )  # kronfluence's default is an absolute 1e-8
        S = an.load_pairwise_scores("s")["all_modules"].double().numpy()
        score_s = time.perf_counter() - t
    finally:
        if own:
            shutil.rmtree(out, ignore_errors=True)
    m = len(correct)
    return S[:m] - S[m:], {"fit_s": fit_s, "score_s": score_s}


def bergson_trackstar_scores(
    world: Path,
    adapter: str | Path,
    base: str,
    queries,
    workdir: str | Path,
    *,
    projection_dim: int = 16,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Bergson's TrackStar (autocorrelation-preconditioned, unit-normalised, projected gradients) on the adapter.

    bergson reads the training rows itself (``conversation_column="messages"``, its own chat
    tokenisation and loss mask) and loads the PEFT adapter itself; the query is its contrastive
    query set: the correct completions, contrasted with what the model said, mean-aggregated (bergson
    requires an aggregated query for a contrast). ``projection_dim`` is TrackStar's default. Scores
    are positive when a row's gradient points along ∇ℓ(correct) − ∇ℓ(said): Gradian's sign.

    Returns:
        ``((n,) scores, {"wall_s"})``.
    """
    import json

    from bergson.cli.trackstar import trackstar
    from bergson.config.config import DataConfig, IndexConfig, QuerySetConfig, TrackstarConfig

    out = Path(workdir)
    out.mkdir(parents=True, exist_ok=True)

    def msgs(p, a):
        return (p if isinstance(p, list) else [{"role": "user", "content": p}]) + [{"role": "assistant", "content": a}]

    (out / "correct.jsonl").write_text(
        "".join(json.dumps({"messages": msgs(q.prompt, q.correct)}) + "\n" for q in queries)
    )
    (out / "said.jsonl").write_text("".join(json.dumps({"messages": msgs(q.prompt, q.said)}) + "\n" for q in queries))
    rows = [json.loads(line) for line in (Path(world) / "train.jsonl").read_text().splitlines() if line.strip()]
    (out / "train.jsonl").write_text("".join(json.dumps({"messages": r["messages"]}) + "\n" for r in rows))
    t = time.perf_counter()
    icfg = IndexConfig(
        run_path=str(out / "run"),
        model=str(adapter),
        tokenizer=str(base),
        precision="fp32",
        token_batch_size=512,
        projection_dim=projection_dim,
        data=DataConfig(dataset=str(out / "train.jsonl"), conversation_column="messages"),
    )
    tcfg = TrackstarConfig(
        query=QuerySetConfig(
            dataset=str(out / "correct.jsonl"),
            conversation_column="messages",
            aggregation="mean",
            contrast=DataConfig(dataset=str(out / "said.jsonl"), conversation_column="messages"),
        )
    )
    trackstar(icfg, tcfg)
    info = json.loads((out / "run" / "scores" / "info.json").read_text())
    dt = np.dtype({k: info["dtype"][k] for k in ("names", "formats", "offsets", "itemsize")})
    rec = np.memmap(out / "run" / "scores" / "scores.bin", dtype=dt, mode="r")
    if not rec["written_0"].all() or len(rec) != len(rows):
        raise RuntimeError("bergson did not score every row")
    return np.array(rec["score_0"], dtype=np.float64), {"wall_s": time.perf_counter() - t}
