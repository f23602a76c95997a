"""The first rows of a training set on a real adapter, with their sentence units: what the unit-gradient benchmarks
(``bench_joint_batch.py``, ``bench_unit_grads.py``) time.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any


def add_adapter_rows_args(ap: argparse.ArgumentParser, rows: int) -> None:
    """``--base --adapter --data --rows --repeats --max-length --device --dtype`` (``rows``: the default row count)."""
    ap.add_argument("--base", required=True)
    ap.add_argument("--adapter", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--rows", type=int, default=rows)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-length", type=int, default=1024)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")


@dataclass
class AdapterRows:
    """The loaded fine-tune and its first rows: ``items`` tokenised, ``units`` their sentence units (``per_row``: each
    row's), ``blocks`` the LoRA blocks a gradient index reads.
    """

    ft: Any
    items: list
    units: list
    per_row: list[list]
    blocks: list


def load_adapter_rows(args: argparse.Namespace) -> AdapterRows:
    """Load ``args.base`` + ``args.adapter`` and the first ``args.rows`` rows of ``args.data`` as a build reads them."""
    from gradian.data.formats import load_examples
    from gradian.data.spans import sentence_units
    from gradian.data.tokenize import TokenizeSpec
    from gradian.finetune import load_finetune, tokenize_training_set
    from gradian.index.store import GradSpec, select_blocks
    from gradian.models.load import ModelSpec

    ft = load_finetune(ModelSpec(args.base, args.dtype, args.device), args.adapter)
    spec = GradSpec(tokenize=TokenizeSpec(max_length=args.max_length))
    exs = load_examples(args.data)[: args.rows]
    items = list(tokenize_training_set(exs, ft.tokenizer, spec, args.data))
    units = sentence_units(exs, items)
    per_row = [[u for u in units if u.row == j] for j in range(len(items))]
    return AdapterRows(ft, items, units, per_row, select_blocks(ft.model, spec))
