"""Tiny from-config models and in-process trained tokenizers.

Used by the test-suite and by the tiny worked-example world: real
architectures (Llama, GPT-2) at a size that trains in seconds on a CPU, with a
byte-level BPE tokenizer trained on the given corpus and a ChatML chat template.
"""

from __future__ import annotations

from typing import Iterable, Literal

import torch

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 512, bos: bool = False):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``corpus``.

    EOS is ``<|im_end|>`` (the ChatML end of turn, as in SmolLM2), pad is a
    separate ``<pad>`` token, and BOS (``<|endoftext|>``) is prepended only when
    ``bos`` is true.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(list(corpus), trainer=trainer)
    if bos:
        bos_id = tk.token_to_id("<|endoftext|>")
        tk.post_processor = processors.TemplateProcessing(
            single="<|endoftext|> $A", pair="<|endoftext|> $A $B", special_tokens=[("<|endoftext|>", bos_id)]
        )
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        bos_token="<|endoftext|>",
        unk_token=None,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def tiny_model(
    tokenizer,
    arch: Literal["llama", "gpt2"] = "llama",
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    max_positions: int = 256,
    attn: str = "sdpa",
):
    """A randomly initialised causal LM sized to ``tokenizer``, in eval mode.

    ``attn="sdpa"`` (default) computes attention in the model dtype; Llama's
    ``"eager"`` path runs its softmax in float32 even for a float64 model.
    """
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    V = len(tokenizer)
    common = dict(
        vocab_size=V,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "llama":
        cfg = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            **common,
        )
        model = LlamaForCausalLM(cfg)
    elif arch == "gpt2":
        cfg = GPT2Config(
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
        model = GPT2LMHeadModel(cfg)
    else:
        raise ValueError(f"unknown arch {arch!r}")
    model.config._attn_implementation = attn
    model.to(dtype)
    model.eval()
    return model


def default_targets(arch: str, mlp: bool = True) -> list[str]:
    """LoRA target module names for the tiny models: attention, and the MLP when ``mlp``."""
    if arch == "gpt2":
        return ["c_attn", "c_proj", "c_fc"] if mlp else ["c_attn"]
    return ["q_proj", "k_proj", "v_proj", "o_proj"] + (["gate_proj", "up_proj", "down_proj"] if mlp else [])
