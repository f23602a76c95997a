"""A row built piece by piece, as trainers that do not render a chat template build it (torchtune's model
tokenizers, LLaMA-Factory's templates): each piece of text is encoded on its own and special tokens are placed by id,
so the ids can differ from encoding the joined text at once. Shared by :mod:`gradian.data.torchtune_rules` and
:mod:`gradian.data.llamafactory_rules`.
"""

from __future__ import annotations

from gradian.errors import GradianUserError

#: what a trainer rule's ``render_tokens`` returns: ``(text, completion_char_start, ids, labels, offsets,
#: full_length)``; ids / labels / offsets are (t,) after the rule's truncation, ``full_length`` the count before it
RuleTokens = tuple[str, int, list[int], list[int], list[tuple[int, int]], int]


def special_id(tokenizer, token: str, who: str, where: str) -> int:
    """The id of ``token`` in ``tokenizer``; a one-line error naming ``who`` (the trainer's rule that writes it) when
    the tokenizer does not hold it.
    """
    tid = tokenizer.convert_tokens_to_ids(token)
    if tid is None or (tid == tokenizer.unk_token_id and token != tokenizer.unk_token):
        raise GradianUserError(
            f"the tokenizer has no {token} token, which {who} writes",
            where=where,
            fix="pass the tokenizer of the model the run trained (the one its template or tokenizer family is for)",
        )
    return int(tid)


class PieceBuilder:
    """Ids, character offsets and per-token mask of a row, piece by piece.

    Attributes:
        text: the pieces in order (their join is the row's text; offsets index into it).
        ids, offsets, mask: (t,) token ids, ``(start, end)`` character offsets and ``True`` where masked.
    """

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.text: list[str] = []
        self.n = 0  # characters so far
        self.ids: list[int] = []
        self.offsets: list[tuple[int, int]] = []
        self.mask: list[bool] = []

    def special(self, tid: int, s: str, masked: bool) -> None:
        """One token placed by id, written as ``s`` in the text."""
        self.ids.append(tid)
        self.offsets.append((self.n, self.n + len(s)))
        self.mask.append(masked)
        self.text.append(s)
        self.n += len(s)

    def piece(self, s: str, masked: bool) -> None:
        """``s`` encoded on its own (``add_special_tokens=False``: added tokens inside it are matched as tokens)."""
        if not s:
            return
        enc = self.tok(s, add_special_tokens=False, return_offsets_mapping=True)
        self.ids += list(enc["input_ids"])
        self.offsets += [(self.n + a, self.n + b) for a, b in enc["offset_mapping"]]
        self.mask += [masked] * len(enc["input_ids"])
        self.text.append(s)
        self.n += len(s)


_SYSTEM = (
    "Below is an instruction that describes a task, paired with an input that provides further context. Write a "
    "response that appropriately completes the request."
)
_SYSTEM_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request."
)


def alpaca_prompt(instruction: str, input_text: str | None) -> str:
    """The Stanford Alpaca prompt the output follows, as axolotl 0.19.0 (``prompters.py`` ``AlpacaPrompter``, instruct
    style) and torchtune 0.6.1 (``data/_messages.py`` ``AlpacaToMessages``) both write it: with an input, or without.
    """
    if input_text:
        return f"{_SYSTEM}\n\n### Instruction:\n{instruction}\n\n### Input:\n{input_text}\n\n### Response:\n"
    return f"{_SYSTEM_NO_INPUT}\n\n### Instruction:\n{instruction}\n\n### Response:\n"
