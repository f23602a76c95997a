"""DataInf against the exact damped inverse; engine formulas on hand-made gradients."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import spearmanr

from gradian.engines import DataInf, DataInfSpec, GradDot, GradDotSpec, score_index
from gradian.engines.exact import ExactInverse
from gradian.index.store import GradientIndex
from gradian.util import atomic_write_bytes, atomic_write_json, sha256_bytes
from gradian_testlib import capital_query, capital_rows


def synthetic_index(root, blocks: dict[str, torch.Tensor], shard=7) -> GradientIndex:
    """Write an index from explicit per-example gradients {block: (n, d)} (several shards)."""
    from safetensors.torch import save

    n = next(iter(blocks.values())).shape[0]
    shards = []
    for k, lo in enumerate(range(0, n, shard)):
        hi = min(n, lo + shard)
        data = save({b: v[lo:hi].float().contiguous() for b, v in blocks.items()})
        atomic_write_bytes(root / f"s{k}.safetensors", data)
        shards.append(
            {
                "file": f"s{k}.safetensors",
                "sha256": sha256_bytes(data),
                "start": lo,
                "n": hi - lo,
                "examples": {"id": [str(i) for i in range(lo, hi)]},
            }
        )
    manifest = {
        "index_id": "synthetic",
        "complete": True,
        "shards": shards,
        "identity": {},
        "grad_spec": {"projection": {"dim": 0, "seed": 0}, "modules": None},
        "blocks": [
            {"name": b, "kind": "A", "layer": b, "shape": [1, v.shape[1]], "dim": v.shape[1]} for b, v in blocks.items()
        ],
    }
    atomic_write_json(root / "manifest.json", manifest)
    return GradientIndex(root)


def _grads(n=40, dims=(12, 30), seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for i, d in enumerate(dims):
        # low-rank-ish structure plus noise, different scales per block (like lora_A vs lora_B)
        basis = torch.randn(3, d, generator=g, dtype=torch.float64)
        coef = torch.randn(n, 3, generator=g, dtype=torch.float64)
        out[f"b{i}"] = (coef @ basis + 0.3 * torch.randn(n, d, generator=g, dtype=torch.float64)) * (10.0 ** (-2 * i))
    return out


def test_datainf_formula_matches_a_direct_computation(tmp_path):
    G = _grads()
    idx = synthetic_index(tmp_path, G)
    Gf = {k: v.float().double() for k, v in G.items()}  # the stored (float32) values
    Q = {k: torch.randn(2, v.shape[1], dtype=torch.float64) for k, v in G.items()}
    eng = DataInf(DataInfSpec(0.1))
    R = eng.precondition(idx, Q)
    n = Gf["b0"].shape[0]
    for k, g in Gf.items():
        lam = 0.1 * (g * g).sum(1).mean() / g.shape[1]
        assert eng.damping[k] == pytest.approx(float(lam))
        for m in range(2):
            q = Q[k][m]
            acc = torch.zeros_like(q)
            for i in range(n):
                acc += (g[i] @ q) / (lam + g[i] @ g[i]) * g[i]
            want = (q - acc / n) / lam
            torch.testing.assert_close(R[k][m], want, rtol=1e-9, atol=0)
    (scores,) = score_index(idx, [R])
    want = sum(R[k] @ Gf[k].T for k in Gf)
    torch.testing.assert_close(scores, want, rtol=1e-9, atol=1e-9)


def test_graddot_is_the_plain_inner_product(tmp_path):
    G = _grads()
    idx = synthetic_index(tmp_path, G)
    Q = {k: torch.randn(3, v.shape[1], dtype=torch.float64) for k, v in G.items()}
    (s,) = score_index(idx, [GradDot(GradDotSpec()).precondition(idx, Q)])
    torch.testing.assert_close(s, sum(Q[k] @ G[k].float().double().T for k in G), rtol=1e-9, atol=1e-9)


def test_datainf_tracks_the_exact_damped_inverse_on_a_tiny_model(tmp_path, tok):
    """Real LoRA gradients (tiny Llama, r=4, attention blocks of ≤128 numbers), n=48 rows.

    DataInf must rank like the exact damped inverse (Spearman ≥ 0.85 here; the
    full sweep is benchmarks/bench_datainf_vs_exact.py) and closer than
    gradient-dot does.
    """
    from gradian.attribute.queries import query_gradients
    from gradian.data.formats import to_example
    from gradian.data.tokenize import TokenizeSpec, tokenize_example
    from gradian.index.build import build_index
    from gradian.index.store import GradSpec
    from gradian_testlib import make_lora_model

    rows = capital_rows()
    model = make_lora_model(tok, "llama", r=4, hidden=32, dtype=torch.float64, mlp=False)
    spec = GradSpec(tokenize=TokenizeSpec(max_length=64), storage_dtype="float64")
    items = [tokenize_example(to_example(x, i, "t"), tok, spec.tokenize) for i, x in enumerate(rows)]
    idx = build_index(model, items, {"test": 1}, spec, pad_token_id=tok.pad_token_id, root=tmp_path)
    q = capital_query()
    Q = query_gradients(model, tok, [q], idx, spec.tokenize)
    es = DataInfSpec(0.1)
    di, ex, gd = score_index(
        idx,
        [
            DataInf(es).precondition(idx, Q),
            ExactInverse(es).precondition(idx, Q),
            GradDot(GradDotSpec()).precondition(idx, Q),
        ],
    )
    rho_di = spearmanr(di[0].numpy(), ex[0].numpy()).statistic
    rho_gd = spearmanr(gd[0].numpy(), ex[0].numpy()).statistic
    print(f"Spearman vs exact inverse: DataInf {rho_di:.3f}, gradient-dot {rho_gd:.3f}")
    assert rho_di >= 0.85 and rho_di > rho_gd
