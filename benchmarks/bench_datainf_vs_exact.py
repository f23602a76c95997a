"""DataInf and EK-FAC against the exact damped inverse, on real LoRA gradients of tiny models.

For several LoRA ranks and layer widths (small enough that every block can be
inverted exactly), builds a 48-row index of capital Q/A rows (every fifth one
wrong) and scores a contrastive query four ways: DataInf, EK-FAC (empirical
Fisher; its damping rule ``c · mean Λ`` is the same λ), the exact damped inverse
``(1/n Σ g gᵀ + λ I)⁻¹`` with the same λ, and gradient-dot. Prints the Spearman
correlation of DataInf, EK-FAC and gradient-dot with the exact ranking.

    python benchmarks/bench_datainf_vs_exact.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gradian_testlib import capital_query, capital_rows  # noqa: E402  (the 48 capital rows the engines' tests score too)


def main():
    from peft import LoraConfig, get_peft_model

    from gradian.attribute.queries import query_gradients
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example
    from gradian.engines import DataInf, DataInfSpec, GradDot, GradDotSpec, ModelPass, score_index
    from gradian.engines.ekfac import Ekfac, EkfacSpec
    from gradian.engines.exact import ExactInverse
    from gradian.index.build import build_index
    from gradian.index.store import GradSpec
    from gradian.models.load import prepare_lora_for_gradients
    from gradian.models.tiny import tiny_model, train_tokenizer

    rows = capital_rows(48)
    tok = train_tokenizer([r["prompt"] + r["completion"] for r in rows] * 5, 320)
    spec = GradSpec(tokenize=TokenizeSpec(max_length=64), storage_dtype="float64")
    items = [tokenize_example(to_example(x, i, "t"), tok, spec.tokenize) for i, x in enumerate(rows)]
    q = capital_query()
    print(
        "| LoRA r | hidden | largest block | damping scale | DataInf vs exact | EK-FAC vs exact | gradient-dot vs "
        "exact |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in (1, 2, 4):
        for hidden in (16, 32):
            torch.manual_seed(0)
            model = tiny_model(tok, "llama", hidden=hidden, dtype=torch.float64)
            pm = get_peft_model(
                model,
                LoraConfig(
                    r=r,
                    lora_alpha=2 * r,
                    target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                    init_lora_weights=False,
                ),
            )
            pm.double()
            prepare_lora_for_gradients(pm)
            with tempfile.TemporaryDirectory() as d:
                idx = build_index(pm, items, {"r": r, "h": hidden}, spec, pad_token_id=tok.pad_token_id, root=Path(d))
                Q = query_gradients(pm, tok, [q], idx, spec.tokenize)
                for c in (0.1, 1.0):
                    es = DataInfSpec(c)
                    ek = Ekfac(EkfacSpec(c))
                    ek.fit(idx, ModelPass(pm, items, tok.pad_token_id))
                    di, ef, ex, gd = score_index(
                        idx,
                        [
                            DataInf(es).precondition(idx, Q),
                            ek.precondition(idx, Q),
                            ExactInverse(es).precondition(idx, Q),
                            GradDot(GradDotSpec()).precondition(idx, Q),
                        ],
                    )
                    print(
                        f"| {r} | {hidden} | {max(b['dim'] for b in idx.blocks)} | {c} | "
                        f"{spearmanr(di[0], ex[0]).statistic:.3f} | {spearmanr(ef[0], ex[0]).statistic:.3f} | "
                        f"{spearmanr(gd[0], ex[0]).statistic:.3f} |"
                    )


if __name__ == "__main__":
    main()
