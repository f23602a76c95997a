"""The rows an HF ``Trainer`` run (TRL's trainers, LLaMA-Factory's and axolotl's included) or torchtune's LoRA recipe
read, step by step, reproduced from its config (torchtune: :func:`torchtune_rows_read`; the train set a trainer built
from the file before it sampled, TRL's and axolotl's shuffled and filtered ones included: :func:`given_rows`).

transformers >= 4.38 prepares the train set with accelerate's ``SeedableRandomSampler``
(``AcceleratorConfig.use_seedable_sampler``, default True): epoch ``e`` reads the rows in the order
``torch.randperm(n, generator=torch.Generator().manual_seed(s + e))``, where ``s`` is ``data_seed`` when set and
otherwise ``seed`` (the trainer's ``set_seed(seed)`` makes it torch's initial seed, which the sampler takes). The
order is cut into micro-batches of ``per_device_train_batch_size`` (the last one short, or dropped with
``dataloader_drop_last``), and each optimizer step takes ``gradient_accumulation_steps`` of them, the epoch's last
step the micro-batches left. On several devices each process reads its share of the same micro-batches
(:func:`shard`), and a step takes ``gradient_accumulation_steps`` of each. tests/audit/test_hf_order.py holds this to
transformers' own ``Trainer``; tests/attribute/test_visits.py to TRL's on two torchrun processes.

Not reproduced (:func:`order_rule` says why, and C04 then gives the count without names): another
``train_sampling_strategy`` (``group_by_length``, ``sequential``, ``batch_rebalance``), packing (a step's sequences
hold several rows), a stage other than SFT, ``use_seedable_sampler`` off, transformers before 4.38; LLaMA-Factory's
``val_size`` split and several concatenated datasets; axolotl's several datasets, shards, exact deduplication and an
unseeded shuffle (:func:`axolotl_train_rows`). Not detectable from a config, and said in C04's message
instead: more than one device (one is assumed) and a train set the user reordered or filtered before the trainer
sampled it (the file's order is assumed); the run's own ``trainer_state.json``, when given, tells how many devices
read the rows (:func:`devices_from_state`) or that the rows were others, and then nothing is named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gradian.audit.config.gradian_train import TRAIN_DEFAULTS
from gradian.audit.config.hf_args import HF_DEFAULTS
from gradian.audit.config.model import TrainConfig
from gradian.libversions import before


def _mt19937(seed: int):
    """A ``random.Random`` whose generator is the MT19937 that ``torch.Generator().manual_seed(seed)`` seeds on the
    CPU (the standard ``init_genrand`` of the seed's low 32 bits; ``getrandbits(32)`` then draws its next word).
    """
    import random

    mt = [seed & 0xFFFFFFFF]
    for i in range(1, 624):
        mt.append((1812433253 * (mt[-1] ^ (mt[-1] >> 30)) + i) & 0xFFFFFFFF)
    r = random.Random()
    r.setstate((3, (*mt, 624), None))
    return r


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The row indices epoch ``epoch`` reads, in order: ``torch.randperm(n)`` of a CPU generator seeded
    ``seed + epoch``, without importing torch (Audit never does): its Fisher-Yates shuffle, position ``i`` swapped
    with ``i + word % (n - i)`` for each MT19937 word. tests/audit/test_hf_order.py holds it equal to
    ``torch.randperm`` for n up to 50,000 (far larger sets were not checked).
    """
    r, order = _mt19937(seed + epoch), list(range(n))
    for i in range(n - 1):
        z = i + r.getrandbits(32) % (n - i)
        order[i], order[z] = order[z], order[i]
    return order


#: :func:`order_rule`'s "seed" of a run whose sampler reads the rows in order every epoch (LLaMA-Factory's
#: ``disable_shuffling``: a ``SequentialSampler``)
SEQUENTIAL = -1


def shard(micro: list[list[int]], world: int, rank: int, batch: int, drop_last: bool) -> list[list[int]]:
    """The micro-batches process ``rank`` of ``world`` reads of an epoch's ``micro`` (all of them, in order):
    accelerate's ``BatchSamplerShard`` as ``prepare_data_loader`` wraps the Trainer's batch sampler on several
    processes (``split_batches`` false, ``even_batches`` true, their defaults): micro-batch ``k`` goes to process
    ``k mod world`` in whole rounds, and the last round is completed from the epoch's first rows (a short last
    micro-batch is filled up, the missing processes' micro-batches taken from the start), so every process reads
    ``ceil(len(micro) / world)`` full micro-batches (``floor`` with ``drop_last``). On one process nothing is wrapped.
    """
    if world <= 1:
        return list(micro)
    first: list[int] = []
    out: list[list[int]] = []
    mine: list[int] | None = None
    idx, last = -1, []
    for idx, last in enumerate(micro):
        if not drop_last and idx < world:
            first += last
        if idx % world == rank:
            mine = last
        if idx % world == world - 1 and len(last) == batch:
            out.append(mine)  # type: ignore[arg-type]
            mine = None
    if drop_last or not first:
        return out
    if mine and len(mine) == batch:
        out.append(mine)
    while len(first) < world * batch:
        first += first
    pending = list(last)
    if len(pending) == batch:
        pending, idx = [], idx + 1
    cycle = 0
    while idx % world != 0 or pending:
        end = cycle + batch - len(pending)
        pending += first[cycle:end]
        if idx % world == rank:
            out.append(pending)
        cycle, pending, idx = end, [], idx + 1
    return out


def epoch_micro_batches(n: int, batch: int, world: int = 1, drop_last: bool = False) -> int:
    """The micro-batches each process reads an epoch (the Trainer's ``len(train_dataloader)``): ``M = ceil(n /
    batch)`` (``floor`` with ``drop_last``) on one process; on ``world`` of them ``M // world``, plus one when
    ``world`` does not divide ``M`` and ``drop_last`` is off (:func:`shard`).
    """
    total = n // batch if drop_last else -(-n // batch)
    if world <= 1 or total % world == 0:
        return total // max(world, 1)
    return total // world + (0 if drop_last else 1)


def rows_read(
    n: int, *, seed: int, batch: int, accumulation: int, steps: int, drop_last: bool = False, world: int = 1
) -> list[list[int]]:
    """Per optimizer step (``steps`` of them, across epochs), the row indices it read, on all ``world`` devices.

    Args:
        n: rows in the train set, in the order the trainer was given them.
        seed: ``data_seed``, or else ``seed``; :data:`SEQUENTIAL`: ``0 .. n-1`` every epoch.
        batch: ``per_device_train_batch_size``.
        accumulation: ``gradient_accumulation_steps``.
        steps: optimizer steps taken (``max_steps``, or the ``global_step`` the run reached).
        drop_last: ``dataloader_drop_last``.
        world: processes (each reads its own micro-batches of the same order: :func:`shard`); a step is
            ``accumulation`` micro-batches of each.
    """
    if n <= 0 or batch <= 0 or accumulation <= 0 or world <= 0 or epoch_micro_batches(n, batch, world, drop_last) <= 0:
        return []
    out: list[list[int]] = []
    epoch = 0
    while len(out) < steps:
        order = list(range(n)) if seed == SEQUENTIAL else epoch_order(n, seed, epoch)
        micro = [order[i : i + batch] for i in range(0, n, batch)]
        if drop_last and len(micro[-1]) < batch:
            micro.pop()
        each = [shard(micro, world, rank, batch, drop_last) for rank in range(world)]
        for k in range(0, len(each[0]), accumulation):
            out.append([r for mine in each for m in mine[k : k + accumulation] for r in m])
            if len(out) == steps:
                break
        epoch += 1
    return out


def trained_rows(c: TrainConfig, n: int) -> int:
    """How many of the training file's ``n`` rows the trainer was given: LLaMA-Factory's ``max_samples`` keeps a
    dataset's first N (``data/loader.py``: ``dataset.select(range(max_samples))``); every other trainer, all.
    """
    if c.trainer == "llamafactory" and c.max_samples is not None and c.max_samples >= 0:
        return min(n, c.max_samples)
    return n


def datasets_shuffle(n: int, seed: int) -> list[int]:
    """The order ``datasets``' ``Dataset.shuffle(seed=seed)`` puts ``n`` rows in: ``numpy.random.default_rng(seed)
    .permutation(n)`` (the train-set shuffle of axolotl's ``shuffle_merged_datasets`` and TRL's ``shuffle_dataset``).
    """
    import numpy as np

    return np.random.default_rng(seed).permutation(n).tolist()


def axolotl_train_rows(c: TrainConfig, n: int, lengths: Sequence[int] | None) -> tuple[list[int] | None, str]:
    """The training file's row at each position of the train set axolotl 0.19 handed its trainer (one dataset,
    unpacked), and how it was built; or ``(None, why not)``.

    axolotl tokenises the rows in the file's order; ``merge_datasets`` (``utils/data/shared.py``) shuffles them with
    ``Dataset.shuffle(seed=seed)``, i.e. ``numpy.random.default_rng(seed).permutation(n)`` (``shuffle_merged_datasets``,
    default true; not under ``curriculum_sampling``); ``handle_long_seq_in_dataset`` then drops the rows of fewer
    than ``min_sample_len`` tokens (2) and, under ``excess_length_strategy`` ``drop`` (its default) or ``raise``, of
    more than ``sequence_len``; a ``val_set_size`` keeps the first rows (``train_test_split(shuffle=False)``: ``v``
    rows held out for ``v > 1``, else ``ceil(v · rows)``). tests/data/test_framework_visits.py holds it to axolotl's
    own trainer.

    Args:
        lengths: each file row's token count as axolotl tokenised it, before any cut (None: unknown).
    """
    if c.datasets and len(c.datasets) > 1:
        return None, "several datasets are merged (which file's rows come first is not read)"
    if c.dataset_shards or any(d.get("shards") for d in c.datasets or ()):
        return None, "its dataset is sharded (a shuffle of its own picks each shard's rows)"
    if c.dedup_exact:
        return None, "dataset_exact_deduplication drops repeated rows"
    shuffled = c.shuffle_dataset is not False and not c.curriculum_sampling
    if shuffled and c.seed is None:
        return None, "axolotl shuffled the rows with numpy's unseeded generator (the config sets no seed)"
    if lengths is None or len(lengths) != n:
        return None, "the rows' token counts under axolotl's tokenisation are unknown"
    order: Sequence[int] = range(n)
    if shuffled:
        order = datasets_shuffle(n, c.seed)  # type: ignore[arg-type]
    low, high = c.min_sample_len or 2, c.max_length
    cut = (c.truncation or "drop").lower() == "truncate"
    rows = [j for j in order if lengths[j] >= low and (cut or high is None or lengths[j] <= high)]
    dropped = n - len(rows)
    held = 0
    if c.val_set_size and c.val_set_size > 0:
        held = int(c.val_set_size) if c.val_set_size > 1 else math.ceil(c.val_set_size * len(rows))
        rows = rows[: max(0, len(rows) - held)]
    how = [f"shuffled, seed {c.seed}" if shuffled else "in the file's order"]
    if dropped:
        how.append(f"{dropped} row(s) dropped for their length")
    if held:
        how.append(f"the last {held} held out by val_set_size")
    return rows, "axolotl's train set: " + ", ".join(how)


#: The TRL release whose SFTTrainer first drops the rows truncation leaves with no supervised token, before it samples
#: (huggingface/trl#6320, "Drop fully-masked examples after truncation in SFT")
TRL_DROPS_MASKED = "1.9"


def trl_train_rows(c: TrainConfig, n: int, unsupervised: Sequence[bool] | None) -> tuple[list[int] | None, str]:
    """The training file's row at each position of the train set TRL's ``SFTTrainer`` sampled from (unpacked), and how
    it was built; or ``(None, why not)``.

    ``_prepare_dataset`` (TRL 1.16): with a ``max_length``, the rows truncation leaves with no supervised token are
    dropped (TRL 1.9 and later: :data:`TRL_DROPS_MASKED`); then ``shuffle_dataset`` (TRL 0.26 and later, default
    false) shuffles what is left once, ``Dataset.shuffle(seed=seed)``: ``numpy.random.default_rng(seed).permutation``.
    tests/attribute/test_visits.py holds it to TRL's own trainer.

    Args:
        unsupervised: per file row, whether it has no supervised token as the run tokenised it (None: unknown, every
            row taken as kept).
    """
    masked = [j for j in range(n) if unsupervised is not None and unsupervised[j]]
    drops = bool(masked) and c.max_length is not None and not c.packing
    version = c.versions.get("trl")
    if drops and version is None:
        return None, (
            f"TRL {TRL_DROPS_MASKED} and later drop the {len(masked)} row(s) left with no supervised token before they "
            "sample, earlier versions keep them, and the run's TRL version is not recorded"
        )
    drops = drops and not before(c.versions, "trl", TRL_DROPS_MASKED)
    dropped = set(masked) if drops else set()
    rows = [j for j in range(n) if j not in dropped]
    how = [f"{len(masked)} row(s) with no supervised token dropped (TRL {version})"] if drops else []
    if c.shuffle_dataset:
        seed = c.seed if c.seed is not None else int(HF_DEFAULTS["seed"])
        rows = [rows[p] for p in datasets_shuffle(len(rows), seed)]
        how.append(f"shuffled once, seed {seed} (shuffle_dataset)")
    return rows, ", ".join(how)


def given_rows(
    c: TrainConfig, n: int, lengths: Sequence[int] | None = None, unsupervised: Sequence[bool] | None = None
) -> tuple[list[int] | None, str]:
    """The training file's row at each position of the train set the trainer's sampler drew from, and how that set
    was built ("" when it is the file as it is); ``(None, why not)`` when it cannot be told. LLaMA-Factory's
    ``max_samples``: the first rows (:func:`trained_rows`); axolotl: :func:`axolotl_train_rows` (``lengths``: each
    row's token count before any cut); TRL: :func:`trl_train_rows` (``unsupervised``: per row, no supervised token
    as the run tokenised it).
    """
    if c.trainer == "axolotl":
        return axolotl_train_rows(c, n, lengths)
    if c.trainer == "trl" and "gradian" not in c.formats:
        return trl_train_rows(c, n, unsupervised)
    given = trained_rows(c, n)
    return list(range(given)), (f"max_samples {c.max_samples}: its first {given} of {n} rows" if given < n else "")


def epoch_at(c: TrainConfig, given: int, steps: int, world: int = 1) -> float | None:
    """The ``epoch`` an HF Trainer on ``world`` devices reports after ``steps`` optimizer steps over a train set of
    ``given`` rows: the micro-batches each process read over those of an epoch, ``m`` (:func:`epoch_micro_batches`).
    An epoch takes ``s = ⌈m / accumulation⌉`` steps, its last one the micro-batches left, so ``steps`` read
    ``⌊steps / s⌋ · m + min((steps mod s) · accumulation, m)`` of them, whatever the shuffle (the same count
    :func:`rows_read` steps through). ``trainer_state.json`` saves the same number, so it tells how many devices read
    the rows (:func:`devices_from_state`). None when the batch is unknown.
    """
    batch, acc = c.micro_batch_size, c.gradient_accumulation_steps or 1
    if not batch or batch <= 0 or acc <= 0 or world <= 0:
        return None
    per_epoch = epoch_micro_batches(given, batch, world, bool(c.dataloader_drop_last))
    if per_epoch <= 0:
        return None
    epoch_steps = -(-per_epoch // acc)
    read = (steps // epoch_steps) * per_epoch + min((steps % epoch_steps) * acc, per_epoch)
    return read / per_epoch


#: the most devices :func:`devices_from_state` tries
MAX_DEVICES = 64


def devices_from_state(c: TrainConfig, given: int, global_step: int, epoch: float, where: str) -> tuple[list[int], str]:
    """How many devices read the ``given`` rows, from the ``epoch`` a ``trainer_state.json`` (``where``) saved at
    ``global_step``: the counts ``W`` (1 to :data:`MAX_DEVICES`) for which :func:`epoch_at` gives that epoch (to
    1e-6), and how they were told. One count is the answer (one device needs no saying: ``([1], "")``); none means
    the run trained other rows; several (an epoch that does not tell them apart, as a whole number of epochs of one
    step each can) leave it to the caller, whom the rows read may not differ between them.
    """
    fits = [w for w in range(1, MAX_DEVICES + 1) if _agrees(epoch_at(c, given, global_step, w), epoch)]
    if fits == [1]:
        return fits, ""
    if len(fits) == 1:
        return fits, f"{fits[0]} devices ({where}: epoch {epoch:g} at step {global_step})"
    one = epoch_at(c, given, global_step)
    said = (
        f"{where} says epoch {epoch:g} at step {global_step}, where one device reading {given} rows in "
        f"micro-batches of {c.micro_batch_size} would be at {one:g}"
        if one is not None
        else f"{where} says epoch {epoch:g} at step {global_step}"
    )
    if not fits:
        return fits, f"{said}, and no number of devices reading them would: the run trained other rows"
    counts = ", ".join(map(str, fits[:4])) + (" ..." if len(fits) > 4 else "")
    return fits, f"{said}: {counts} devices all fit, so the run's device count cannot be told"


def _agrees(ours: float | None, saved: float) -> bool:
    return ours is not None and abs(ours - saved) <= 1e-6 * max(1.0, ours)


def torchtune_rows_read(
    n: int, *, shuffle: bool, batch: int, accumulation: int, epochs: int, max_steps_per_epoch: int | None = None
) -> list[list[int]]:
    """Per optimizer step, across the run's ``epochs``, the row indices torchtune 0.6's ``lora_finetune_single_device``
    recipe trained on.

    Its ``StatefulDistributedSampler`` (one replica, ``seed=0`` whatever the config's ``seed``) reads epoch ``e`` in
    the order ``randperm(n)`` of a generator seeded ``0 + e`` (``shuffle: true``) or ``0 .. n-1``; its DataLoader
    drops the last incomplete micro-batch (``drop_last=True``: ``n // batch`` micro-batches an epoch); a step every
    ``accumulation`` micro-batches, and an epoch ends after ``max_steps_per_epoch`` steps when that is set. The
    micro-batches an epoch leaves after its last step keep their gradients (the loop neither steps nor zeroes them),
    so they join the next epoch's first step; the last epoch's are never stepped.
    tests/data/test_framework_visits.py holds this to the recipe's own loop.
    """
    if n <= 0 or batch <= 0 or accumulation <= 0 or epochs <= 0:
        return []
    out: list[list[int]] = []
    pending: list[int] = []
    for e in range(int(epochs)):
        order = epoch_order(n, 0, e) if shuffle else list(range(n))
        taken = 0
        for idx, start in enumerate(range(0, n - n % batch, batch)):
            pending += order[start : start + batch]
            if (idx + 1) % accumulation == 0:
                out.append(pending)
                pending, taken = [], taken + 1
                if max_steps_per_epoch is not None and taken == max_steps_per_epoch:
                    break
    return out


def torchtune_order_rule(c: TrainConfig) -> str | None:
    """Why a torchtune run's rows cannot be read step by step from its config (:func:`torchtune_rows_read`), or
    None when they can.
    """
    if c.stage_kind != "sft":
        return f"a {c.stage} run's sampler is not reproduced"
    if c.packing:
        return "packed steps hold several rows each"
    if c.shuffle is None or not c.micro_batch_size or not c.num_epochs:
        return "the recipe's shuffle, batch_size or epochs is not in the config"
    return None


def order_rule(c: TrainConfig, versions: dict[str, str]) -> tuple[int | None, str]:
    """``(seed, how)`` when the run's row order is reproduced (an HF Trainer, TRL or LLaMA-Factory run, one device,
    rows unpacked, the random sampler; :data:`SEQUENTIAL` for LLaMA-Factory's ``disable_shuffling``), else
    ``(None, why not)``. A LLaMA-Factory run's rows are its dataset's first ``max_samples`` (:func:`trained_rows`).
    """
    if c.trainer not in ("trl", "hf", "llamafactory", "axolotl"):
        return None, f"the {c.trainer or 'unknown'} trainer's sampler is not reproduced"
    if c.trainer == "llamafactory":
        if c.val_set_size and c.val_set_size > 0:
            return None, f"val_size {c.val_set_size:g} splits the rows with datasets' own shuffle"
        if c.datasets and len(c.datasets) > 1:
            return None, "several datasets are concatenated (which file's rows come first is not read)"
    if c.stage_kind != "sft":  # TRL's GRPO and distillation trainers sample rows their own way
        return None, f"a {c.stage} run's sampler is not reproduced"
    if c.packing or c.padding_free:
        return None, "packed steps hold several rows each"
    own = TRAIN_DEFAULTS if "gradian" in c.formats else {}  # gradian train's defaults where its config is silent
    by_length = own["group_by_length"] if own and c.is_default("group_by_length") else c.group_by_length
    strategy = (c.train_sampling_strategy or ("group_by_length" if by_length else "random")).lower()
    if strategy != "random":
        return None, f"train_sampling_strategy {strategy!r} is not reproduced"
    if c.use_seedable_sampler is False:
        return None, "accelerator_config.use_seedable_sampler is off: the order followed torch's global generator"
    if c.trainer == "llamafactory" and c.disable_shuffling:
        return SEQUENTIAL, f"in order (disable_shuffling, {c.source('disable_shuffling')})"
    if c.trainer == "axolotl" and c.curriculum_sampling:
        return SEQUENTIAL, f"in order (curriculum_sampling, {c.source('curriculum_sampling')})"
    if before(versions, "transformers", "4.38"):
        return None, f"transformers {versions['transformers']} (before 4.38) did not seed its sampler"
    if c.trainer == "axolotl":  # core/builders/base.py hands TrainingArguments its seed only when set, no data_seed
        seed = c.seed if c.seed is not None else int(HF_DEFAULTS["seed"])
        return seed, f"seed {seed} ({c.source('seed') or 'TrainingArguments default: axolotl passes none'})"
    if c.data_seed is not None:
        return c.data_seed, f"data_seed {c.data_seed} ({c.source('data_seed')})"
    if own and (c.seed is None or c.is_default("seed")):
        return own["seed"], f"seed {own['seed']} (gradian train's default)"
    seed = c.seed if c.seed is not None else int(HF_DEFAULTS["seed"])  # TRL / HF formats fill it in already
    return seed, f"seed {seed} ({c.source('seed') or 'TrainingArguments default'})"
