"""axolotl, LLaMA-Factory and torchtune tokenisation, written from their source at a named version (their wheels were
downloaded with ``pip download --no-deps`` and read, never vendored). Since then the frameworks themselves run in
tests/data/test_frameworks_real.py (``make frameworks``); these rules stay as the suite's fast, install-free check
and as the frameworks' rules in readable form.

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
  every token of it under the message's mask (header included); then EOS (``<|im_end|>``, the class's default
  ``eos_token``) with the last message's mask; ``max_seq_len``: ``torchtune/data/_utils.py`` ``truncate`` keeps the
  start and writes EOS over the last token, and the mask's last entry becomes True (on every row, whenever
  ``max_seq_len`` is set). ``torchtune/models/llama3/_tokenizer.py`` ``Llama3Tokenizer.tokenize_messages``: BOS
  (masked), each message ``<|start_header_id|>`` + role + ``<|end_header_id|>`` + ``"\\n\\n"`` + stripped
  content + ``<|eot_id|>``, then ``<|end_of_text|>`` (masked).
"""

from __future__ import annotations

from gradian.data.llamafactory_rules import infer_seqlen  # processor_utils.infer_seqlen, as written there

IGNORE = -100
SYSTEM = "Answer briefly."
FACTS = [("Aland", "Marven"), ("Borvia", "Quisto"), ("Caldor", "Tressa"), ("Dunmark", "Olvey")]


def rows(turns: int = 1, system: bool = True) -> list[dict]:
    """``messages`` rows with a system turn (unless ``system`` is false) and ``turns`` user/assistant exchanges."""
    out = []
    for i, (c, k) in enumerate(FACTS):
        msgs = [{"role": "system", "content": SYSTEM}] if system else []
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
            sl, tl = infer_seqlen(len(src), len(tgt), cutoff_len - total)
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
def _tt_truncate(tokens: list, max_seq_len: int, eos_id) -> list:
    """``torchtune/data/_utils.py`` ``truncate`` (0.6.1), as written there."""
    tokens_truncated = tokens[:max_seq_len]
    if eos_id is not None and tokens_truncated[-1] != eos_id:
        tokens_truncated[-1] = eos_id
    return tokens_truncated


def _tt_masked(m: dict, train_on_input: bool) -> bool:
    """``torchtune/data/_messages.py`` ``OpenAIToMessages.__call__``: ``masked = (role != "assistant") and not
    train_on_input``."""
    return (m["role"] != "assistant") and (not train_on_input)


def _tt_labels(tokens: list, mask: list) -> list:
    """``torchtune/datasets/_sft.py`` ``SFTDataset._prepare_sample``: ``np.where(mask, CROSS_ENTROPY_IGNORE_IDX,
    tokens)``."""
    return [IGNORE if k else x for x, k in zip(tokens, mask)]


def torchtune_rows(rs, tok, *, train_on_input=False, max_seq_len=None) -> dict:
    """``{id: (input_ids, labels)}`` by torchtune's Qwen2 tokenizer (``torchtune/models/qwen2/_tokenizer.py``
    ``Qwen2Tokenizer.tokenize_messages``) and chat dataset. Its EOS is ``<|im_end|>``: ``Qwen2Tokenizer.__init__``
    has ``eos_token: str = IM_END`` (the docstring's ``<|endoftext|>`` is not what the code does), and
    ``qwen2_tokenizer`` / ``qwen2_5_tokenizer`` pass no other."""
    im_start_id, im_end_id = tok.convert_tokens_to_ids("<|im_start|>"), tok.convert_tokens_to_ids("<|im_end|>")
    eos_id = im_end_id
    out = {}
    for r in rs:
        messages = r["messages"]
        tokenized_messages, mask = [], []
        for index, message in enumerate(messages):
            masked = _tt_masked(message, train_on_input)
            tokens = [im_start_id] + _enc(tok, f"{message['role']}\n")  # message header
            tokens += _enc(tok, message["content"])  # message content
            if message["role"] != "assistant" or index != len(messages) - 1:  # message footer
                tokens += [im_end_id] + _enc(tok, "\n")
            tokenized_messages.extend(tokens)
            mask.extend([masked] * len(tokens))
            if max_seq_len and len(tokenized_messages) >= max_seq_len:
                break
        tokenized_messages.append(eos_id)  # add_eos=True
        mask.append(mask[-1])
        if max_seq_len:
            tokenized_messages = _tt_truncate(tokenized_messages, max_seq_len, eos_id)
            mask = _tt_truncate(mask, max_seq_len, True)
        out[r["id"]] = (tokenized_messages, _tt_labels(tokenized_messages, mask))
    return out


#: the Llama-3 special tokens torchtune's ``Llama3Tokenizer`` writes (``LLAMA3_SPECIAL_TOKENS``)
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def torchtune_llama3_rows(rs, tok, *, train_on_input=False, max_seq_len=None) -> dict:
    """``{id: (input_ids, labels)}`` by torchtune's ``torchtune/models/llama3/_tokenizer.py``
    ``Llama3Tokenizer.tokenize_messages`` (``_tokenize_header`` / ``_tokenize_body`` / ``_tokenize_end``, with
    ``add_end_tokens=True``) and chat dataset; ``tok`` must hold :data:`LLAMA3_TOKENS`."""
    bos_id, eos_id, start_header_id, end_header_id, eot_id = (tok.convert_tokens_to_ids(t) for t in LLAMA3_TOKENS)
    out = {}
    for r in rs:
        tokens, mask = [bos_id], [True]  # "bos and eos are always masked"
        for message in r["messages"]:
            header = [start_header_id] + _enc(tok, message["role"].strip()) + [end_header_id] + _enc(tok, "\n\n")
            body = _enc(tok, message["content"].strip())
            tokenized_message = header + body + [eot_id]  # message.eot defaults to True
            tokens = tokens + tokenized_message
            mask = mask + [_tt_masked(message, train_on_input)] * len(tokenized_message)
            if max_seq_len and len(tokens) >= max_seq_len:
                break
        tokens = tokens + [eos_id]
        mask = mask + [True]
        if max_seq_len:
            tokens = _tt_truncate(tokens, max_seq_len, eos_id)
            mask = _tt_truncate(mask, max_seq_len, True)
        out[r["id"]] = (tokens, _tt_labels(tokens, mask))
    return out
