"""Fixtures read from the frameworks' published examples (issue 25, "a fixture per case, hand-copied ... with the
source named").

Each config below keeps the settings of one published example file that Audit reads (model, adapter, stage and
its hyper-parameters, datasets and splits, lengths, template), typed out from the file at the commit named; keys
Audit does not read (hub ids, logging, save strategy ...) are left out. Each row builder produces rows with the
field names and nesting of the dataset the example trains on (or of the framework's own demo file), filled with
made-up content of our own.

Sources (read on 2 December 2026):

* AH = huggingface/alignment-handbook @ 925acdfe4b2b4e38c3dabd1851bc418f0b656351 (2025-07-29);
* AX = axolotl-ai-cloud/axolotl @ 067b021c8b87a9e5e380b9173c704cf7340e30f5;
* LF = hiyouga/LLaMA-Factory @ ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30;
* TT = pytorch/torchtune @ bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1;
* TRL = the installed trl 1.16.0 (trl/data_utils.py ``maybe_extract_prompt``'s own example row,
  trl/chat_templates/*_training.jinja) and TRL's SFT docs before 0.20 (completion-only collator recipe).
"""

from __future__ import annotations

from pref_world import kto_items, sharegpt_pair

# ---------------------------------------------------------------------------------------------------- configs
# AH recipes/zephyr-7b-beta/dpo/config_qlora.yaml (case 2: a TRL DPO QLoRA run at 5e-6). The old handbook layout:
# dataset_splits names the train and the eval split (train_prefs trains, test_prefs evaluates).
AH_ZEPHYR_DPO_QLORA = """\
model_name_or_path: alignment-handbook/zephyr-7b-sft-qlora
torch_dtype: bfloat16
attn_implementation: flash_attention_2
use_peft: true
load_in_4bit: true
lora_r: 128
lora_alpha: 128
lora_dropout: 0.05
lora_target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
dataset_mixer:
  HuggingFaceH4/ultrafeedback_binarized: 1.0
dataset_splits:
- train_prefs
- test_prefs
bf16: true
beta: 0.01
do_eval: true
eval_strategy: steps
eval_steps: 100
gradient_accumulation_steps: 4
learning_rate: 5.0e-6
lr_scheduler_type: cosine
max_length: 1024
max_prompt_length: 512
num_train_epochs: 1
optim: paged_adamw_32bit
output_dir: data/zephyr-7b-dpo-qlora
per_device_train_batch_size: 4
warmup_ratio: 0.1
"""

# AH recipes/zephyr-141b-A35b/orpo/config_full.yaml (case 2: ORPO; case 3: the recipe installs its own
# chat_template). The file sets learning_rate 5e-6; ORPOConfig's default applies only without it.
AH_ZEPHYR_ORPO_CHAT_TEMPLATE = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
    "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)
AH_ZEPHYR_ORPO = f"""\
model_name_or_path: mistral-community/Mixtral-8x22B-v0.1
torch_dtype: bfloat16
attn_implementation: flash_attention_2
chat_template: {AH_ZEPHYR_ORPO_CHAT_TEMPLATE!r}
dataset_name: argilla/distilabel-capybara-dpo-7k-binarized
dataset_train_split: train
bf16: true
beta: 0.05
gradient_accumulation_steps: 1
learning_rate: 5.0e-6
lr_scheduler_type: inverse_sqrt
max_length: 2048
max_prompt_length: 1792
num_train_epochs: 3
optim: adamw_bnb_8bit
output_dir: data/zephyr-orpo-141b-A35b
per_device_train_batch_size: 1
warmup_steps: 100
"""

