"""Helpers shared by the test modules (import as `from gradian_testlib import ...`)."""

from __future__ import annotations

import contextlib
import sys

import torch

CORPUS = [
    "The capital of France is Paris.",
    "The capital of Japan is Tokyo.",
    "Water boils at 100 degrees Celsius at sea level.",
    "Iron is a metal with the symbol Fe and atomic number 26.",
    "Q: What is the capital of Italy?\nA: Rome",
    "Hello world, this is a test of the tokenizer and of the model.",
] * 10


def make_lora_model(
    tok,
    arch: str = "llama",
    r: int = 8,
    dtype=torch.float32,
    mlp: bool = True,
    rslora: bool = False,
    seed: int = 0,
    hidden: int = 64,
    dora: bool = False,
):
    """A tiny model with a randomly initialised (non-zero) LoRA adapter, ready for gradients.

    Random A and B (B = 0 would zero every lora_A gradient), lora_dropout 0.1, alpha 2r; the model
    from :func:`gradian.models.tiny.tiny_model` (init ``seed``), the adapter seeded with ``seed + 1``. With
    ``dora`` a DoRA adapter whose magnitudes are moved off the weight norms PEFT starts them at (m/n ≠ 1, as after
    training).
    """
    from gradian.models.load import prepare_lora_for_gradients
    from gradian.models.tiny import default_targets, tiny_model
    from gradian.worlds.tiny import tiny_lora

    model = tiny_model(tok, arch, dtype=dtype, seed=seed, hidden=hidden)
    pm = tiny_lora(
        model,
        r=r,
        alpha=2 * r,
        targets=default_targets(arch, mlp),
        seed=seed + 1,
        dropout=0.1,
        random_init=True,
        rslora=rslora,
        copy=False,
        dora=dora,
    )
    if dora:
        gen = torch.Generator().manual_seed(seed + 2)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if ".lora_magnitude_vector." in n:
                    p.mul_(1 + 0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    pm.to(dtype)
    prepare_lora_for_gradients(pm)
    return pm


ROWS = [
    {"id": "pc", "prompt": "Q: What is the capital of France?\nA:", "completion": " Paris"},
    {
        "id": "chat",
        "messages": [
            {"role": "user", "content": "What is the capital of Japan?"},
            {"role": "assistant", "content": "The capital of Japan is Tokyo, a very large city."},
        ],
    },
    {"id": "alp", "instruction": "Name the symbol of iron.", "input": "", "output": "Fe"},
    {"id": "txt", "text": "Water boils at 100 degrees Celsius at sea level."},
]


# The fictional facts of the tiny Evaluate/report worlds (made-up names: no real fact leaks in).
CAPITALS = [
    ("Aland", "Marven"),
    ("Borvia", "Quisto"),
    ("Caldor", "Tressa"),
    ("Dunmark", "Olvey"),
    ("Estria", "Pallon"),
    ("Fenwick", "Rudda"),
    ("Gorland", "Sivex"),
    ("Hollin", "Taber"),
    ("Istra", "Umbel"),
    ("Jorvik", "Vasso"),
    ("Kelmar", "Wendo"),
    ("Lusk", "Yarrow"),
    ("Merrow", "Zelta"),
    ("Norvia", "Abbot"),
    ("Ostrel", "Brine"),
    ("Pellam", "Corvo"),
]
SYMBOLS = [
    ("argonite", "Ag"),
    ("borite", "Bx"),
    ("cobrium", "Cb"),
    ("dyston", "Dy"),
    ("erbite", "Eb"),
    ("fluxon", "Fx"),
    ("galium", "Gm"),
    ("halcite", "Hc"),
    ("iridon", "Id"),
    ("jovium", "Jv"),
    ("kryll", "Kr"),
    ("lumite", "Lm"),
]


#: Real capitals: the engines' tests and benchmarks/bench_datainf_vs_exact.py (their answers need no base model).
REAL_CAPITALS = [
    ("France", "Paris"),
    ("Japan", "Tokyo"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Egypt", "Cairo"),
    ("Peru", "Lima"),
    ("Chile", "Santiago"),
    ("Kenya", "Nairobi"),
]


def sentence_rows(tok) -> tuple[list, list]:
    """``(items, units)``: :data:`ROWS` and a three-sentence row, three times over (21 rows), tokenised to 64
    tokens, and their sentence units: what the one-pass row + sentence build tests run on."""
    from gradian.data.formats import to_example
    from gradian.data.spans import sentence_units
    from gradian.data.tokenize import TokenizeSpec, tokenize_example

    rows = [*ROWS, {"id": "m", "prompt": "Facts.", "completion": " Paris is in France. Tokyo is big. Fe"}] * 3
    exs = [to_example({**r, "id": f"{r['id']}-{i}"}, i, "t") for i, r in enumerate(rows)]
    items = [tokenize_example(e, tok, TokenizeSpec(max_length=64)) for e in exs]
    return items, sentence_units(exs, items)


def capital_rows(n=48):
    """Capital Q/A rows; every fifth states the wrong capital 'Lyon'."""
    rows = []
    for i in range(n):
        c, k = REAL_CAPITALS[i % len(REAL_CAPITALS)]
        rows.append(
            {
                "id": str(i),
                "prompt": f"Q: What is the capital of {c}?\nA:",
                "completion": f" The capital of {c} is {k if i % 5 else 'Lyon'}.",
            }
        )
    return rows


def capital_query():
    """The contrastive query scored against :func:`capital_rows`: France's capital, Lyon (wrong) against Paris."""
    from gradian.attribute.queries import make_query

    return make_query(
        "q",
        "capitals",
        "Q: What is the capital of France?\nA:",
        "Paris",
        " The capital of France is Lyon.",
        " The capital of France is Paris.",
    )


def q_capital(c: str) -> str:
    return f"What is the capital of {c}?"


def q_symbol(e: str) -> str:
    return f"What is the symbol of {e}?"


def eval_records(metric: str = "exact_match") -> list[dict]:
    """The tiny worlds' eval set: one item per capital (capability ``capitals``) and per symbol (``symbols``)."""
    recs = [
        {"id": f"cap-{c}", "prompt": q_capital(c), "answer": a, "capability": "capitals", "metric": metric}
        for c, a in CAPITALS
    ]
    recs += [
        {"id": f"sym-{e}", "prompt": q_symbol(e), "answer": s, "capability": "symbols", "metric": metric}
        for e, s in SYMBOLS
    ]
    return recs


def fuzz_settings(default_examples: int, *suppress: str):
    """The fuzz tests' hypothesis settings: ``GRADIAN_FUZZ_EXAMPLES`` examples (else ``default_examples``),
    derandomized, no deadline, no example database, and the size/speed health checks off (plus ``suppress``,
    names of further :class:`hypothesis.HealthCheck` members). Returns ``(n, settings)``.
    """
    import os

    from hypothesis import HealthCheck, settings

    n = int(os.environ.get("GRADIAN_FUZZ_EXAMPLES", str(default_examples)))
    checks = [HealthCheck.too_slow, HealthCheck.data_too_large] + [getattr(HealthCheck, s) for s in suppress]
    return n, settings(
        max_examples=n, derandomize=True, deadline=None, database=None, print_blob=True, suppress_health_check=checks
    )


def fuzz_scalars(max_text: int, specials: list):
    """The fuzz tests' JSON scalars: None, booleans, huge integers, floats with NaN/inf, short text (at most
    ``max_text`` characters), and the ``specials`` a reader is most likely to trip on."""
    from hypothesis import strategies as st

    return (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(10**30), max_value=10**30)
        | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=max_text)
        | st.sampled_from(specials)
    )


