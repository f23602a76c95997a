"""gradian.audit.hf_order against transformers' own ``Trainer``: the rows each optimizer step read.

The Trainer trains a tiny model on rows whose tokens name them; a forward hook on the model records the rows of
every micro-batch it trains on (the Trainer's own sampler, accelerate's seeded one, its batching and its gradient
accumulation decide them; a collator would also see the batch accelerate fetches ahead), and :func:`rows_read`
must name the same rows, in the same order, across epochs.
"""

from __future__ import annotations

import pytest
import torch

from gradian.audit import diagnose
from gradian.audit.hf_order import rows_read


class _Collator:
    """Pads a micro-batch as a causal-LM batch (the rows' index column is dropped here)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, features):
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), width), self.pad_id)
        for i, f in enumerate(features):
            ids[i, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        return {"input_ids": ids, "labels": ids.clone()}


def test_epoch_order_is_torch_randperm():
    """The pure-Python shuffle (Audit never imports torch) is ``torch.randperm`` of a seeded CPU generator."""
    from gradian.audit.hf_order import epoch_order

    for seed in (0, 5, 42, 2**31 + 7, 2**32 + 5, 2**63 - 1):
        for n in (1, 2, 3, 23, 1000, 50_000):
            g = torch.Generator()
            g.manual_seed(seed + 2)
            assert epoch_order(n, seed, 2) == torch.randperm(n, generator=g).tolist(), (seed, n)


@pytest.mark.parametrize(
    "n, batch, accumulation, steps, extra",
    [
        (23, 2, 2, 4, {"seed": 7}),  # inside the first epoch
        (10, 2, 3, 5, {"seed": 3}),  # two epochs, each ending in a step of fewer micro-batches (5 = 3 + 2)
        (11, 3, 1, 6, {"data_seed": 5, "dataloader_drop_last": True}),  # data_seed wins; the short batch dropped
    ],
)
def test_rows_read_are_the_trainer_s_own(tok, tmp_path, n, batch, accumulation, steps, extra):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from gradian.models.tiny import tiny_model

    ids = [tok(f"row {i} of the set")["input_ids"] for i in range(n)]
    which = {tuple(x): i for i, x in enumerate(ids)}
    assert len(which) == n  # every row's tokens are its own
    rows = Dataset.from_list([{"input_ids": x} for x in ids])
    model, micro = tiny_model(tok, "llama"), []

    def record(_module, _args, kwargs):  # the micro-batches the model trains on, as row indices
        micro.append([which[tuple(t for t in x.tolist() if t != tok.pad_token_id)] for x in kwargs["input_ids"]])

    model.register_forward_pre_hook(record, with_kwargs=True)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
        max_steps=steps, report_to=[], save_strategy="no", use_cpu=True, logging_steps=1000, **extra,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=rows, data_collator=_Collator(tok.pad_token_id)).train()
    seed = extra.get("data_seed", extra.get("seed"))
    ours = rows_read(
        n, seed=seed, batch=batch, accumulation=accumulation, steps=steps,
        drop_last=extra.get("dataloader_drop_last", False),
    )  # fmt: skip
    assert [r for step in ours for r in step] == [r for m in micro for r in m]
    assert len(micro) == sum(-(-len(step) // batch) for step in ours)  # micro-batches: the steps' own


def test_c04_names_the_rows_a_short_trl_run_never_trained(tmp_path):
    """A TRL config with max_steps inside the first epoch: C04's warning lists exactly the rows the seeded sampler
    never reached (the complement of :func:`rows_read`), and a config whose order is not reproduced
    (group_by_length) keeps the count without names."""
    import json

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "prompt": f"Q{i}?", "completion": f"A{i}."}) + "\n"
                            for i in range(40)))  # fmt: skip
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("per_device_train_batch_size: 4\ngradient_accumulation_steps: 2\nmax_steps: 3\nseed: 11\n")
    (hit,) = [f for f in diagnose(configs=[cfg], data=data, select=["C04"]).by_id("C04") if "never" in f.message]
    read = {r for step in rows_read(40, seed=11, batch=4, accumulation=2, steps=3) for r in step}
    assert len(read) == 24 and hit.row_ids == [f"r{i}" for i in range(40) if i not in read]
    assert hit.evidence["never_trained"] == 16 and "seed 11" in hit.evidence["order"]
    assert "gradian attribute scores them 0" in hit.message  # Attribute counts the same visits
    cfg.write_text(cfg.read_text() + "group_by_length: true\n")
    (hit,) = [f for f in diagnose(configs=[cfg], data=data, select=["C04"]).by_id("C04") if "never" in f.message]
    assert hit.row_ids == [] and hit.evidence["never_trained"] == 16 and "group_by_length" in hit.message
    assert "say what they would have done, not what they did" in hit.message


def test_c04_names_the_rows_trl_s_own_sft_trainer_never_trained(tok, tmp_path):
    """TRL's SFTTrainer (its own dataset preparation, collator and the Trainer's sampler) on prompt/completion rows
    with max_steps inside the first epoch: the rows its model trained on, recorded by a forward hook, are exactly
    those C04 does not name, read from the same settings in a config file and from the training_args.bin the
    trainer saved (read without unpickling it)."""
    import json

    import yaml
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from gradian.models.tiny import tiny_model

    rows = [{"id": f"r{i}", "prompt": f"Question {i}?", "completion": f" Answer {i}."} for i in range(30)]
    settings = {"per_device_train_batch_size": 3, "gradient_accumulation_steps": 2, "max_steps": 3, "seed": 5}
    model, micro = tiny_model(tok, "llama"), []
    args = SFTConfig(output_dir=str(tmp_path / "out"), report_to=[], use_cpu=True, save_strategy="no",
                     dataset_num_proc=None, logging_steps=1000, **settings)  # fmt: skip
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    prepared = [tuple(r["input_ids"]) for r in trainer.train_dataset]
    assert all(f"Question {i}?" in tok.decode(list(x)) for i, x in enumerate(prepared))  # the file's order, kept
    which = {x: i for i, x in enumerate(prepared)}

    def record(_module, _args, kwargs):
        micro.append([which[tuple(t for t in x.tolist() if t != tok.pad_token_id)] for x in kwargs["input_ids"]])

    model.register_forward_pre_hook(record, with_kwargs=True)
    trainer.train()
    trained = {r for m in micro for r in m}
    assert len(micro) == 6 and len(trained) == 18

    data, cfg = tmp_path / "train.jsonl", tmp_path / "sft.yaml"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg.write_text(yaml.safe_dump(settings))
    trainer.save_model(str(tmp_path / "run"))  # the run folder a user points at: its training_args.bin
    never = [r["id"] for i, r in enumerate(rows) if i not in trained]
    for config in (cfg, tmp_path / "run" / "training_args.bin"):
        found = diagnose(configs=[config], data=data, select=["C04"]).by_id("C04")
        (hit,) = [f for f in found if "never" in f.message]
        assert hit.row_ids == never, config


def test_a_gradian_train_config_s_silent_settings_are_gradian_train_s(tmp_path):
    """A ``gradian train`` config that leaves ``seed`` and ``group_by_length`` out was trained with TrainSpec's values
    (seed 0, grouped by length), not TRL's (42, random): the order is not reproduced while grouped, and its seed is 0
    once ``group_by_length: false`` is written."""
    from gradian.audit.config import GRADIAN_TRAIN_HEADER, load_config
    from gradian.audit.config.gradian_train import TRAIN_DEFAULTS
    from gradian.audit.hf_order import order_rule
    from gradian.trainconfig import TrainSpec

    assert TRAIN_DEFAULTS == {k: getattr(TrainSpec(), k) for k in TRAIN_DEFAULTS}
    cfg = tmp_path / "train.yaml"
    cfg.write_text(
        f"{GRADIAN_TRAIN_HEADER} test\nlearning_rate: 0.001\nper_device_train_batch_size: 4\nuse_peft: true\n"
    )
    seed, why = order_rule(load_config([str(cfg)]), {})
    assert seed is None and "group_by_length" in why
    cfg.write_text(cfg.read_text() + "group_by_length: false\n")
    assert order_rule(load_config([str(cfg)]), {}) == (0, "seed 0 (gradian train's default)")
    cfg.write_text(cfg.read_text() + "seed: 7\n")
    assert order_rule(load_config([str(cfg)]), {})[0] == 7


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("accumulation", [1, 2, 3])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_epoch_counts_the_micro_batches_the_sampler_steps_through(drop_last, accumulation, world):
    """:func:`epoch_at`'s closed form equals the micro-batches :func:`rows_read` steps through on ``world`` devices
    (the epochs' short last steps and a dropped last micro-batch included), for every step count over three epochs,
    and :func:`devices_from_state` tells ``world`` back from it wherever one count fits."""
    from gradian.audit.config.model import TrainConfig
    from gradian.audit.hf_order import devices_from_state, epoch_at, epoch_micro_batches

    for n, batch in ((13, 2), (12, 4), (7, 3), (5, 8), (23, 2)):
        c = TrainConfig(micro_batch_size=batch, gradient_accumulation_steps=accumulation)
        c.dataloader_drop_last = drop_last
        per_epoch = epoch_micro_batches(n, batch, world, drop_last)
        if per_epoch == 0:
            assert epoch_at(c, n, 3, world) is None
            continue
        for steps in range(1, 3 * -(-per_epoch // accumulation) + 1):
            read = rows_read(
                n, seed=5, batch=batch, accumulation=accumulation, steps=steps, drop_last=drop_last, world=world
            )
            replayed = sum(-(-len(rows) // (batch * world)) for rows in read) / per_epoch
            epoch = epoch_at(c, n, steps, world)
            assert epoch == pytest.approx(replayed, abs=1e-12), (n, batch, steps)
            fits, why = devices_from_state(c, n, steps, epoch, "log")
            assert world in fits and (fits == [world] or "all fit" in why), why


@pytest.mark.parametrize("drop_last", [False, True])
def test_each_device_reads_the_micro_batches_accelerate_shards_it(drop_last):
    """:func:`shard` is accelerate's own ``BatchSamplerShard`` (``split_batches`` false, ``even_batches`` true, as
    ``prepare_data_loader`` wraps the Trainer's batch sampler on several processes), micro-batch for micro-batch,
    and :func:`epoch_micro_batches` its length."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from gradian.audit.hf_order import epoch_micro_batches, epoch_order, shard

    for n in (1, 3, 7, 15, 16, 29):
        order = epoch_order(n, 3, 0)
        for batch in (1, 2, 4):
            micro = [order[i : i + batch] for i in range(0, n, batch)]
            if drop_last and len(micro[-1]) < batch:
                micro.pop()
            for world in (2, 3, 4):
                for rank in range(world):
                    theirs = BatchSamplerShard(
                        BatchSampler(order, batch, drop_last), num_processes=world, process_index=rank,
                        split_batches=False, even_batches=True,
                    )  # fmt: skip
                    assert shard(micro, world, rank, batch, drop_last) == list(theirs), (n, batch, world, rank)
                    assert epoch_micro_batches(n, batch, world, drop_last) == len(theirs)


def _axolotl(tmp_path, extra: str = ""):
    from gradian.audit.config import load_config

    path = tmp_path / "axolotl.yaml"
    path.write_text(
        "base_model: m\nadapter: lora\nsequence_len: 10\nmicro_batch_size: 2\nmax_steps: 2\n"
        "datasets:\n  - path: d.jsonl\n    type: chat_template\n" + extra
    )
    return load_config([str(path)])


def test_axolotl_s_train_set_is_rebuilt_from_its_config_and_the_rows_lengths(tmp_path):
    """axolotl's train set: the rows shuffled by ``datasets``' seeded shuffle (numpy's PCG64 permutation), less the
    rows out of ``[min_sample_len, sequence_len]`` and the last ``val_set_size`` rows; ``truncate`` keeps long rows.
    tests/data/test_framework_visits.py holds it to axolotl's own trainer."""
    import datasets

    from gradian.audit.hf_order import axolotl_train_rows, given_rows, order_rule

    lengths = [5, 12, 1, 7, 9, 10, 11, 3, 4, 6]
    c = _axolotl(tmp_path, "seed: 3\n")
    perm = datasets.Dataset.from_dict({"j": list(range(10))}).shuffle(seed=3)["j"]
    keep = [j for j in perm if 2 <= lengths[j] <= 10]
    assert axolotl_train_rows(c, 10, lengths)[0] == keep
    assert given_rows(c, 10, lengths)[0] == keep and order_rule(c, {})[0] == 3
    c = _axolotl(tmp_path, "seed: 3\nexcess_length_strategy: truncate\nval_set_size: 2\nmin_sample_len: 4\n")
    assert axolotl_train_rows(c, 10, lengths)[0] == [j for j in perm if lengths[j] >= 4][:-2]
    c = _axolotl(tmp_path, "shuffle_merged_datasets: false\nval_set_size: 0.25\n")
    rows, how = axolotl_train_rows(c, 10, lengths)
    assert rows == [0, 3, 4, 5, 7] and "last 2 held out" in how  # ceil(0.25 x 7 kept rows) = 2
    assert order_rule(c, {}) == (42, "seed 42 (TrainingArguments default: axolotl passes none)")
    for extra, why in (
        ("", "unseeded"),  # shuffled, but no seed: datasets draws one from numpy's global state
        ("seed: 1\ndataset_exact_deduplication: true\n", "deduplication"),
        ("seed: 1\ndataset_shard_num: 2\ndataset_shard_idx: 0\n", "sharded"),
    ):
        rows, got = axolotl_train_rows(_axolotl(tmp_path, extra), 10, lengths)
        assert rows is None and why in got, extra
    two = _axolotl(tmp_path, "seed: 1\n")
    two.datasets = [*two.datasets, dict(two.datasets[0], index=1)]
    assert axolotl_train_rows(two, 10, lengths)[0] is None
    assert axolotl_train_rows(_axolotl(tmp_path, "seed: 1\n"), 10, None)[0] is None  # the lengths are needed
    packed = _axolotl(tmp_path, "seed: 1\nsample_packing: true\n")
    assert order_rule(packed, {})[0] is None


@pytest.mark.parametrize("drop_last", [False, True])
def test_c04_s_step_count_is_the_trainer_s(tmp_path, drop_last):
    """Audit's step count (``checks_config.total_steps``) equals the HF Trainer's own (:func:`total_steps` of
    Attribute, held to transformers' Trainer in tests/attribute/test_visits.py), with ``dataloader_drop_last`` too."""
    from gradian.attribute.visits import total_steps as trainer_steps
    from gradian.audit.checks_config import total_steps
    from gradian.audit.config import load_config
    from gradian.audit.context import AuditContext
    from gradian.data.formats import Example

    for n, batch, acc, epochs in ((13, 2, 2, 1.5), (12, 4, 3, 2), (7, 3, 2, 3), (9, 2, 4, 1)):
        cfg = tmp_path / "sft.yaml"
        cfg.write_text(f"per_device_train_batch_size: {batch}\ngradient_accumulation_steps: {acc}\n"
                       f"num_train_epochs: {epochs}\ndataloader_drop_last: {str(drop_last).lower()}\n"
                       "learning_rate: 0.0001\n")  # fmt: skip
        config = load_config([str(cfg)])
        rows = [Example(id=f"r{i}", row=i, format="text", prompt="", completion=f"row {i}") for i in range(n)]
        ctx = AuditContext(rows, None, config, None, None, None, {}, {})
        assert total_steps(ctx)[0] == trainer_steps(config, n), (n, batch, acc, epochs)