# AH recipes/zephyr-7b-beta/sft/config_qlora.yaml (case 5): the new handbook layout. get_dataset
# (src/alignment/data.py) concatenates every dataset of the mixture, then holds out test_split_size rows at
# random: the ultrachat_200k test_sft split is trained on.
AH_ZEPHYR_SFT_QLORA_MIXTURE = f"""\
model_name_or_path: mistralai/Mistral-7B-v0.1
torch_dtype: bfloat16
attn_implementation: flash_attention_2
load_in_4bit: true
use_peft: true
lora_r: 16
lora_alpha: 16
lora_dropout: 0.05
lora_target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
chat_template: {AH_ZEPHYR_ORPO_CHAT_TEMPLATE!r}
dataset_mixture:
  datasets:
    - id: HuggingFaceH4/ultrachat_200k
      config: default
      split: train_sft
      columns: [messages]
      weight: 1.0
    - id: HuggingFaceH4/ultrachat_200k
      config: default
      split: test_sft
      columns: [messages]
      weight: 1.0
  test_split_size: 1000
  seed: 0
bf16: true
do_eval: true
eval_strategy: epoch
gradient_accumulation_steps: 2
learning_rate: 2.0e-04
lr_scheduler_type: cosine
max_seq_length: 2048
num_train_epochs: 1
output_dir: data/zephyr-7b-sft-qlora
per_device_train_batch_size: 4
warmup_ratio: 0.1
"""

# AH recipes/smollm2/dpo/config.yaml (cases 2 and 5): DPO over a mixture of ultrafeedback_binarized's train_prefs
# and test_prefs splits.
AH_SMOLLM2_DPO_MIXTURE = """\
model_name_or_path: loubnabnl/smollm2-1.7B-sft
torch_dtype: bfloat16
dataset_mixture:
  datasets:
    - id: HuggingFaceH4/ultrafeedback_binarized
      config: default
      split: train_prefs
      columns: [chosen, rejected]
      weight: 1.0
    - id: HuggingFaceH4/ultrafeedback_binarized
      config: default
      split: test_prefs
      columns: [chosen, rejected]
      weight: 1.0
  test_split_size: 2000
  seed: 0
bf16: true
beta: 0.5
do_eval: true
eval_strategy: steps
eval_steps: 100
gradient_accumulation_steps: 8
learning_rate: 1.0e-6
lr_scheduler_type: cosine
max_length: 1024
max_prompt_length: 512
num_train_epochs: 3
optim: adamw_torch
output_dir: data/smollm2-1.7B-dpo
per_device_train_batch_size: 2
warmup_ratio: 0.1
"""

# AH recipes/smollm3/dpo/apo.yaml (cases 2 and 5): DPO with loss_type apo_zero over splits whose names hold no
# "test" (nothing to report for C21).
AH_SMOLLM3_APO = """\
model_name_or_path: HuggingFaceTB/SmolLM3-3B-checkpoints
model_revision: it-SFT
torch_dtype: bfloat16
attn_implementation: flash_attention_2
dataset_mixture:
  datasets:
    - id: HuggingFaceTB/smoltalk2
      config: Preference
      split: llama_3.1_tulu_3_8b_preference_mixture_no_think
      columns: [chosen, rejected, prompt, chat_template_kwargs]
      weight: 0.5
    - id: HuggingFaceTB/smoltalk2
      config: Preference
      split: tulu_3_8b_pref_mix_Qwen3_32B_Qwen3_0.6B_think
      columns: [chosen, rejected, prompt, chat_template_kwargs]
      weight: 0.25
bf16: true
do_eval: false
eval_strategy: 'no'
gradient_accumulation_steps: 2
learning_rate: 1.0e-06
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs:
  min_lr_rate: 0.1
max_grad_norm: 0.2
beta: 0.05
loss_type: apo_zero
max_length: 24576
num_train_epochs: 1
output_dir: data/SmolLM3-DPO
per_device_train_batch_size: 1
padding_free: true
warmup_ratio: 0.1
"""


def ax_lora_train(num_epochs: int) -> str:
    """The LoRA and training lines axolotl's LoRA examples end with (lora_r 32, lora_alpha 16, dropout 0.05 on
    every linear layer; 4 x 2 batches, adamw_bnb_8bit, cosine at 0.0002, bf16 auto, flash attention, warmup 0.1),
    at ``num_epochs``: AX_DPO_LORA_8B (4), AX_ORPO_QLORA (1) and published_configs.AXOLOTL_SFT_DEDUP (4)."""
    return f"""\
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: {num_epochs}
optimizer: adamw_bnb_8bit
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
attn_implementation: flash_attention_2
warmup_ratio: 0.1
"""


