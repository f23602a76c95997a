r"""axolotl's own rendering of instruction rows (axolotl 0.19.0), for the dataset types Gradian reproduces.

axolotl's ``type: chat_template`` rows are rendered with a chat template and masked by
:attr:`gradian.data.tokenize.TokenizeSpec.train_roles`; its instruction types are prompt strategies of their own.

* ``"axolotl_alpaca"`` (``datasets[i].type: alpaca``, ``utils/data/wrappers.py`` ``_handle_alpaca_dataset``):
  ``axolotl/prompters.py`` ``AlpacaPrompter`` (the instruct style) and ``axolotl/prompt_tokenizers.py``
  ``AlpacaPromptTokenizingStrategy`` / ``InstructionPromptTokenizingStrategy.tokenize_prompt``. The prompt is the
  system text, ``"\n\n"`` and the turn: with an ``input``, "Below is an instruction that describes a task, paired
  with an input that provides further context. Write a response that appropriately completes the request." and
  ``"### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"``; without, "Below is an
  instruction that describes a task. Write a response that appropriately completes the request." and
  ``"### Instruction:\n{instruction}\n\n### Response:\n"``. The prompt is tokenised on its own (``_tokenize``: the
  tokenizer's special tokens, BOS included, no EOS) and masked unless ``train_on_inputs``; the ``output`` is
  tokenised on its own, its BOS stripped and EOS appended, and trained.
"""

from __future__ import annotations

from typing import Any

from gradian.data.pieces import PieceBuilder, RuleTokens, alpaca_prompt

IGNORE_INDEX = -100
VERSION = "axolotl 0.19.0"
RULES = ("axolotl_alpaca",)
#: ``datasets[i].type`` -> rule
TYPES = {"alpaca": "axolotl_alpaca"}


def render_tokens(
    raw: dict[str, Any], tokenizer, rule: str, *, loss_on: str, max_length: int | None, where: str
) -> RuleTokens:
    """One alpaca row (``instruction``, optional ``input``, ``output``) as axolotl tokenises it (module docstring).

    Args:
        loss_on: ``"all"`` (``train_on_inputs: true``) or anything else (the prompt masked).
        max_length: not applied here: axolotl drops a row longer than ``sequence_len`` (the setup says so);
            the caller keeps the start.

    Returns:
        :data:`~gradian.data.pieces.RuleTokens` (no truncation: ``full_length`` is ``len(ids)``).
    """
    if rule not in RULES:
        raise ValueError(f"unknown axolotl rule {rule!r}")
    prompt = alpaca_prompt(str(raw.get("instruction", "")), raw.get("input") or None)
    output = str(raw.get("output", ""))
    b = PieceBuilder(tokenizer)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    masked = loss_on != "all"
    if bos is not None and tokenizer(prompt)["input_ids"][:1] == [bos]:  # _tokenize: the tokenizer's own BOS
        b.special(bos, tokenizer.bos_token, masked)
    b.piece(prompt, masked)
    start = b.n
    b.piece(output, False)
    if eos is not None and (not b.ids or b.ids[-1] != eos):  # add_eos_token
        b.special(eos, tokenizer.eos_token, False)
    labels = [IGNORE_INDEX if mk else tid for tid, mk in zip(b.ids, b.mask)]
    return "".join(b.text), start, list(b.ids), labels, list(b.offsets), len(b.ids)
