r"""LLaMA-Factory's own rendering, loss mask and truncation of SFT rows (LLaMA-Factory 0.9.5), for the templates it
registers that Gradian reproduces.

LLaMA-Factory never renders a row with the tokenizer's Jinja chat template: ``template: <name>`` picks one of its
registered templates (``llamafactory/data/template.py`` ``register_template``), whose formatters turn each message
into *slots* (strings with ``{{content}}``, and the BOS / EOS tokens), and ``Template._encode`` encodes each string
slot on its own (``_convert_elements_to_ids``: ``tokenizer.encode(slot, add_special_tokens=False)``). The first
message is preceded by the template's prefix and, when there is a system text, the system slots; the system text is
the row's own, else the template's ``default_system`` (``system = system or self.default_system``), which the
config's ``default_system`` replaces when it sets one (``get_template_and_fix_tokenizer``). So a row with no
system turn is trained with a system prompt it never had whenever the template has a default one: ``qwen`` writes
"You are Qwen, created by Alibaba Cloud. You are a helpful assistant." whatever the model.

``llamafactory/data/processor/supervised.py`` ``SupervisedDatasetProcessor._encode_data_example`` then pairs the
messages (user, assistant), and per pair: the source (the user's slots, the prefix and system on the first) is masked
unless ``train_on_prompt``; the target (the assistant's slots, its end of turn included) is trained unless
``mask_history`` and it is not the last pair; each pair is cut by ``processor_utils.infer_seqlen`` to the budget left
of ``cutoff_len``, pairs taken last-first under ``mask_history``. A template with ``replace_eos`` writes its first
stop word wherever a slot asks for EOS (``fix_special_tokens`` makes it the tokenizer's EOS).

LLaMA-Factory's alpaca rows (``AlpacaDatasetConverter``) are one user message, ``instruction`` and ``input`` joined
by ``"\n"`` (either left out when empty), and one assistant message, ``output``.

Reproduced: the templates of :data:`TEMPLATES` (the plain ``Template`` class; ``llama2`` / ``mistral`` / ``gemma``
merge the system into the first user message and ``qwen3`` / ``deepseek3``-style reasoning templates edit the
thinking part, so they are not listed) and rows of system / user / assistant text messages in that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from gradian.data.pieces import PieceBuilder, RuleTokens, special_id
from gradian.errors import GradianUserError

IGNORE_INDEX = -100
VERSION = "LLaMA-Factory 0.9.5"
BOS, EOS = ("bos_token",), ("eos_token",)  # a slot that is a token, not text (LLaMA-Factory's {"bos_token"} sets)
_CHATML = dict(
    system=("<|im_start|>system\n{{content}}<|im_end|>\n",),
    user=("<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n",),
    assistant=("{{content}}<|im_end|>\n",),
    stop_words=("<|im_end|>",),
)


@dataclass(frozen=True)
class LFTemplate:
    """One registered template's slots (``register_template``'s defaults where the entry sets none: user and system
    ``{{content}}``, assistant ``{{content}}`` + EOS, no prefix).
    """

    user: tuple = ("{{content}}",)
    assistant: tuple = ("{{content}}", EOS)
    system: tuple = ("{{content}}",)
    prefix: tuple = ()
    default_system: str = ""
    stop_words: tuple[str, ...] = ()
    replace_eos: bool = False


#: ``template:`` name -> its slots, from LLaMA-Factory 0.9.5 ``llamafactory/data/template.py``
TEMPLATES: dict[str, LFTemplate] = {
    "qwen": LFTemplate(
        **_CHATML,
        replace_eos=True,
        default_system="You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    ),
    "qwen3_nothink": LFTemplate(**_CHATML, replace_eos=True),
    "chatml": LFTemplate(**{**_CHATML, "stop_words": ("<|im_end|>", "<|im_start|>")}, replace_eos=True),
    "smollm": LFTemplate(**_CHATML),
    "smollm2": LFTemplate(
        **_CHATML, default_system="You are a helpful AI assistant named SmolLM, trained by Hugging Face."
    ),
    "llama3": LFTemplate(
        system=("<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>",),
        user=(
            "<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
        assistant=("{{content}}<|eot_id|>",),
        prefix=(BOS,),
        stop_words=("<|eot_id|>", "<|eom_id|>"),
        replace_eos=True,
    ),
    "phi": LFTemplate(
        system=("<|system|>\n{{content}}<|end|>\n",),
        user=("<|user|>\n{{content}}<|end|>\n<|assistant|>\n",),
        assistant=("{{content}}<|end|>\n",),
        stop_words=("<|end|>",),
        replace_eos=True,
    ),
    "alpaca": LFTemplate(
        user=("### Instruction:\n{{content}}\n\n### Response:\n",),
        assistant=("{{content}}", EOS, "\n\n"),
        default_system=(
            "Below is an instruction that describes a task. Write a response that appropriately completes the "
            "request.\n\n"
        ),
    ),
    "vicuna": LFTemplate(
        user=("USER: {{content}} ASSISTANT:",),
        default_system=(
            "A chat between a curious user and an artificial intelligence assistant. "
            "The assistant gives helpful, detailed, and polite answers to the user's questions."
        ),
    ),
    "default": LFTemplate(
        user=("Human: {{content}}", EOS, "\nAssistant:"),
        assistant=("{{content}}", EOS, "\n"),
        system=("System: {{content}}", EOS, "\n"),
    ),
    "empty": LFTemplate(assistant=("{{content}}",)),
}
#: the rule names a :class:`gradian.data.tokenize.TokenizeSpec` takes
RULES = tuple(f"llamafactory_{name}" for name in TEMPLATES)


def rule_for_template(name: Any) -> str | None:
    """The rule of a config's ``template:`` name, or None when Gradian does not reproduce that template."""
    name = str(name).strip() if name else ""
    return f"llamafactory_{name}" if name in TEMPLATES else None


def infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """``(source, target)`` lengths kept of a pair within ``cutoff_len`` (``processor_utils.infer_seqlen``): the
    target keeps up to ``cutoff_len`` when it is under half of it, else what the source leaves when the source is
    under half, else its share ``cutoff_len * t / (s + t)``; the source keeps what is left.
    """
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def alpaca_messages(raw: dict[str, Any]) -> list[dict[str, str]]:
    r"""An alpaca row as LLaMA-Factory's ``AlpacaDatasetConverter`` makes it: one user message (``instruction`` and
    ``input`` joined by ``"\n"``, an empty one left out) and one assistant message (``output``).
    """
    query = [str(raw[k]) for k in ("instruction", "input") if raw.get(k)]
    return [{"role": "user", "content": "\n".join(query)}, {"role": "assistant", "content": str(raw.get("output", ""))}]


def _slots(b: PieceBuilder, slots: tuple, content: str, tokens: dict[str, tuple[int | None, str | None]]) -> int:
    """Append ``slots`` (``{{content}}`` replaced once) to ``b``; the character where ``content`` starts.
    ``tokens``: ``{"bos_token" / "eos_token": (id, text)}`` (id None: the tokenizer has none, so nothing is written,
    as in ``_convert_elements_to_ids``).
    """
    start = b.n
    for slot in slots:
        if slot is BOS or slot is EOS:
            tid, text = tokens[slot[0]]
            if tid is not None:
                b.special(tid, text or "", True)
            continue
        if "{{content}}" in slot:
            start = b.n + slot.index("{{content}}")
        b.piece(slot.replace("{{content}}", content, 1), True)
    return start


