"""Audit test fixtures: one clean, realistic run on disk (session scope), and helpers to break it."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from audit_world import (  # noqa: E402
    clean_trainer_state,
    clean_trl_config,
    corpus_for_tokenizer,
    make_rows,
    save_tokenizer,
)

from gradian_testlib import write_jsonl  # noqa: E402


class World:
    """Paths and objects of the clean run; ``variant`` builds a broken copy of one input."""

    def __init__(self, root: Path):
        from gradian.models.tiny import train_tokenizer

        self.root = root
        self.rows = make_rows(400, seed=0)
        self.eval_rows = make_rows(60, seed=1, id_prefix="e")
        corpus = corpus_for_tokenizer(self.rows) + ["le la les des est et une dans que pour pas qui sur avec"]
        self.tok = train_tokenizer(corpus, vocab_size=800)
        self.tok_bos = train_tokenizer(corpus, vocab_size=800, bos=True)
        self.tok_dir = save_tokenizer(self.tok, root / "tok", max_positions=2048)
        self.tok_bos_dir = save_tokenizer(self.tok_bos, root / "tok_bos", max_positions=2048)
        self.data = write_jsonl(root / "train.jsonl", self.rows)
        self.eval = write_jsonl(root / "eval.jsonl", self.eval_rows)
        self.config = self.write_json("sft.json", clean_trl_config())
        self.logs = self.write_json("trainer_state.json", clean_trainer_state(n_rows=400))
        self._n = 0

    def path(self, name: str) -> Path:
        self._n += 1
        return self.root / f"{self._n:03d}_{name}"

    def write_json(self, name: str, obj) -> Path:
        p = self.root / name if not (self.root / name).exists() else self.path(name)
        p.write_text(json.dumps(obj))
        return p

    def write_text(self, name: str, text: str) -> Path:
        p = self.path(name)
        p.write_text(text)
        return p

    def data_with(self, rows: list[dict], name: str = "train.jsonl") -> Path:
        return write_jsonl(self.path(name), rows)

    def config_with(self, **over) -> Path:
        return self.write_json("sft.json", clean_trl_config(**over))

    def state_with(self, mutate) -> Path:
        st = clean_trainer_state(n_rows=400)
        mutate(st)
        return self.write_json("trainer_state.json", st)

    def rows_copy(self) -> list[dict]:
        return copy.deepcopy(self.rows)

    def tok_copy(self, **attrs):
        t = copy.deepcopy(self.tok)
        for k, v in attrs.items():
            setattr(t, k, v)
        return t


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("audit_world"))


@pytest.fixture(scope="session")
def clean_result(world):
    from gradian.audit import diagnose

    return diagnose(data=world.data, eval=world.eval, configs=[world.config], logs=world.logs, tokenizer=world.tok_dir)