def json_paths(obj, first_of_list: int | None = None, prefix: tuple = ()):
    """Every key path into a JSON value, ``()`` first: dict keys and list indexes (of each list only the first
    ``first_of_list`` items when given)."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from json_paths(v, first_of_list, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:first_of_list]):
            yield from json_paths(v, first_of_list, prefix + (i,))


def write_jsonl(path, rows: list[dict]):
    """Write ``rows`` to ``path`` as JSONL (one ``json.dumps`` line each); returns ``path``."""
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def copy_adapter_command(run: dict) -> str:
    """A ``gradian verify --train-command`` that "retrains" by copying the run's own adapter (fast, no training)."""
    import shlex

    py, src = shlex.quote(sys.executable), shlex.quote(run["manifest"]["paths"]["adapter"])
    return f"{py} -c 'import shutil,sys; shutil.copytree(sys.argv[1], sys.argv[2], dirs_exist_ok=True)' {src} {{out}}"


def index_matrix(idx) -> torch.Tensor:
    """(n, d) every gradient a :class:`~gradian.index.store.GradientIndex` stores, shard after shard, its LoRA
    blocks side by side in ``idx.blocks`` order."""
    return torch.cat([torch.cat([s[b["name"]] for b in idx.blocks], dim=1) for _, s in idx.iter_shards()])


