"""TRL 1.16's packing (``packing=True``, its default ``packing_strategy="bfd"``) trains each row on its own, so
Gradian's per-row gradients are the packed loss's terms exactly.

TRL packs the tokenised rows by Best Fit Decreasing (rows kept whole, a row longer than ``max_length`` truncated),
then its padding-free collator flattens a batch into one sequence whose ``position_ids`` restart at every row and
whose label at each row's first token is masked. In training it calls the model with ``use_cache=False``, so
transformers (5.24) reads the restarting ``position_ids`` as packed sequences and masks attention block-diagonally,
for sdpa and eager as for flash attention's varlen kernels. The test runs TRL's own trainer on a tiny LoRA model,
takes the gradient of ``SFTTrainer.compute_loss`` on its first packed batch, and holds it equal to the token-weighted
sum of Gradian's per-row gradients (rows tokenised by Gradian from the same file, with the setup read from the same
``SFTConfig``): ``∇L = Σ_r n_r g_r / Σ_r n_r``, ``g_r`` the gradient of row r's mean loss over its ``n_r``
supervised tokens.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from trl_parity import pc_rows  # noqa: E402

from gradian.data.formats import load_examples  # noqa: E402
from gradian.data.setup import setup_from_files  # noqa: E402
from gradian.data.tokenize import collate, tokenize_example  # noqa: E402
from gradian.gradients import per_example_grads  # noqa: E402


def _packed_run(tok, tmp_path, strategy: str | None, attn: str = "sdpa", dora: bool = False):
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from trl import SFTConfig, SFTTrainer

    from gradian.models.tiny import tiny_model

    rows = pc_rows()
    long = "Name the capital of Aland. " * 8
    rows.append({"id": "pc-long", "prompt": "Q: " + long + "\nA:", "completion": " Marven."})  # cut before its answer
    rows.append({"id": "pc-long-answer", "prompt": "Q: Aland?\nA:", "completion": " " + long})  # cut in its answer
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = {"packing_strategy": strategy} if strategy else {}
    args = SFTConfig(
        output_dir=str(tmp_path / "trl"), report_to=[], dataset_num_proc=None, use_cpu=True, packing=True,
        max_length=48, per_device_train_batch_size=4, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_dora=dora)
    model = get_peft_model(tiny_model(tok, attn=attn), lora)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(std=0.05)  # a trained adapter: lora_A's gradient is zero while B is
    model.eval()
    tr = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    cfg = tmp_path / "sft_config.json"
    cfg.write_text(args.to_json_string())
    return model, tr, data, cfg


def _trl_gradients(model, tr):
    """Each of TRL's packed batches, with the LoRA gradient of its ``compute_loss`` on it."""
    for batch in tr.get_train_dataloader():
        model.zero_grad()
        tr.compute_loss(model, dict(batch)).backward()
        yield batch, {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _rows_of(batch) -> list[tuple[int, ...]]:
    """The rows a padding-free batch holds: its one sequence cut where ``position_ids`` restart."""
    ids, pos = batch["input_ids"][0].tolist(), batch["position_ids"][0].tolist()
    starts = [i for i, p in enumerate(pos) if p == 0] + [len(pos)]
    return [tuple(ids[a:b]) for a, b in zip(starts, starts[1:]) if b > a]


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_a_packed_batch_s_gradient_is_gradians_rows_weighted_by_their_tokens(tok, tmp_path, dora):
    """With ``dora`` the adapter is PEFT's DoRA as TRL trains it: its magnitudes are in TRL's gradient and in
    Gradian's blocks alike (after B moved, m/n ≠ 1)."""
    model, tr, data, cfg = _packed_run(tok, tmp_path, None, dora=dora)
    setup = setup_from_files([cfg], data)
    assert "packing" not in setup.unreproduced and setup.sources["packing"].startswith("packing bfd")
    spec = setup.tokenize_spec()
    ours = {tuple(it.input_ids.tolist()): it for it in (tokenize_example(e, tok, spec) for e in load_examples(data))}
    seen = []
    for batch, trl_grad in list(_trl_gradients(model, tr)):  # TRL's first, then Gradian's (its own backward)
        packed = _rows_of(batch)
        assert all(p in ours for p in packed)  # every row in a pack is one of Gradian's rows, whole
        items = [ours[p] for p in packed]
        seen += items
        grads = per_example_grads(model, collate(items, tok.pad_token_id))
        n = torch.tensor([float(it.n_supervised) for it in items], dtype=torch.float64)
        assert set(trl_grad) == set(grads)
        if n.sum() == 0:  # a pack of rows cut before their answer: TRL trains on nothing, Gradian's rows are zero
            assert all(float(g.abs().max()) == 0 for g in [*trl_grad.values(), *grads.values()])
            continue
        assert dora == any("lora_magnitude_vector" in name for name in trl_grad)
        for name, g in trl_grad.items():
            mine = grads[name].double().reshape(-1, *g.shape)  # a DoRA magnitude's block is (out, 1)
            expected = (mine * n.view(-1, *[1] * g.dim())).sum(0) / n.sum()
            torch.testing.assert_close(g.double(), expected, rtol=1e-4, atol=1e-7)
    assert sorted(it.id for it in seen) == sorted(it.id for it in ours.values())  # every row trained, once
    assert sorted(it.id for it in seen if it.truncated) == ["pc-long", "pc-long-answer"]  # cut at max_length by both
    assert any(it.truncated and it.n_supervised > 0 for it in seen)


@pytest.mark.parametrize(
    "strategy, why",
    [
        ("wrapped", "rows are cut across sequence boundaries"),
        ("bfd_split", "has its overflow trained as a row of its own"),
    ],
)
def test_packing_that_does_not_keep_rows_apart_is_listed(tmp_path, strategy, why):
    """TRL's other strategies cut rows, and other trainers' packing where it does not keep rows apart: listed as not
    reproduced."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in pc_rows()))
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(f"packing: true\npacking_strategy: {strategy}\nmax_length: 48\n")
    setup = setup_from_files([cfg], data)
    assert "packing" in setup.unreproduced and any(why in n for n in setup.notes)
    axolotl = tmp_path / "axolotl.yaml"
    axolotl.write_text(
        "base_model: x\nsample_packing: true\nsequence_len: 48\ndatasets:\n  - path: d\n    type: alpaca\n"
    )
    assert "packing" in setup_from_files([axolotl], data).unreproduced  # no attn_implementation: the mask is kept
    # axolotl with sdpa keeps rows apart (tests/data/test_framework_packing.py runs its trainer), unless a row's first
    # token is a label (the row packed before it predicts it) or the axolotl is older than the one run
    sdpa = axolotl.read_text() + "attn_implementation: sdpa\n"
    for extra, versions, listed in [
        ("", "", False),
        ("train_on_inputs: true\n", "", True),
        ("", "# pip install axolotl==0.18.0\n", True),  # the config's own pin names the version
        ("", "# pip install axolotl==0.19.0\n", False),
    ]:
        axolotl.write_text(versions + sdpa + extra)
        setup = setup_from_files([axolotl], data)
        assert ("packing" in setup.unreproduced) == listed, setup.notes
    # LLaMA-Factory: neat_packing keeps rows apart, plain packing does not, train_on_prompt trains a row's first token
    lf = tmp_path / "llamafactory.yaml"
    for extra, listed in [("neat_packing: true\n", False), ("packing: true\n", True),
                          ("neat_packing: true\ntrain_on_prompt: true\n", True)]:  # fmt: skip
        lf.write_text("model_name_or_path: m\nstage: sft\nfinetuning_type: lora\ntemplate: qwen\n" + extra)
        assert ("packing" in setup_from_files([lf], data).unreproduced) == listed
    # torchtune keeps packed rows apart (block-causal mask; the same test runs its recipe); a row's first token is a
    # label under its Qwen2 rule with train_on_input (alpaca's default), never under Llama-3's (BOS always masked)
    alpaca = tmp_path / "alpaca.jsonl"
    alpaca.write_text(json.dumps({"instruction": "Name a capital.", "input": "", "output": "Paris."}) + "\n")
    tt = tmp_path / "torchtune.yaml"
    for family, extra, listed in [("llama3", "", False), ("qwen2", "", True),
                                  ("qwen2", "  train_on_input: false\n", False)]:  # fmt: skip
        tt.write_text(
            f"tokenizer:\n  _component_: torchtune.models.{family}.{family}_tokenizer\n  path: x\n  max_seq_len: 64\n"
            "dataset:\n  _component_: torchtune.datasets.alpaca_dataset\n  source: json\n  data_files: d\n"
            "  packed: true\n" + extra
        )
        setup = setup_from_files([tt], alpaca)
        assert ("packing" in setup.unreproduced) == listed, setup.notes
        assert setup.sources["packing"].startswith("packed") != listed
