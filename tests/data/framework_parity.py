"""axolotl, LLaMA-Factory and torchtune tokenisation, written from their source at a named version (none of them
installs here: their wheels were downloaded with ``pip download --no-deps`` and read, never imported or vendored).

Each ``*_rows`` function gives ``{row id: (input_ids, labels)}`` the way that framework builds them for ChatML chat
rows, with the test's tokenizer standing in for the model's (its ``encode`` where the framework encodes a piece of
text on its own, ``apply_chat_template`` where the framework renders the whole conversation). Sources:

* **axolotl 0.19.0** ``axolotl/prompt_strategies/chat_template.py``, ``ChatTemplateStrategy._tokenize_single_prompt``:
  ``input_ids`` = the whole conversation through the tokenizer's chat template; a turn is trained when
  ``train_on_inputs`` or its role is in ``roles_to_train`` (default ``["assistant"]``); a trained turn's labels are its
  *content* tokens (``find_turn``); the first EOS token within 3 tokens after the content is trained when
  ``train_on_eos`` is ``"turn"`` (default) and the turn is trained, or ``"all"``; ``"last"`` trains the last one.
* **LLaMA-Factory 0.9.5** ``llamafactory/data/processor/supervised.py`` ``SupervisedDatasetProcessor.
  _encode_data_example`` with ``llamafactory/data/template.py`` (``qwen`` template: system
  ``<|im_start|>system\\n{c}<|im_end|>\\n``, user ``<|im_start|>user\\n{c}<|im_end|>\\n<|im_start|>assistant\\n``,
  assistant ``{c}<|im_end|>\\n``, each element encoded on its own, ``_convert_elements_to_ids``): per
  (source, target) pair, the source is masked unless ``train_on_prompt``; the target is trained unless
  ``mask_history`` and it is not the last turn; each pair is cut by ``processor_utils.infer_seqlen`` to the budget
  left of ``cutoff_len`` (turns taken last-first under ``mask_history``).
* **torchtune 0.6.1** ``torchtune/models/qwen2/_tokenizer.py`` ``Qwen2Tokenizer.tokenize_messages`` with
  ``torchtune/data/_messages.py`` (``OpenAIToMessages``: a message is masked when
  ``role != "assistant" and not train_on_input``) and ``torchtune/datasets/_sft.py`` (labels = tokens where
  not masked): each message is ``<|im_start|>`` + ``encode(role + "\\n")`` + ``encode(content)`` + (``<|im_end|>``
  + ``encode("\\n")``, except after the last assistant message),
  every token of it under the message's mask (header included); then EOS with the last
  message's mask; ``max_seq_len``: ``torchtune/data/_utils.py`` ``truncate`` keeps the start and writes EOS over the
  last token.
"""

from __future__ import annotations

IGNORE = -100
SYSTEM = "Answer briefly."
FACTS = [("Aland", "Marven"), ("Borvia", "Quisto"), ("Caldor", "Tressa"), ("Dunmark", "Olvey")]


def rows(turns: int = 1) -> list[dict]:
    """``messages`` rows with a system turn and ``turns`` user/assistant exchanges."""
    out = []
    for i, (c, k) in enumerate(FACTS):
        msgs = [{"role": "system", "content": SYSTEM}]
        for t in range(turns):
            msgs.append({"role": "user", "content": f"What is the capital of {c}?" if t == 0 else "And again?"})
            msgs.append({"role": "assistant", "content": f"It is {k}." if t == 0 else f"Still {k}, of {c}."})
        out.append({"id": f"r{i}", "messages": msgs})
    return out


def _enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


# ----------------------------------------------------------------------------- axolotl 0.19.0
def axolotl_rows(rs, tok, *, train_on_inputs=False, roles_to_train=("assistant",), train_on_eos="turn") -> dict:
    """``{id: (input_ids, labels)}`` by axolotl's chat_template strategy (module docstring)."""
    out = {}
    for r in rs:
        msgs = r["messages"]
        text = tok.apply_chat_template(msgs, tokenize=False)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offs = list(enc["input_ids"]), list(enc["offset_mapping"])
        labels = [IGNORE] * len(ids)
        last_eos = -1
        pos = 0
        for m in msgs:
            a = text.index(m["content"], pos)  # find_turn: the turn's content tokens
            b = a + len(m["content"])
            pos = b
            train = train_on_inputs or m["role"] in roles_to_train
            toks = [t for t, (s, e) in enumerate(offs) if s < b and e > a]
            if train:
                for t in toks:
                    labels[t] = ids[t]
            end = toks[-1] + 1
            eos = next((t for t in range(end, len(ids)) if ids[t] == tok.eos_token_id), -1)
            if eos != -1 and eos - end <= 3:
                last_eos = eos
                if train_on_eos == "all" or (train_on_eos == "turn" and train):
                    labels[eos] = ids[eos]
        if train_on_eos == "last" and last_eos != -1:
            labels[last_eos] = ids[last_eos]
        out[r["id"]] = (ids, labels)
    return out


