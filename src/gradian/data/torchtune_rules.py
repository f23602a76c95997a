r"""torchtune's own chat rendering and loss mask (torchtune 0.6.1), for the tokenizer families it ships that Gradian
reproduces.

torchtune does not render ``messages`` rows with an HF chat template: its model tokenizer's ``tokenize_messages``
builds the ids piece by piece, and the dataset (``torchtune/datasets/_sft.py`` ``SFTDataset``) writes
``labels = tokens where not mask, -100 elsewhere``. A message is masked when ``role != "assistant" and not
train_on_input`` (``torchtune/data/_messages.py`` ``OpenAIToMessages.__call__``); every token of a message, its
header included, carries the message's mask. Rules (read from the 0.6.1 wheel's source, never imported):

* ``"torchtune_qwen2"``: ``torchtune/models/qwen2/_tokenizer.py`` ``Qwen2Tokenizer.tokenize_messages`` (and
  ``torchtune/models/qwen2_5/_tokenizer.py`` ``Qwen2_5Tokenizer``, the same for system/user/assistant messages).
  Each message is ``<|im_start|>`` + ``encode(role + "\n")`` + ``encode(content)`` + ``<|im_end|>`` +
  ``encode("\n")``, except that the last message, when it is the assistant's, has no footer; then EOS with the last
  message's mask. The EOS is ``<|im_end|>`` (``Qwen2Tokenizer.__init__``: ``eos_token=IM_END``).
* ``"torchtune_llama3"``: ``torchtune/models/llama3/_tokenizer.py`` ``Llama3Tokenizer.tokenize_messages``:
  ``<|begin_of_text|>`` (masked), then per message ``<|start_header_id|>`` + ``encode(role.strip())`` +
  ``<|end_header_id|>`` + ``encode("\n\n")`` + ``encode(content.strip())`` + ``<|eot_id|>``; then
  ``<|end_of_text|>``, masked.
* ``max_seq_len`` (``eos_truncate``): ``torchtune/data/_utils.py`` ``truncate`` keeps the first ``max_seq_len``
  tokens and writes EOS over the last one unless it is EOS; the mask is cut the same way with ``True`` over its last
  entry. It runs whenever the recipe sets ``max_seq_len``, so even a row that fits has its final EOS masked.

The row's text is the pieces joined (special tokens as their strings); each piece is encoded on its own, as torchtune
does, with the HF tokenizer of the same vocabulary standing in for torchtune's BPE / tiktoken reader.
"""

from __future__ import annotations

from typing import Any, Sequence

from gradian.data.pieces import PieceBuilder, RuleTokens, special_id
from gradian.errors import GradianUserError

IGNORE_INDEX = -100
#: the rules this module implements
RULES = ("torchtune_qwen2", "torchtune_llama3")
#: ``tokenizer._component_`` of a torchtune 0.6.1 recipe -> rule (the builders' public and module paths)
COMPONENTS = {
    "torchtune.models.qwen2.qwen2_tokenizer": "torchtune_qwen2",
    "torchtune.models.qwen2._model_builders.qwen2_tokenizer": "torchtune_qwen2",
    "torchtune.models.qwen2_5.qwen2_5_tokenizer": "torchtune_qwen2",
    "torchtune.models.qwen2_5._model_builders.qwen2_5_tokenizer": "torchtune_qwen2",
    "torchtune.models.llama3.llama3_tokenizer": "torchtune_llama3",
    "torchtune.models.llama3._model_builders.llama3_tokenizer": "torchtune_llama3",
}
#: where each rule is written in torchtune 0.6.1
SOURCES = {
    "torchtune_qwen2": "torchtune 0.6.1 models/qwen2/_tokenizer.py Qwen2Tokenizer.tokenize_messages",
    "torchtune_llama3": "torchtune 0.6.1 models/llama3/_tokenizer.py Llama3Tokenizer.tokenize_messages",
}
_QWEN = ("<|im_start|>", "<|im_end|>")
_LLAMA3 = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>")