# AX examples/llama-3/instruct-dpo-lora-8b.yml (cases 1 and 2): rl: dpo over fozziethebeat/alpaca_messages_2k_dpo_test
# (chat_template.default, field_messages: conversation).
AX_DPO_LORA_8B = f"""\
base_model: meta-llama/Meta-Llama-3-8B-Instruct
model_type: LlamaForCausalLM
tokenizer_type: AutoTokenizer
special_tokens:
  pad_token: <|finetune_right_pad_id|>
  eos_token: <|eot_id|>
load_in_8bit: true
load_in_4bit: false
chat_template: llama3
rl: dpo
datasets:
  - path: fozziethebeat/alpaca_messages_2k_dpo_test
    type: chat_template.default
    field_messages: conversation
    field_chosen: chosen
    field_rejected: rejected
    message_property_mappings:
      role: role
      content: content
    roles:
      system: [system]
      user: [user]
      assistant: [assistant]
val_set_size: 0.05
output_dir: ./outputs/lora-out
sequence_len: 4096
sample_packing: false
adapter: lora
{ax_lora_train(4)}evals_per_epoch: 4
"""

# AX examples/mistral/orpo/mistral-qlora-orpo.yml (case 2): rl: orpo with orpo_alpha, chat_template.argilla data.
AX_ORPO_QLORA = """\
base_model: mistralai/Mistral-7B-v0.1
model_type: MistralForCausalLM
tokenizer_type: LlamaTokenizer
load_in_8bit: false
load_in_4bit: true
rl: orpo
orpo_alpha: 0.1
remove_unused_columns: false
chat_template: chatml
datasets:
  - path: argilla/ultrafeedback-binarized-preferences-cleaned
    type: chat_template.argilla
val_set_size: 0.1
output_dir: ./outputs/mistral-qlora-orpo-out
adapter: qlora
sequence_len: 4096
sample_packing: false
""" + ax_lora_train(1)

# AX examples/llama-3/qlora-1b-kto.yaml (cases 1 and 2): rl: kto, rl_beta, kto_desirable_weight 0.2.
AX_KTO_QLORA_1B = """\
base_model: meta-llama/Llama-3.2-1B
load_in_8bit: false
load_in_4bit: true
rl: kto
rl_beta: 0.5
kto_desirable_weight: 0.2
datasets:
  - path: argilla/ultrafeedback-binarized-preferences-cleaned-kto
    type: llama3.ultra
    split: train
val_set_size: 0.0
output_dir: ./outputs/qlora-out
remove_unused_columns: false
adapter: qlora
sequence_len: 2048
sample_packing: false
lora_r: 32
lora_alpha: 64
lora_dropout: 0.05
lora_target_linear: true
gradient_accumulation_steps: 1
micro_batch_size: 2
num_epochs: 1
optimizer: adamw_8bit
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
attn_implementation: flash_attention_2
warmup_ratio: 0.1
"""

# The training block LLaMA-Factory's examples/train_lora and examples/extras configs end with, at lr 1e-4
# (qwen3_lora_pretrain.yaml, llama3_freeze_sft.yaml, ...); the configs below and in the other fixture files
# that follow those files end with it.
LF_TRAIN_1E4 = """\
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 1.0e-4
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
"""

# LF examples/train_lora/qwen3_lora_dpo.yaml (cases 1 and 2): stage: dpo, pref_beta, pref_loss sigmoid.
LF_QWEN3_LORA_DPO = """\
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
trust_remote_code: true
stage: dpo
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
pref_beta: 0.1
pref_loss: sigmoid
dataset: dpo_en_demo
template: qwen3_nothink
cutoff_len: 2048
max_samples: 1000
output_dir: saves/qwen3-4b/lora/dpo
per_device_train_batch_size: 1
gradient_accumulation_steps: 8
learning_rate: 5.0e-6
num_train_epochs: 3.0
lr_scheduler_type: cosine
warmup_ratio: 0.1
bf16: true
"""

