"""D14 (eval rows verbatim in training) matches a prompt with and without its system turns."""

from __future__ import annotations

from pathlib import Path

from gradian.audit import diagnose
from gradian_testlib import write_jsonl

SYSTEM = "You are a careful assistant who answers questions about geography in one short sentence."
FACTS = [
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is the capital of Peru?", "The capital of Peru is Lima."),
    ("What is the capital of Kenya?", "The capital of Kenya is Nairobi."),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("Which river flows through Cairo?", "The Nile flows through Cairo."),
    ("Which ocean lies west of Portugal?", "The Atlantic Ocean lies west of Portugal."),
]


def _chat(q: str, a: str, system: str | None) -> list[dict]:
    turns = [{"role": "system", "content": system}] if system else []
    return [*turns, {"role": "user", "content": q}, {"role": "assistant", "content": a}]


def _run(tmp_path: Path, ev: list[dict]):
    train = [{"id": f"t{i}", "messages": _chat(q, a, SYSTEM)} for i, (q, a) in enumerate(FACTS)]
    return diagnose(
        data=write_jsonl(tmp_path / "train.jsonl", train), eval=write_jsonl(tmp_path / "eval.jsonl", ev), select=["D14"]
    )


def test_an_eval_row_without_the_training_system_prompt_is_still_verbatim(tmp_path):
    q, a = FACTS[0]
    q2, _ = FACTS[1]
    ev = [
        {"id": "e0", "messages": _chat(q, a, None)},  # no system turn: same prompt and target
        {"id": "e1", "prompt": q, "completion": a},  # a prompt/completion row
        {"id": "e2", "messages": _chat(q2, "Lima.", "Answer tersely.")},  # another system prompt, same question
        {"id": "e3", "messages": _chat("What is the capital of Chile?", "Santiago.", SYSTEM)},  # not in training
    ]
    res = _run(tmp_path, ev)
    (hit,) = [f for f in res.by_id("D14") if f.severity == "error"]
    assert hit.evidence["verbatim"] == 2 and hit.evidence["same_prompt"] == 1
    assert set(hit.eval_row_ids) == {"e0", "e1", "e2"} and set(hit.row_ids) == {"t0", "t1"}


def test_a_shared_system_prompt_alone_is_no_match(tmp_path):
    ev = [{"id": f"e{k}", "messages": _chat(f"Name a city in region {k}.", "Lyon.", SYSTEM)} for k in range(3)]
    res = _run(tmp_path, ev)
    assert "D14" in res.passed, [f.message for f in res.by_id("D14")]