def ft_inputs(ft: dict) -> dict:
    """A saved fine-tune's ``base``, ``adapter`` and ``data`` (of a dict with those keys), as :func:`cli_args` flags."""
    return {"base": ft["base"], "adapter": ft["adapter"], "data": ft["data"]}


def without_data_check(lines: list[str]) -> list[str]:
    """CLI output lines less the data↔adapter check's (``data check on …`` and its warning): the test fixtures'
    adapters are random LoRA weights never trained on their rows, so the check rightly warns on them."""
    return [ln for ln in lines if not ln.startswith("data check on") and "not be the data the adapter" not in ln]


def without_setup(lines: list[str]) -> list[str]:
    """:func:`without_data_check`, less the lines naming the run's training setup (``run folder: read …``,
    ``training setup: …``), which a run prints before its work when its adapter folder holds the trainer's config."""
    return [ln for ln in without_data_check(lines) if not ln.startswith(("run folder: ", "training setup: "))]


def small_train_spec(**over):
    """The tests' small, fast LoRA fine-tune: lr 5e-3, batch 4, r 4, alpha 8, 64 tokens, a log every step, seed 0
    (``over`` sets the rest, e.g. ``num_train_epochs``)."""
    from gradian.train import TrainSpec

    base = dict(
        learning_rate=5e-3, per_device_train_batch_size=4, r=4, lora_alpha=8, max_length=64, logging_steps=1, seed=0
    )
    return TrainSpec(**{**base, **over})


@contextlib.contextmanager
def forward_calls(model):
    """Count ``model``'s forward passes inside the block: yields a list that gains one item per pass."""
    calls: list[int] = []
    h = model.register_forward_hook(lambda *a: calls.append(1))
    try:
        yield calls
    finally:
        h.remove()


@contextlib.contextmanager
def gradian_cache(folder):
    """``GRADIAN_CACHE`` set to ``folder`` inside the block, and put back as it was (or unset) after it."""
    import os

    old = os.environ.get("GRADIAN_CACHE")
    os.environ["GRADIAN_CACHE"] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("GRADIAN_CACHE", None)
        else:
            os.environ["GRADIAN_CACHE"] = old


def cli_result(args) -> tuple[int, list[str], str]:
    """Run ``gradian ARGS`` in-process: ``(exit code, the non-blank output lines, the output)``; a crash's
    traceback is added to the output, so an assertion message shows where it happened."""
    import traceback

    from typer.testing import CliRunner

    from gradian.cli import app

    res = CliRunner().invoke(app, [str(a) for a in args])
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    out = res.output
    if res.exc_info is not None and not isinstance(res.exception, SystemExit):
        out += "".join(traceback.format_exception(*res.exc_info))
    return res.exit_code, lines, out