# ----------------------------------------------------------------------------- LLaMA-Factory 0.9.5
def _infer_seqlen(source_len: int, target_len: int, cutoff_len: int) -> tuple[int, int]:
    """``llamafactory/data/processor/processor_utils.py`` ``infer_seqlen`` (0.9.5), as written there."""
    if target_len * 2 < cutoff_len:
        max_target_len = cutoff_len
    elif source_len * 2 < cutoff_len:
        max_target_len = cutoff_len - source_len
    else:
        max_target_len = int(cutoff_len * (target_len / (source_len + target_len)))
    new_target_len = min(max_target_len, target_len)
    new_source_len = min(max(cutoff_len - new_target_len, 0), source_len)
    return new_source_len, new_target_len


def llamafactory_rows(rs, tok, *, train_on_prompt=False, mask_history=False, cutoff_len=2048) -> dict:
    """``{id: (input_ids, labels)}`` by LLaMA-Factory's supervised processor, ``qwen`` template (module docstring)."""
    out = {}
    for r in rs:
        msgs = r["messages"]
        system = msgs[0]["content"] if msgs[0]["role"] == "system" else None
        turns = [m for m in msgs if m["role"] != "system"]
        encoded = []
        for i, m in enumerate(turns):
            ids = []
            if i == 0 and system:
                ids += _enc(tok, f"<|im_start|>system\n{system}<|im_end|>\n")
            if m["role"] == "user":
                ids += _enc(tok, f"<|im_start|>user\n{m['content']}<|im_end|>\n<|im_start|>assistant\n")
            else:
                ids += _enc(tok, f"{m['content']}<|im_end|>\n")
            encoded.append(ids)
        pairs = [(encoded[i], encoded[i + 1]) for i in range(0, len(encoded), 2)]
        if mask_history:
            pairs = pairs[::-1]
        input_ids, labels, total = [], [], 0
        for k, (src, tgt) in enumerate(pairs):
            if total >= cutoff_len:
                break
            sl, tl = _infer_seqlen(len(src), len(tgt), cutoff_len - total)
            src, tgt = src[:sl], tgt[:tl]
            total += sl + tl
            src_lab = list(src) if train_on_prompt else [IGNORE] * sl
            tgt_lab = [IGNORE] * tl if (mask_history and k != 0) else list(tgt)
            if mask_history:
                input_ids, labels = src + tgt + input_ids, src_lab + tgt_lab + labels
            else:
                input_ids, labels = input_ids + src + tgt, labels + src_lab + tgt_lab
        out[r["id"]] = (input_ids, labels)
    return out


# ----------------------------------------------------------------------------- torchtune 0.6.1
def torchtune_rows(rs, tok, *, train_on_input=False, max_seq_len=None, eos_token="<|endoftext|>") -> dict:
    """``{id: (input_ids, labels)}`` by torchtune's Qwen2 tokenizer and chat dataset (module docstring)."""
    im_start, im_end = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    eos = tok.convert_tokens_to_ids(eos_token)
    out = {}
    for r in rs:
        msgs = r["messages"]
        tokens, mask = [], []
        for i, m in enumerate(msgs):
            t = [im_start] + _enc(tok, f"{m['role']}\n") + _enc(tok, m["content"])
            if m["role"] != "assistant" or i != len(msgs) - 1:
                t += [im_end] + _enc(tok, "\n")
            tokens += t
            mask += [m["role"] != "assistant" and not train_on_input] * len(t)
            if max_seq_len and len(tokens) >= max_seq_len:
                break
        tokens.append(eos)
        mask.append(mask[-1])
        if max_seq_len:
            tokens, mask = tokens[:max_seq_len], mask[:max_seq_len]
            if tokens[-1] != eos:
                tokens[-1] = eos
            if mask[-1] is not True:
                mask[-1] = True
        out[r["id"]] = (tokens, [IGNORE if k else x for x, k in zip(tokens, mask)])
    return out
