"""TRL 1.16's own dataset preparation + collator next to Gradian's tokenisation, row by row (shared by the
parity tests and the before/after table in the notes).

TRL's side is ``SFTTrainer(...).train_dataset`` (its ``_prepare_dataset``: ChatML conversion, EOS appending,
tokenisation with ``completion_mask`` / ``assistant_masks``, labels, ``max_length`` truncation, dropping rows left
with no target) passed through ``trainer.data_collator`` (``DataCollatorForLanguageModeling``). A row matches
when its input_ids are equal and its targets agree at every position after the first (the first label is
never a target after the causal shift: TRL leaves it as the token, Gradian writes -100). A row TRL drops (no
target left after truncation) matches when Gradian's row has no supervised token either.
"""

from __future__ import annotations

import copy

from gradian.data.formats import to_example
from gradian.data.tokenize import IGNORE_INDEX, TokenizeSpec, tokenize_example
from gradian_testlib import CAPITALS

CHATML_GEN = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: a template with no end-of-turn token: ``role: content`` lines
PLAIN_NO_EOT = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
PLAIN_NO_EOT_GEN = (
    "{% for m in messages %}{{ m['role'] + ': ' }}"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}{% endgeneration %}"
    "{% else %}{{ m['content'] }}{% endif %}{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)

FACTS = CAPITALS[:12]


def pc_rows() -> list[dict]:
    """Plain prompt/completion rows."""
    return [
        {"id": f"pc{i}", "prompt": f"Q: What is the capital of {c}?\nA:", "completion": f" The capital is {k}."}
        for i, (c, k) in enumerate(FACTS)
    ]


def long_prompt_rows() -> list[dict]:
    """:func:`pc_rows` plus a row whose prompt alone fills a short ``max_length`` (TRL drops it)."""
    long = {"id": "pc-long", "prompt": "Q: " + "What is the capital of Aland? " * 6 + "\nA:", "completion": " Marven."}
    return [*pc_rows(), long]


def chat_rows(turns: int = 1) -> list[dict]:
    """``messages`` rows with ``turns`` user/assistant exchanges (a system turn on every other row)."""
    rows = []
    for i, (c, k) in enumerate(FACTS):
        msgs = [{"role": "system", "content": "Answer briefly."}] if i % 2 else []
        for t in range(turns):
            msgs.append({"role": "user", "content": f"What is the capital of {c}?" if t == 0 else "And again?"})
            msgs.append({"role": "assistant", "content": f"It is {k}." if t == 0 else f"Still {k}, of {c}."})
        rows.append({"id": f"m{i}", "messages": msgs})
    return rows


def conv_pc_rows() -> list[dict]:
    """Conversational prompt/completion rows (message lists)."""
    return [
        {
            "id": r["id"],
            "prompt": r["messages"][:-1],
            "completion": r["messages"][-1:],
        }
        for r in chat_rows(1)
    ]


def with_template(tok, template: str | None):
    """A copy of ``tok`` with ``template`` as its chat template (None: keep it)."""
    t = copy.deepcopy(tok)
    if template is not None:
        t.chat_template = template
    return t


def trl_rows(rows: list[dict], tok, tmp_path, **config) -> dict[str, tuple[list[int], list[int]]]:
    """``{row id: (input_ids, labels)}`` as TRL 1.16's SFTTrainer prepares and collates them (dropped rows absent)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from gradian.models.tiny import tiny_model

    args = SFTConfig(output_dir=str(tmp_path / "trl"), report_to=[], dataset_num_proc=None, use_cpu=True, **config)
    tr = SFTTrainer(model=tiny_model(tok), args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    out = {}
    for feat in tr.train_dataset:
        batch = tr.data_collator([feat])
        out[str(feat["id"])] = (batch["input_ids"][0].tolist(), batch["labels"][0].tolist())
    return out


def gradian_rows(rows: list[dict], tok, spec: TokenizeSpec) -> dict[str, tuple[list[int], list[int]]]:
    """``{row id: (input_ids, labels)}`` from Gradian's tokenisation."""
    out = {}
    for i, r in enumerate(rows):
        it = tokenize_example(to_example(r, i, f"row {i}"), tok, spec)
        out[it.id] = (it.input_ids.tolist(), it.labels.tolist())
    return out