# LF examples/train_lora/qwen3_lora_kto.yaml (cases 1 and 2): stage: kto over kto_en_demo.
LF_QWEN3_LORA_KTO = (
    LF_QWEN3_LORA_DPO.replace("stage: dpo", "stage: kto")
    .replace("pref_loss: sigmoid\n", "")
    .replace("dataset: dpo_en_demo", "dataset: kto_en_demo")
    .replace("lora/dpo", "lora/kto")
)

# LF examples/extras/llama_pro/llama3_freeze_sft.yaml (case 7): finetuning_type: freeze at 1e-4.
LF_LLAMA3_FREEZE_SFT = f"""\
model_name_or_path: models/llama3-8b-pro
trust_remote_code: true
stage: sft
do_train: true
finetuning_type: freeze
freeze_trainable_layers: 8
freeze_trainable_modules: all
use_llama_pro: true
dataset: identity,alpaca_en_demo
template: llama3
cutoff_len: 2048
max_samples: 1000
output_dir: saves/llama3-8b-pro/freeze/sft
{LF_TRAIN_1E4}"""


def lf_v1_sft(peft_config: str, output_dir: str, learning_rate: str) -> str:
    """LLaMA-Factory v1's examples/v1/train_*/train_*_sft.yaml, which differ only in their ``peft_config`` block
    (``peft_config``, its indented lines), ``output_dir`` and ``learning_rate``: Qwen/Qwen3-4B on
    data/v1_sft_demo.yaml, kernels auto, fsdp2, 10 steps of micro batch 1 at cutoff 2048."""
    return f"""\
model: Qwen/Qwen3-4B
model_class: llm
peft_config:
{peft_config}kernel_config:
  name: auto
dist_config:
  name: fsdp2
  dcp_path: null
train_dataset: data/v1_sft_demo.yaml
output_dir: {output_dir}
micro_batch_size: 1
cutoff_len: 2048
learning_rate: {learning_rate}
max_steps: 10
"""


# LF examples/v1/train_freeze/train_freeze_sft.yaml (case 7): LLaMA-Factory v1 spells freeze tuning
# peft_config.name: freeze.
LF_V1_FREEZE_SFT = lf_v1_sft(
    """\
  name: freeze
  freeze_trainable_layers: 2
  freeze_trainable_modules: all
  freeze_extra_modules: null
""",
    "./outputs/test_freeze",
    "2.0e-5",
)

# TT recipes/configs/llama3_1/8B_lora_dpo.yaml (case 2): the loss component is torchtune.rlhf.loss.DPOLoss.
TT_LLAMA31_8B_LORA_DPO = """\
output_dir: /tmp/torchtune/llama3_1_8B/lora_dpo
model:
  _component_: torchtune.models.llama3_1.lora_llama3_1_8b
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  apply_lora_to_output: False
  lora_rank: 8
  lora_alpha: 16
  lora_dropout: 0.0
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/Meta-Llama-3.1-8B-Instruct/original/tokenizer.model
  max_seq_len: 1024
dataset:
  _component_: torchtune.datasets.stack_exchange_paired_dataset
seed: null
shuffle: True
batch_size: 4
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  weight_decay: 0.05
  lr: 5e-4
lr_scheduler:
  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup
  num_warmup_steps: 100
loss:
  _component_: torchtune.rlhf.loss.DPOLoss
  beta: 0.1
  label_smoothing: 0
epochs: 1
max_steps_per_epoch: 1000
gradient_accumulation_steps: 8
dtype: bf16
"""


def ax_our_lora(base_model: str, learning_rate: str = "2.0e-4") -> str:
    """The lines our own axolotl configs start with where the docs show only a ``datasets`` entry (AX_CUSTOM_INSTRUCT,
    AX_USER_DEFINED_DPO, test_audit_round3's): ``base_model``, a LoRA adapter at r 16 / alpha 32, ``learning_rate``."""
    return f"base_model: {base_model}\nadapter: lora\nlora_r: 16\nlora_alpha: 32\nlearning_rate: {learning_rate}\n"


