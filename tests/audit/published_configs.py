"""Training configs modelled on each framework's published example configs.

Written out by hand for the tests (nothing is fetched at test time); each names the published config it
follows. Only the keys Audit reads, and a few it must ignore, are kept.
"""

from published_examples import AX_DPO_LORA_8B, LF_QWEN3_LORA_DPO, LF_TRAIN_1E4

# axolotl, modelled on examples/llama-3/lora-1b-deduplicate-sft.yml (axolotl-ai-cloud/axolotl)
AXOLOTL_SFT_DEDUP = """\
base_model: meta-llama/Llama-3.2-1B
model_type: LlamaForCausalLM
tokenizer_type: AutoTokenizer
load_in_8bit: true
datasets:
  - path: data/train.jsonl
    type: alpaca
dataset_prepared_path:
val_set_size: 0.0
output_dir: ./outputs/lora-out
dataset_exact_deduplication: true
sequence_len: 4096
sample_packing: true
eval_sample_packing: false
adapter: lora
lora_r: 32
lora_alpha: 16
lora_dropout: 0.05
lora_target_linear: true
gradient_accumulation_steps: 4
micro_batch_size: 2
num_epochs: 4
optimizer: adamw_bnb_8bit
lr_scheduler: cosine
learning_rate: 0.0002
bf16: auto
attn_implementation: flash_attention_2
warmup_ratio: 0.1
special_tokens:
  pad_token: <|end_of_text|>
"""

# axolotl, examples/llama-3/instruct-dpo-lora-8b.yml (axolotl-ai-cloud/axolotl): the file
# published_examples.AX_DPO_LORA_8B types out.
AXOLOTL_DPO = AX_DPO_LORA_8B

# LLaMA-Factory, modelled on examples/train_lora/qwen3_lora_dpo.yaml (hiyouga/LLaMA-Factory): the file
# published_examples.LF_QWEN3_LORA_DPO types out, plus its logging and save lines (keys Audit must ignore).
LF_DPO = LF_QWEN3_LORA_DPO.replace(
    "output_dir: saves/qwen3-4b/lora/dpo\n", "output_dir: saves/qwen3-4b/lora/dpo\nlogging_steps: 10\nsave_steps: 500\n"
)

# LLaMA-Factory, modelled on examples/train_lora/qwen3_lora_pretrain.yaml (hiyouga/LLaMA-Factory)
LF_PT = f"""\
model_name_or_path: Qwen/Qwen3-4B-Instruct-2507
stage: pt
do_train: true
finetuning_type: lora
lora_rank: 8
lora_target: all
dataset: c4_demo
cutoff_len: 2048
max_samples: 1000
output_dir: saves/qwen3-4b/lora/pretrain
{LF_TRAIN_1E4}"""

# LLaMA-Factory v1, modelled on examples/v1/train_lora/train_lora_sft.yaml (hiyouga/LLaMA-Factory)
LF_V1 = """\
model: Qwen/Qwen3-4B
model_class: llm
peft_config:
  name: lora
  r: 16
  lora_alpha: 32
  lora_dropout: 0.05
  target_modules: all
kernel_config:
  name: auto
dist_config:
  name: fsdp2
  dcp_path: null
train_dataset: data/v1_sft_demo.yaml
output_dir: ./outputs/test_lora
micro_batch_size: 1
cutoff_len: 2048
learning_rate: 1.0e-4
max_steps: 10
sample_backend: hf
max_new_tokens: 128
"""

# TRL CLI, modelled on examples/cli_configs/example_config.yaml (huggingface/trl); `trl sft --config`
TRL_CLI = """\
model_name_or_path:
  Qwen/Qwen2.5-0.5B
dataset_name:
  stanfordnlp/imdb
report_to:
  none
learning_rate:
  0.0001
lr_scheduler_type:
  cosine
"""

# torchtune, modelled on recipes/configs/qwen2_5/1.5B_lora_single_device.yaml (pytorch/torchtune)
TORCHTUNE_QWEN = """\
output_dir: /tmp/torchtune/qwen2_5_1_5B/lora_single_device
model:
  _component_: torchtune.models.qwen2_5.lora_qwen2_5_1_5b_instruct
  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']
  apply_lora_to_mlp: True
  lora_rank: 32
  lora_alpha: 64
  lora_dropout: 0.0
tokenizer:
  _component_: torchtune.models.qwen2_5.qwen2_5_tokenizer
  path: /tmp/Qwen2.5-1.5B-Instruct/vocab.json
  merges_file: /tmp/Qwen2.5-1.5B-Instruct/merges.txt
  max_seq_len: null
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: False
seed: null
shuffle: True
epochs: 1
max_steps_per_epoch: null
batch_size: 2
gradient_accumulation_steps: 8
optimizer:
  _component_: torch.optim.AdamW
  fused: True
  lr: 2e-3
lr_scheduler:
  _component_: torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup
  num_warmup_steps: 100
loss:
  _component_: torchtune.modules.loss.LinearCrossEntropyLoss
dtype: bf16
"""

# torchtune, modelled on recipes/configs/llama3_1/8B_lora_dpo_single_device.yaml (pytorch/torchtune)
TORCHTUNE_DPO = """\
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
epochs: 1
max_steps_per_epoch: 1000
gradient_accumulation_steps: 8
dtype: bf16
"""

ALL = {
    "axolotl_sft_dedup.yml": AXOLOTL_SFT_DEDUP,
    "axolotl_dpo.yml": AXOLOTL_DPO,
    "llamafactory_dpo.yaml": LF_DPO,
    "llamafactory_pt.yaml": LF_PT,
    "llamafactory_v1_sft.yaml": LF_V1,
    "trl_cli.yaml": TRL_CLI,
    "torchtune_qwen2_5_1_5b.yaml": TORCHTUNE_QWEN,
    "torchtune_dpo.yaml": TORCHTUNE_DPO,
}