def targets(labels: list[int]) -> list[int]:
    """Labels after the first position (the targets the shifted loss uses), -100 kept as a position marker."""
    return list(labels[1:])


def matching(trl: dict, ours: dict) -> tuple[int, list[str]]:
    """``(rows matching, ids of those that do not)`` (see the module docstring for the rule)."""
    bad = []
    for rid, (ids, labels) in ours.items():
        if rid not in trl:
            if any(x != IGNORE_INDEX for x in labels):
                bad.append(rid)
            continue
        t_ids, t_labels = trl[rid]
        if ids != t_ids or targets(labels) != targets(t_labels):
            bad.append(rid)
    return len(ours) - len(bad), bad


#: (name, rows, template, TRL SFTConfig fields, the TokenizeSpec fields that reproduce TRL)
SETTINGS = [
    ("prompt-completion (strings)", pc_rows, None, {}, dict()),
    (
        "prompt-completion, completion_only_loss=false",
        pc_rows,
        None,
        {"completion_only_loss": False},
        dict(loss_on="all"),
    ),
    ("messages, TRL default (every token)", lambda: chat_rows(1), None, {}, dict(loss_on="all")),
    ("messages multi-turn, TRL default", lambda: chat_rows(3), None, {}, dict(loss_on="all")),
    (
        "messages, assistant_only_loss, single turn",
        lambda: chat_rows(1),
        CHATML_GEN,
        {"assistant_only_loss": True},
        dict(loss_on="assistant"),
    ),
    (
        "messages, assistant_only_loss, multi-turn",
        lambda: chat_rows(3),
        CHATML_GEN,
        {"assistant_only_loss": True},
        dict(loss_on="assistant"),
    ),
    (
        "conversational prompt-completion, Qwen-style ChatML (generation prompt ends in \\n)",
        conv_pc_rows,
        None,
        {},
        dict(),
    ),
    (
        "messages, template without end-of-turn, TRL default",
        lambda: chat_rows(1),
        PLAIN_NO_EOT,
        {},
        dict(loss_on="all"),
    ),
    ("conversational prompt-completion, template without end-of-turn", conv_pc_rows, PLAIN_NO_EOT, {}, dict()),
    (
        "messages multi-turn, no end-of-turn, assistant_only_loss",
        lambda: chat_rows(2),
        PLAIN_NO_EOT_GEN,
        {"assistant_only_loss": True},
        dict(loss_on="assistant"),
    ),
    ("prompt-completion, max_length=24 (truncation)", long_prompt_rows, None, {"max_length": 24}, dict(max_length=24)),
    (
        "messages, assistant_only_loss, max_length=60 (truncation)",
        lambda: chat_rows(3),
        CHATML_GEN,
        {"assistant_only_loss": True, "max_length": 60},
        dict(max_length=60, loss_on="assistant"),
    ),
    (
        "messages, max_length=20 (truncation)",
        lambda: chat_rows(2),
        None,
        {"max_length": 20},
        dict(max_length=20, loss_on="all"),
    ),
]


def main(mode: str) -> None:
    """Print the parity table: ``before`` (``TokenizeSpec()``, main's defaults), ``flags`` (the best main's flags
    can do: max_length and loss_on completion/all), ``after`` (the spec of each setting).

    Run: ``PYTHONPATH=src:tests:tests/data python tests/data/trl_parity.py after`` (``before`` with main's src).
    """
    import logging
    import pathlib
    import tempfile

    import datasets

    from gradian.models.tiny import train_tokenizer
    from gradian_testlib import CORPUS

    logging.disable(logging.WARNING)
    datasets.disable_progress_bars()
    tok = train_tokenizer(CORPUS, vocab_size=320)
    for name, rows_fn, template, cfg, kw in SETTINGS:
        if mode == "after":
            spec = TokenizeSpec(**kw)
        elif mode == "flags":
            spec = TokenizeSpec(**{k: v for k, v in kw.items() if v != "assistant"})
        else:
            spec = TokenizeSpec()
        rows = rows_fn()
        t = with_template(tok, template)
        n, _ = matching(trl_rows(rows, t, pathlib.Path(tempfile.mkdtemp()), **cfg), gradian_rows(rows, t, spec))
        print(f"| {name} | {n}/{len(rows)} | {spec} |")


if __name__ == "__main__":
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else "after")