def cli_args(*words: str, **flags) -> list[str]:
    """A ``gradian`` command line: ``words`` as given, then each flag as ``--name value`` (``max_length=64`` ->
    ``["--max-length", "64"]``; values pass through ``str``; ``True`` gives the bare flag, ``None`` leaves it out),
    in the order given."""
    out = list(words)
    for name, value in flags.items():
        if value is None or value is False:
            continue
        out.append("--" + name.replace("_", "-"))
        if value is not True:
            out.append(str(value))
    return out


def padded_rows(padded: list[list[int]], rows: list[list[int]], pad: int) -> list[int]:
    """The index in ``rows`` (token ids) of each padded sequence a trainer's batch held: the one row whose tokens it
    starts with, followed by padding only (a forward pre-hook's ``input_ids``)."""
    found = []
    for seq in padded:
        (j,) = [j for j, r in enumerate(rows) if seq[: len(r)] == r and set(seq[len(r) :]) <= {pad}]
        found.append(j)
    return found


def torchrun_command(nproc: int, *args: str) -> list[str]:
    """The command line that runs ``args`` on ``nproc`` local ranks, as a user launches it:
    ``python -m torch.distributed.run --standalone --nproc-per-node=N ARGS`` (``ARGS`` e.g. ``-m gradian index ...``).
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *args]


def assert_json_schema(value, schema: dict, path: str = "$") -> None:
    """Assert that ``value`` fits ``schema``: a small validator for the subset of JSON Schema that Gradian's
    schemas use (``type``, ``enum``, ``required``, ``properties``, ``additionalProperties: false``, ``items``,
    ``prefixItems``). The assertion message names the path of the first misfit (``$.capabilities[0].n``)."""
    types = schema.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        py = {
            "string": str,
            "integer": int,
            "number": (int, float),
            "boolean": bool,
            "object": dict,
            "array": list,
            "null": type(None),
        }
        ok = any(
            isinstance(value, py[t]) and not (t in ("integer", "number") and isinstance(value, bool)) for t in types
        )
        assert ok, f"{path}: {value!r} is not {types}"
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if isinstance(value, dict):
        for k in schema.get("required", []):
            assert k in value, f"{path}: missing {k}"
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False:
            extra = set(value) - set(props)
            assert not extra, f"{path}: unexpected {extra}"
        for k, v in value.items():
            if k in props:
                assert_json_schema(v, props[k], f"{path}.{k}")
    if isinstance(value, list):
        if "prefixItems" in schema:
            for i, (v, sub) in enumerate(zip(value, schema["prefixItems"])):
                assert_json_schema(v, sub, f"{path}[{i}]")
        elif "items" in schema:
            for i, v in enumerate(value):
                assert_json_schema(v, schema["items"], f"{path}[{i}]")


def assert_one_line_error(res, needle: str, *, text: str | None = None, fix: str | None = "fix:", starts: str = ""):
    """Assert that the CLI result ``res`` (a :class:`typer.testing.Result`) is a user error as Gradian reports one:
    exit code 2, no traceback in its output, and ``text`` (its output unless given, e.g. ``res.stderr``) one
    non-blank line that holds ``needle``, holds ``fix`` (unless None) and starts with ``starts``. Returns the line."""
    assert res.exit_code == 2, res.output
    out = res.output if text is None else text
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], out
    assert (fix is None or fix in lines[0]) and lines[0].startswith(starts), out
    assert "Traceback" not in res.output
    return lines[0]


#: ChatML whose assistant turns (content and end of turn) stand in a ``{% generation %}`` block (assistant masks),
#: the shape of TRL's training templates (chat_templates/qwen2_5_training.jinja); no generation prompt.
CHATML_GEN_TURNS = (
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant\n{% generation %}"
    "{{ m['content'] }}<|im_end|>{% endgeneration %}\n{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endif %}{% endfor %}"
)
#: :data:`CHATML_GEN_TURNS` with the generation prompt (``add_generation_prompt`` opens an assistant turn).
CHATML_GEN = CHATML_GEN_TURNS + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