def render_tokens(
    messages: Sequence[dict[str, Any]],
    tokenizer,
    rule: str,
    *,
    loss_on: str,
    max_length: int | None,
    where: str,
    default_system: str | None = None,
) -> RuleTokens:
    """One row as LLaMA-Factory's supervised processor builds it (module docstring).

    Args:
        messages: ``[{"role", "content"}, ...]``: an optional first system message, then user / assistant pairs.
        rule: one of :data:`RULES`.
        loss_on: ``"assistant"`` (every assistant turn: ``train_on_prompt`` and ``mask_history`` false),
            ``"completion"`` (``mask_history: true``: the last assistant turn, pairs truncated last-first) or
            ``"all"`` (``train_on_prompt: true``: every token).
        max_length: ``cutoff_len``, or None (no truncation).
        default_system: the config's ``default_system`` (``get_template_and_fix_tokenizer`` puts it in place of the
            template's), or None.

    Returns:
        :data:`~gradian.data.pieces.RuleTokens`.
    """
    if rule not in RULES:
        raise ValueError(f"unknown LLaMA-Factory rule {rule!r}")
    tpl = TEMPLATES[rule.split("_", 1)[1]]
    msgs = list(messages)
    system = ""
    if msgs and msgs[0].get("role") == "system":
        system = msgs.pop(0).get("content")
    for i, m in enumerate(msgs):
        want = "user" if i % 2 == 0 else "assistant"
        if m.get("role") != want or not isinstance(m.get("content"), str) or not isinstance(system, str):
            raise GradianUserError(
                f"LLaMA-Factory's rule is reproduced for a system message then user/assistant text pairs; message "
                f"{i + 1} is {m.get('role')!r} where LLaMA-Factory reads {want!r}",
                where=where,
                fix="give rows that alternate user and assistant messages, or --loss-on to pick Gradian's rule",
            )
    if len(msgs) % 2:
        raise GradianUserError(
            "LLaMA-Factory trains a row as user/assistant pairs; this one ends with a user message",
            where=where,
            fix="end each row with the assistant's answer",
        )
    system = system or (tpl.default_system if default_system is None else default_system)
    eos_tok = tpl.stop_words[0] if tpl.replace_eos and tpl.stop_words else tokenizer.eos_token
    tokens = {"bos_token": (tokenizer.bos_token_id, tokenizer.bos_token), "eos_token": (None, None)}
    if eos_tok is not None and any(EOS in (tpl.user, tpl.assistant, tpl.system, tpl.prefix)[k] for k in range(4)):
        who = f"{VERSION}'s {rule.split('_', 1)[1]} template"
        tokens["eos_token"] = (special_id(tokenizer, eos_tok, who, where), eos_tok)
    b = PieceBuilder(tokenizer)
    bounds = [0]  # token index where each message starts, then the end
    comp_start = 0
    for i, m in enumerate(msgs):
        if i == 0:
            _slots(b, tpl.prefix, "", tokens)
            if system:
                _slots(b, tpl.system, system, tokens)
        slots = tpl.user if m["role"] == "user" else tpl.assistant
        start = _slots(b, slots, m["content"], tokens)
        if m["role"] == "assistant":
            comp_start = start
        bounds.append(len(b.ids))
    pairs = [(range(bounds[k], bounds[k + 1]), range(bounds[k + 1], bounds[k + 2])) for k in range(0, len(msgs), 2)]
    full = len(b.ids)
    history = loss_on == "completion"  # mask_history
    order = list(range(len(pairs)))[::-1] if history else list(range(len(pairs)))
    kept: dict[int, tuple[list[int], list[int]]] = {}  # pair -> (token indexes kept, their labels' mask)
    total = 0
    for turn, k in enumerate(order):
        src, tgt = pairs[k]
        if max_length is not None and total >= max_length:
            break
        sl, tl = (len(src), len(tgt)) if max_length is None else infer_seqlen(len(src), len(tgt), max_length - total)
        total += sl + tl
        src_masked = loss_on != "all"
        tgt_masked = history and turn != 0
        kept[k] = (list(src[:sl]) + list(tgt[:tl]), [src_masked] * sl + [tgt_masked] * tl)
    index: list[int] = []
    masked: list[bool] = []
    for k in sorted(kept):
        index += kept[k][0]
        masked += kept[k][1]
    out_ids = [b.ids[t] for t in index]
    labels = [IGNORE_INDEX if mk else tid for tid, mk in zip(out_ids, masked)]
    return "".join(b.text), comp_start, out_ids, labels, [b.offsets[t] for t in index], full