def rule_for_component(component: Any) -> str | None:
    """The rule of a recipe's ``tokenizer._component_``, or None when Gradian does not implement that family."""
    return COMPONENTS.get(str(component).strip()) if component else None


def _special_id(tokenizer, token: str, rule: str, where: str) -> int:
    return special_id(tokenizer, token, f"torchtune's {rule.split('_', 1)[1]} tokenizer", where)


def render_tokens(
    messages: Sequence[dict[str, Any]],
    tokenizer,
    rule: str,
    *,
    loss_on: str,
    max_length: int | None,
    where: str,
) -> RuleTokens:
    """One chat row as torchtune builds it (module docstring).

    Args:
        messages: ``[{"role", "content"}, ...]`` (system / user / assistant).
        rule: one of :data:`RULES`.
        loss_on: ``"assistant"`` (torchtune's ``train_on_input: false``: assistant messages trained), ``"all"``
            (``train_on_input: true``: every message) or ``"completion"`` (a ``--loss-on completion`` flag: the last
            assistant message only).
        max_length: torchtune's ``max_seq_len`` (its ``truncate`` applied), or None (the recipe leaves it unset).

    Returns:
        :data:`~gradian.data.pieces.RuleTokens`.
    """
    if rule not in RULES:
        raise ValueError(f"unknown torchtune rule {rule!r}")
    msgs = list(messages)
    last_asst = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=-1)
    b = PieceBuilder(tokenizer)
    comp_start = 0
    for i, m in enumerate(msgs):
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant") or not isinstance(content, str):
            raise GradianUserError(
                f"torchtune's rule is reproduced for system/user/assistant text messages, not role {role!r}",
                where=where,
                fix="use system/user/assistant messages with string content, or --loss-on to pick Gradian's rule",
            )
        if loss_on == "all":
            masked = False
        elif loss_on == "completion":
            masked = i != last_asst
        else:
            masked = role != "assistant"
        if rule == "torchtune_qwen2":
            start, end = (_special_id(tokenizer, t, rule, where) for t in _QWEN)
            b.special(start, _QWEN[0], masked)
            b.piece(f"{role}\n", masked)
            if i == last_asst:
                comp_start = b.n
            b.piece(content, masked)
            if role != "assistant" or i != len(msgs) - 1:
                b.special(end, _QWEN[1], masked)
                b.piece("\n", masked)
        else:
            bos, sh, eh, eot, _ = (_special_id(tokenizer, t, rule, where) for t in _LLAMA3)
            if i == 0:
                b.special(bos, _LLAMA3[0], True)  # "bos and eos are always masked"
            b.special(sh, _LLAMA3[1], masked)
            b.piece(role.strip(), masked)
            b.special(eh, _LLAMA3[2], masked)
            b.piece("\n\n", masked)
            if i == last_asst:
                comp_start = b.n
            b.piece(content.strip(), masked)
            b.special(eot, _LLAMA3[3], masked)
    if rule == "torchtune_qwen2":
        eos_tok = _QWEN[1]
        b.special(_special_id(tokenizer, eos_tok, rule, where), eos_tok, b.mask[-1] if b.mask else True)
    else:
        eos_tok = _LLAMA3[4]
        b.special(_special_id(tokenizer, eos_tok, rule, where), eos_tok, True)
    ids, mask, offsets = b.ids, b.mask, b.offsets
    full = len(ids)
    if max_length is not None:  # torchtune/data/_utils.py truncate(), on the tokens and on the mask
        eos_id = ids[-1]
        ids, mask, offsets = ids[:max_length], mask[:max_length], offsets[:max_length]
        if ids[-1] != eos_id:
            ids[-1] = eos_id
        mask[-1] = True
    labels = [IGNORE_INDEX if k else t for t, k in zip(ids, mask)]
    return "".join(b.text), comp_start, ids, labels, offsets, full