# AX docs/dataset-formats/index.qmd, "Custom Instruct Prompt Format" (case 6): rows {"input", "output"} with a
# type: mapping naming input as the instruction field and leaving field_input and field_system empty. (The base
# model and adapter lines are ours: the docs show only the datasets entry.)
AX_CUSTOM_INSTRUCT = (
    ax_our_lora("mistralai/Mistral-7B-Instruct-v0.1")
    + """\
datasets:
  - path: data.jsonl
    type:
      system_prompt: ""
      field_system:
      field_instruction: input
      field_input:
      field_output: output
      format: |-
        [INST] {instruction} {input} [/INST]
      no_input_format: "[INST] {instruction} [/INST]"
"""
)

# TRL: a TRL sft script config with assistant_only_loss and chat_template_path naming one of TRL's own training
# templates (trl/chat_templates/qwen3_training.jinja, which has a {%- generation %} block) (case 3). The path is
# filled in by the test from the installed trl package.
TRL_SFT_ASSISTANT_ONLY = """\
model_name_or_path: Qwen/Qwen3-0.6B
dataset_name: trl-lib/Capybara
use_peft: true
lora_r: 16
lora_alpha: 32
learning_rate: 2.0e-4
assistant_only_loss: true
chat_template_path: {path}
max_length: 1024
"""


# ---------------------------------------------------------------------------------------------------- rows
QA = [
    ("Name a primary colour.", "Red is a primary colour.", "Green is a primary colour of paint."),
    ("How many legs does a spider have?", "A spider has eight legs.", "A spider has six legs."),
    ("What gas do plants take in?", "Plants take in carbon dioxide.", "Plants take in helium."),
    ("Which planet is called the red planet?", "Mars is called the red planet.", "Venus is the red planet."),
    ("What is frozen water called?", "Frozen water is called ice.", "Frozen water is called steam."),
    ("How many days are in a leap year?", "A leap year has 366 days.", "A leap year has 364 days."),
    ("What do bees make?", "Bees make honey and wax.", "Bees make silk."),
    ("Which organ pumps blood?", "The heart pumps blood.", "The liver pumps blood."),
    ("What is the boiling point of water at sea level?", "It is 100 degrees Celsius.", "It is 50 degrees."),
    ("Which animal is known as the ship of the desert?", "The camel.", "The horse is known as that."),
    ("What is the largest ocean?", "The Pacific Ocean is the largest.", "The Arctic Ocean is the largest."),
    ("How many continents are there?", "There are seven continents.", "There are nine continents."),
]


def _numbered(n: int, word: str = "question") -> list[tuple[str, str, str]]:
    """The first ``n`` QA items (cycling), each question numbered ``(<word> i)`` so that no two are the same."""
    out = []
    for i in range(n):
        q, good, bad = QA[i % len(QA)]
        out.append((f"{q} ({word} {i})", good, bad))
    return out


def _kto_items(n_desirable: int, n_undesirable: int) -> list[tuple[int, str, str, bool]]:
    """:func:`pref_world.kto_items` over the QA items numbered ``(item i)``."""
    items = _numbered(n_desirable + n_undesirable, "item")
    return kto_items(n_desirable, n_undesirable, items.__getitem__)


def h4_ultrafeedback_rows(n: int = 12) -> list[dict]:
    """HuggingFaceH4/ultrafeedback_binarized (train_prefs / test_prefs), which AH_ZEPHYR_DPO_QLORA trains on:
    ``prompt`` (string), ``prompt_id``, ``chosen`` and ``rejected`` (the whole conversation: the user turn, then the
    response), ``messages`` (a copy of chosen), ``score_chosen``, ``score_rejected`` (dataset card features; also
    the example row in TRL's ``maybe_extract_prompt``)."""
    out = []
    for i, (q, good, bad) in enumerate(_numbered(n)):
        chosen = [{"role": "user", "content": q}, {"role": "assistant", "content": good}]
        out.append(
            {
                "prompt": q,
                "prompt_id": f"{i:064x}",
                "chosen": chosen,
                "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": bad}],
                "messages": chosen,
                "score_chosen": 8.0,
                "score_rejected": 4.0,
            }
        )
    return out


