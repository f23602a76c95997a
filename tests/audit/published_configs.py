"""Training configs modelled on each framework's published example configs.

Written out by hand for the tests (nothing is fetched at test time); each names the published config it
follows. Only the keys Audit reads, and a few it must ignore, are kept.
"""

from published_examples import (
    AX_DPO_LORA_8B,
    LF_QWEN3_LORA_DPO,
    LF_TRAIN_1E4,
    TT_LLAMA31_8B_LORA_DPO,
    ax_lora_train,
    lf_v1_sft,
)

# axolotl, modelled on examples/llama-3/lora-1b-deduplicate-sft.yml (axolotl-ai-cloud/axolotl)
AXOLOTL_SFT_DEDUP = f"""\
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
{ax_lora_train(4)}special_tokens:
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
LF_V1 = (
    lf_v1_sft(
        """\
  name: lora
  r: 16
  lora_alpha: 32
  lora_dropout: 0.05
  target_modules: all
""",
        "./outputs/test_lora",
        "1.0e-4",
    )
    + "sample_backend: hf\nmax_new_tokens: 128\n"
)

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

# torchtune, modelled on recipes/configs/llama3_1/8B_lora_dpo_single_device.yaml (pytorch/torchtune): the
# settings of published_examples.TT_LLAMA31_8B_LORA_DPO (8B_lora_dpo.yaml) without its output_dir line and the
# loss's beta and label_smoothing.
TORCHTUNE_DPO = TT_LLAMA31_8B_LORA_DPO.replace("output_dir: /tmp/torchtune/llama3_1_8B/lora_dpo\n", "").replace(
    "  beta: 0.1\n  label_smoothing: 0\n", ""
)

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