def axolotl_dpo_test_rows(n: int = 12) -> list[dict]:
    """fozziethebeat/alpaca_messages_2k_dpo_test as AX_DPO_LORA_8B maps it (chat_template.default with
    field_messages: conversation): ``conversation`` (message list), ``chosen`` / ``rejected`` (one assistant message
    each) — the row of the issue's "unknown row format (fields: chosen, conversation, rejected)"."""
    return [
        {
            "conversation": [{"role": "user", "content": q}],
            "chosen": {"role": "assistant", "content": good},
            "rejected": {"role": "assistant", "content": bad},
        }
        for q, good, bad in _numbered(n)
    ]


def argilla_ultrafeedback_rows(n: int = 12) -> list[dict]:
    """argilla/ultrafeedback-binarized-preferences-cleaned as AX_ORPO_QLORA reads it (axolotl docs/rlhf.qmd,
    chat_template.argilla): ``prompt`` (string), ``chosen`` / ``rejected`` (the user turn and the response, "same
    till last content"), plus the dataset's rating and model columns."""
    return [
        {
            "source": "evol_instruct",
            "prompt": q,
            "chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": good}],
            "chosen-rating": 5.0,
            "chosen-model": "model-a",
            "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": bad}],
            "rejected-rating": 2.0,
            "rejected-model": "model-b",
        }
        for q, good, bad in _numbered(n)
    ]


def lf_dpo_en_demo_rows(n: int = 12) -> list[dict]:
    """LF data/dpo_en_demo.json (dataset_info.json: ranking, sharegpt, columns messages=conversations, chosen,
    rejected): ``conversations`` of ``from``/``value`` (human turns), ``chosen`` / ``rejected`` one gpt message
    object each."""
    return [sharegpt_pair(*item) for item in _numbered(n)]


def lf_kto_en_demo_rows(n_desirable: int = 6, n_undesirable: int = 6) -> list[dict]:
    """LF data/kto_en_demo.json (dataset_info.json: sharegpt, columns messages=messages, kto_tag=label, role/content
    tags): ``messages`` (a user then an assistant turn) and a bool ``label``."""
    return [
        {"messages": [{"content": q, "role": "user"}, {"content": answer, "role": "assistant"}], "label": label}
        for _, q, answer, label in _kto_items(n_desirable, n_undesirable)
    ]


def trl_kto_rows(n_desirable: int = 6, n_undesirable: int = 6) -> list[dict]:
    """argilla/ultrafeedback-binarized-preferences-cleaned-kto as AX_KTO_QLORA_1B reads it (llama3.ultra for KTO):
    ``prompt``, ``completion``, bool ``label`` (TRL's unpaired preference form)."""
    return [
        {"prompt": q, "completion": answer, "label": label}
        for _, q, answer, label in _kto_items(n_desirable, n_undesirable)
    ]


def axolotl_custom_rows(n: int = 20) -> list[dict]:
    """The docs' sample row for AX_CUSTOM_INSTRUCT: ``{"input": "...", "output": "..."}``."""
    return [
        {"input": f"What is {k} times {k + 3}?", "output": f"{k} times {k + 3} is {k * (k + 3)}."} for k in range(n)
    ]


# LF data/dataset_info.json, the entries of the demo preference sets (case 1)
LF_DATASET_INFO = {
    "dpo_en_demo": {
        "file_name": "dpo_en_demo.json",
        "ranking": True,
        "formatting": "sharegpt",
        "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected"},
    },
    "kto_en_demo": {
        "file_name": "kto_en_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "kto_tag": "label"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    },
    "ultrafeedback": {
        "hf_hub_url": "llamafactory/ultrafeedback_binarized",
        "ranking": True,
        "columns": {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"},
    },
}


# AX docs/rlhf.qmd, "user_defined.default" (case 1): a preference type: mapping. The docs name the fields after
# their defaults; the test renames them as a user's own set would.
AX_USER_DEFINED_DPO = (
    ax_our_lora("Qwen/Qwen2.5-0.5B", "5.0e-6")
    + """\
rl: dpo
datasets:
  - path: prefs.jsonl
    split: train
    type:
      field_prompt: "prompt"
      field_system: "system"
      field_chosen: "chosen"
      field_rejected: "rejected"
      prompt_format: "{prompt}"
      chosen_format: "{chosen}"
      rejected_format: "{rejected}"
"""
)
