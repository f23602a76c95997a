"""Every check has a fixture that fires it and one that does not.

FIRE maps each check id to a builder (world -> diagnose kwargs) and the severity it must raise.
The non-firing fixture is the clean run (the check is in ``passed``), or, for checks that do not
apply to the clean run, the builder in NO_FIRE (the check runs and passes).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from audit_world import as_conversational, as_messages, clean_trainer_state
from pref_world import trl_kto_rows, trl_rows

from gradian.audit import all_checks, diagnose
from gradian_testlib import CHATML_GEN_TURNS


def _rows_pc(world, n=None):
    return world.rows_copy()[: n or len(world.rows)]


def _msgs(world, n=200):
    return as_messages(world.rows_copy()[:n])


#: alignment-handbook recipes/zephyr-7b-beta/dpo/config_qlora.yaml (published: beta 0.01, lr 5.0e-6)
_ZEPHYR_DPO = (
    "model_name_or_path: alignment-handbook/zephyr-7b-sft-qlora\nuse_peft: true\nload_in_4bit: true\n"
    "lora_r: 128\nlora_alpha: 128\nbeta: {beta}\nlearning_rate: {lr}\nmax_length: 1024\n"
    "max_prompt_length: 512\nnum_train_epochs: 1\nper_device_train_batch_size: 4\n"
)
#: a TRL SFT config on ultrachat_200k; C21 fires on the test split
_ULTRACHAT_SFT = (
    "use_peft: true\nlora_r: 16\nlora_alpha: 32\nlearning_rate: 2.0e-4\nper_device_train_batch_size: 8\n"
    "dataset_name: HuggingFaceH4/ultrachat_200k\ndataset_train_split: {split}\n"
)


def _yaml_config(w, name: str, text: str, **inputs) -> dict:
    """The inputs of a run whose one config is ``text``, written as ``name``, plus ``inputs``."""
    return dict(configs=[w.write_text(name, text)], **inputs)


def _conv_pc(world, n=200):
    """TRL's conversational prompt/completion form (completion-only loss applies)."""
    return as_conversational(world.rows_copy()[:n])


# ---------------------------------------------------------------------- data
def f_d01(w):
    rows = _rows_pc(w)
    for r in rows[-30:]:
        r["instruction"], r["output"] = r.pop("prompt"), r.pop("completion")
    return dict(data=w.data_with(rows))


def f_d01_first_row(w):
    rows = _rows_pc(w)
    rows[0]["instruction"], rows[0]["output"] = rows[0].pop("prompt"), rows[0].pop("completion")
    return dict(data=w.data_with(rows))


def f_d02(w):
    rows = [{"id": r["id"], "instruction": r["prompt"], "output": r["completion"]} for r in _rows_pc(w)]
    return dict(data=w.data_with(rows), configs=[w.config])


def f_d03(w):
    rows = _rows_pc(w)
    rows[5]["completion"] = "   "
    rows[9]["completion"] = ""
    return dict(data=w.data_with(rows))


def f_d04(w):
    return dict(data=w.data, tokenizer=w.tok_dir, configs=[w.config_with(max_length=96)])


def f_d05(w):
    rows = _rows_pc(w)
    for r in rows[:3]:
        r["prompt"] = " ".join([r["prompt"].strip()] * 12) + "\n"
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir, configs=[w.config_with(max_length=160)])


def f_d06(w):
    rows = [{"id": r["id"], "text": r["prompt"] + r["completion"]} for r in _rows_pc(w)]
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir, configs=[w.config], versions=["trl=0.15.2"])


def f_d07(w):
    rows = _rows_pc(w)
    for r in rows[:4]:
        r["prompt"] = "<|endoftext|>" + r["prompt"]
    return dict(data=w.data_with(rows), tokenizer=w.tok_bos_dir)


def f_d08(w):
    rows = _rows_pc(w)
    rows[3]["completion"] = rows[3]["completion"][:40] + "<|im_end|>" + rows[3]["completion"][40:]
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir)


def f_d08_no_tok(w):
    rows = _rows_pc(w)
    rows[3]["prompt"] = "[INST] " + rows[3]["prompt"]
    return dict(data=w.data_with(rows))


def f_d09(w):
    rows = _msgs(w)
    rows[2]["messages"].insert(1, {"role": "user", "content": "and another thing"})
    rows[4]["messages"].append({"role": "user", "content": "thanks"})
    return dict(data=w.data_with(rows))


def f_d10(w):
    return dict(data=w.data, configs=[w.config_with(response_template="### Answer:")])


def f_d10_tok(w):
    """The template string is in every row, but in 20 rows it follows a space, so its token ids differ in
    context ('Ġan' + 's' ... instead of 'an' + 's' ...: the classic 'Could not find response key'); only
    the token-level match sees it."""
    rows = _rows_pc(w)
    for k, r in enumerate(rows):
        r["prompt"] = (r["prompt"].rstrip("\n") + " " if k < 20 else r["prompt"]) + "answer:"
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir, configs=[w.config_with(response_template="answer:")])


def f_d11(w):
    rows = _rows_pc(w)
    for k in range(20):
        dup = dict(rows[k])
        dup["id"] = f"dup{k}"
        rows.append(dup)
    return dict(data=w.data_with(rows))


def f_d12(w):
    rows = _rows_pc(w)
    for k in range(40):
        near = dict(rows[k])
        near["id"] = f"near{k}"
        near["completion"] = near["completion"] + " Indeed."
        rows.append(near)
    return dict(data=w.data_with(rows))


def f_d13(w):
    rows = _rows_pc(w)
    for k in range(10):
        rows.append({"id": f"c{k}", "prompt": rows[k]["prompt"], "completion": "A different answer entirely."})
    return dict(data=w.data_with(rows))


def f_d14(w):
    ev = [dict(r) for r in w.eval_rows[:50]] + [dict(w.rows[k], id=f"leak{k}") for k in range(10)]
    return dict(data=w.data, eval=w.data_with(ev, "eval.jsonl"))


def f_d15(w):
    ev = [dict(r) for r in w.eval_rows[:50]]
    for k in range(10):
        r = dict(w.rows[k], id=f"near{k}")
        r["prompt"] = "Please: " + r["prompt"]
        r["completion"] = r["completion"] + " That is all."
        ev.append(r)
    return dict(data=w.data, eval=w.data_with(ev, "eval.jsonl"))


def f_d16(w):
    rows = _rows_pc(w)
    for r in rows[:40]:
        r["prompt"] = "Repeat this exactly: " + r["completion"] + "\n"
    return dict(data=w.data_with(rows))


def f_d17(w):
    rows = _rows_pc(w)
    for r in rows[:12]:
        r["completion"] = " ".join([r["completion"]] * 60)
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir)


FRENCH = (
    "Le chat est dans la maison et il ne veut pas sortir pour le moment avec les enfants qui sont "
    "dans le jardin. Elle est pour une fois dans la cuisine avec des amis qui ne sont pas du quartier."
)


def f_d18(w):
    rows = _rows_pc(w)
    for r in rows[:20]:
        r["completion"] = FRENCH
    return dict(data=w.data_with(rows))


def f_d19(w):
    rows = _rows_pc(w)
    for r in rows[:60]:
        r["prompt"] = r["prompt"].rstrip("\n") + " Answer: "
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir)


def f_d20(w):
    rows = _rows_pc(w)
    for r in rows[:12]:
        r["completion"] = "As an AI language model, I cannot have opinions. " + r["completion"]
    return dict(data=w.data_with(rows))


def f_d21(w):
    return dict(data=w.data_with(_rows_pc(w, 120)))


# ---------------------------------------------------------------------- config
def f_c01(w):
    return dict(configs=[w.config_with(learning_rate=2e-5)])


def f_c02(w):
    return dict(configs=[w.config_with(learning_rate=3e-3)])


def f_c03(w):
    return dict(configs=[w.config_with(num_train_epochs=12)], data=w.data)


def f_c04(w):
    return dict(configs=[w.config_with(per_device_train_batch_size=64, gradient_accumulation_steps=16)], data=w.data)


def f_c05(w):
    cfg = w.config_with(warmup_steps=1000, warmup_ratio=0.3)
    return dict(configs=[cfg], data=w.data)


def f_c06(w):
    cfg = {k: v for k, v in __import__("audit_world").clean_trl_config().items() if k != "max_length"}
    return dict(configs=[w.write_json("sft.json", cfg)])


def f_c07(w):
    return dict(configs=[w.config_with(max_length=4096)], tokenizer=w.tok_dir)


def f_c08(w):
    return _yaml_config(
        w,
        "axolotl.yaml",
        "base_model: HuggingFaceTB/SmolLM2-135M\nadapter: lora\nlora_r: 16\n"
        "lora_alpha: 32\nsequence_len: 512\ntrain_on_inputs: true\nlearning_rate: 2e-4\n"
        "micro_batch_size: 4\ngradient_accumulation_steps: 4\nnum_epochs: 2\n",
    )


def f_c08_messages(w):
    return dict(configs=[w.config], data=w.data_with(_msgs(w)))


def f_c08_flat(w):
    rows = [
        {"id": r["id"], "text": "### Instruction:\n" + r["prompt"] + "### Response:\n" + r["completion"]}
        for r in _rows_pc(w)
    ]
    return dict(data=w.data_with(rows))


def f_c09(w):
    return dict(configs=[w.config_with(assistant_only_loss=True)], tokenizer=w.tok)


def f_c10(w):
    return dict(configs=[w.config], tokenizer=w.tok_copy(pad_token=w.tok.eos_token), versions=["trl=0.15.0"])


def f_c11(w):
    return dict(
        configs=[w.config_with(packing=True, attn_implementation="flash_attention_2")],
        data=w.data,
        versions=["trl=0.19.0"],
    )


def f_c12(w):
    return dict(configs=[w.config_with(packing=True)], versions=["trl=0.21.0"])


def f_c13(w):
    return dict(configs=[w.config_with(lora_r=16, lora_alpha=512)])


def f_c14(w):
    return dict(configs=[w.config_with(lora_target_modules=["q_proj", "v_proj", "v_proj"])])


def f_c15(w):
    return _yaml_config(
        w,
        "axolotl.yaml",
        "base_model: m\nadapter: lora\nlora_r: 16\nlora_alpha: 32\n"
        "tokens: ['<tool_call>', '</tool_call>']\nlearning_rate: 0.0002\n",
    )


def f_c16(w):
    return dict(configs=[w.config_with(bf16=False, fp16=True, model_name_or_path="meta-llama/Llama-3.1-8B")])


def f_c17(w):
    return dict(configs=[w.config_with(load_best_model_at_end=True, save_strategy="epoch")])


def f_c18(w):
    return dict(configs=[w.config_with(per_device_train_batch_size=16, gradient_accumulation_steps=16)])


def f_c19(w):
    return dict(
        configs=[
            w.config_with(
                learning_rate=-2e-4, num_train_epochs=0, per_device_train_batch_size=-8, max_length=-1, lora_r=0
            )
        ],
        data=w.data,
    )


def f_c20(w):
    # written after alignment-handbook recipes/zephyr-7b-beta/dpo/config_qlora.yaml, with beta and lr pushed out
    return _yaml_config(w, "dpo.yaml", _ZEPHYR_DPO.format(beta="2.0", lr="2.0e-3"))


def f_c20_prompt(w):
    return _yaml_config(
        w,
        "dpo.yaml",
        "use_peft: true\nlora_r: 16\nlora_alpha: 32\nbeta: 0.1\nlearning_rate: 5.0e-6\nmax_length: 512\n"
        "max_prompt_length: 512\nper_device_train_batch_size: 4\n",
    )


def f_c21(w):
    return _yaml_config(w, "sft.yaml", _ULTRACHAT_SFT.format(split="test_sft"))


_LF_DPO_ON_SFT = (
    "model_name_or_path: Qwen/Qwen3-4B-Instruct-2507\nstage: dpo\ndo_train: true\nfinetuning_type: lora\n"
    "lora_rank: 8\nlora_target: all\npref_beta: 0.1\npref_loss: sigmoid\nlearning_rate: 5.0e-6\n"
    "adapter_name_or_path: saves/qwen3-4b/lora/sft\n{extra}"
)


def f_c22(w):
    # LLaMA-Factory examples/train_lora/qwen3_lora_dpo.yaml pointed at the SFT adapter it refines
    return _yaml_config(w, "qwen3_lora_dpo.yaml", _LF_DPO_ON_SFT.format(extra=""))


def f_c22_sync(w):
    return _yaml_config(w, "dpo.yaml", "use_peft: true\nlora_r: 16\nbeta: 0.1\nsync_ref_model: true\n")


#: a torchtune LoRA config on a Qwen2 model saved by its HF checkpointer (the shape of its
#: recipes/configs/qwen2/0.5B_lora_single_device.yaml), trained as the test's torchtune run is
_TT_QWEN2 = """model:
  _component_: torchtune.models.qwen2.lora_qwen2_0_5b
  lora_attn_modules: [{mods}]
  apply_lora_to_mlp: true
  lora_rank: 32
  lora_alpha: 64
checkpointer:
  _component_: torchtune.training.FullModelHFCheckpointer
  checkpoint_dir: /tmp/Qwen2-0.5B-Instruct
  checkpoint_files: [model.safetensors]
  output_dir: /tmp/out
  model_type: QWEN2
tokenizer:
  _component_: torchtune.models.qwen2.qwen2_tokenizer
  path: /tmp/Qwen2-0.5B-Instruct/vocab.json
  merges_file: /tmp/Qwen2-0.5B-Instruct/merges.txt
optimizer:
  _component_: torch.optim.AdamW
  lr: 2.0e-4
epochs: {epochs}
device: {device}
{extra}"""


def f_c23(w):
    return _yaml_config(w, "tt.yaml", _TT_QWEN2.format(mods="q_proj, v_proj", epochs=1, device="cuda", extra=""))


def f_c23_cpu(w):
    return _yaml_config(w, "tt.yaml", _TT_QWEN2.format(mods="v_proj", epochs=3, device="cpu", extra=""))


def f_c23_dora(w):
    # DoRA on a Llama-style model: the export omits use_dora and keeps the q/k magnitudes in torchtune's order
    text = _TT_QWEN2.format(mods="q_proj, v_proj", epochs=1, device="cuda", extra="")
    text = text.replace("apply_lora_to_mlp: true", "apply_lora_to_mlp: true\n  use_dora: true")
    return _yaml_config(
        w, "tt.yaml", text.replace("QWEN2", "LLAMA3").replace("qwen2.lora_qwen2_0_5b", "llama3_2.lora_llama3_2_1b")
    )


def n_c23(w):
    # LoRA on v and output only; several epochs on CPU, but saving the adapter alone
    extra = "save_adapter_weights_only: true\n"
    return _yaml_config(w, "tt.yaml", _TT_QWEN2.format(mods="v_proj, output_proj", epochs=3, device="cpu", extra=extra))


def f_c19_inf(w):
    return _yaml_config(
        w,
        "sft.yaml",
        "learning_rate: 2.0e-4\nnum_train_epochs: .inf\nper_device_train_batch_size: 8\n"
        "max_length: 512\nuse_peft: true\nlora_r: 16\nlora_alpha: 32\n",
        data=w.data,
    )


# ---------------------------------------------------------------------- tokenizer / template
def f_t01(w):
    return dict(data=w.data_with(_msgs(w)), tokenizer=w.tok_copy(chat_template=None))


def f_t02(w):
    return dict(tokenizer=w.tok_copy(eos_token="<|endoftext|>"))


def f_t03(w):
    return _yaml_config(
        w,
        "axolotl.yaml",
        "base_model: m\nadapter: lora\nlora_r: 16\nlora_alpha: 32\nchat_template: llama3\nlearning_rate: 0.0002\n",
        tokenizer=w.tok_dir,
    )


def f_t03_rows(w):
    rows = [
        {"id": r["id"], "prompt": "[INST] " + r["prompt"].strip() + " [/INST]", "completion": r["completion"]}
        for r in _rows_pc(w)
    ]
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir)


# ---------------------------------------------------------------------- logs
def _train_entries(st):
    return [e for e in st["log_history"] if "loss" in e]


def f_l01(w):
    def m(st):
        _train_entries(st)[5]["loss"] = float("nan")

    return dict(logs=w.state_with(m))


def f_l02(w):
    def m(st):
        for e in _train_entries(st)[4:7]:
            e["loss"] = 0.0

    return dict(logs=w.state_with(m))


def f_l03(w):
    def m(st):
        for e in _train_entries(st)[6:10]:
            e["loss"] = e["loss"] * 3

    return dict(logs=w.state_with(m))


def f_l04(w):
    def m(st):
        _train_entries(st)[7]["grad_norm"] = 250.0

    return dict(logs=w.state_with(m))


def f_l05(w):
    st = clean_trainer_state(n_rows=400, eval_steps=5)
    ev = [e for e in st["log_history"] if "eval_loss" in e]
    for k, e in enumerate(ev):  # falls to its minimum at the 5th eval, then rises 5 times
        e["eval_loss"] = 2.0 - 0.1 * k if k <= 4 else 1.6 + 0.05 * (k - 4)
    return dict(logs=w.write_json("trainer_state.json", st))


def f_l06(w):
    st = clean_trainer_state(n_rows=400, epochs=4, logging_steps=1)
    for e in _train_entries(st):
        e["loss"] = 2.0 * (0.6 ** math.floor(e["epoch"] - 1e-9)) - 0.01 * (e["epoch"] % 1)
    return dict(logs=w.write_json("trainer_state.json", st))


def f_l07(w):
    def m(st):
        for e in _train_entries(st)[-4:]:
            e["loss"] = 0.05
        ev = [e for e in st["log_history"] if "eval_loss" in e]
        ev[-1]["eval_loss"] = 1.6

    return dict(logs=w.state_with(m))


def f_l08(w):
    st = clean_trainer_state(n_rows=2000)
    for e in _train_entries(st):
        e["loss"] = 2.0 + 0.01 * math.sin(e["step"])
    return dict(logs=w.write_json("trainer_state.json", st))


def f_l09(w):
    def m(st):
        _train_entries(st)[0]["loss"] = 11.5

    return dict(logs=w.state_with(m), configs=[w.config])


def f_l10(w):
    def m(st):
        for e in _train_entries(st):
            e["learning_rate"] = 1e-9

    return dict(logs=w.state_with(m))


def f_l11(w):
    def m(st):
        st["log_history"] = [e for e in st["log_history"] if e.get("step", 0) <= 20 and "train_runtime" not in e]
        st["global_step"] = 20

    return dict(logs=w.state_with(m))


# ---------------------------------------------------------------- preference rows (pref_world.py)
def f_d22(w):
    rows = trl_rows()
    rows[2]["rejected"] = rows[2]["chosen"]
    return dict(data=w.data_with(rows, "pref.jsonl"))


def f_d23(w):
    rows = trl_rows()
    return dict(data=w.data_with(rows + [dict(rows[1])], "pref.jsonl"))


def f_d24(w):
    ev = [{"id": "e1", "prompt": "What is the capital city of Japan?", "answer": "Tokyo.", "capability": "capitals"}]
    return dict(data=w.data_with(trl_rows(), "pref.jsonl"), eval=w.data_with(ev, "ev.jsonl"))


def f_d25(w):
    return dict(data=w.data_with(trl_rows(), "pref.jsonl"), tokenizer=w.tok_dir, configs=[w.config_with(max_length=12)])


def f_d26(w):
    return dict(data=w.data_with(trl_rows(biased=True), "pref.jsonl"))


def f_d27(w):
    return dict(data=w.data_with(trl_kto_rows(20, 4), "kto.jsonl"))


def f_d27_one_label(w):
    return dict(data=w.data_with(trl_kto_rows(24, 0), "kto.jsonl"))


def n_pref(w):
    ev = [{"id": "e1", "prompt": "What is the capital city of Atlantis?", "answer": "None.", "capability": "x"}]
    return dict(data=w.data_with(trl_rows(), "pref.jsonl"), eval=w.data_with(ev, "ev.jsonl"), tokenizer=w.tok_dir)


def n_kto(w):
    return dict(data=w.data_with(trl_kto_rows(), "kto.jsonl"))


FIRE = {
    "D01": [(f_d01, "warning"), (f_d01_first_row, "error")],
    "D02": [(f_d02, "error")],
    "D03": [(f_d03, "error")],
    "D04": [(f_d04, "error")],
    "D05": [(f_d05, "error")],
    "D06": [(f_d06, "error")],
    "D07": [(f_d07, "error")],
    "D08": [(f_d08, "error"), (f_d08_no_tok, "warning")],
    "D09": [(f_d09, "error")],
    "D10": [(f_d10, "error"), (f_d10_tok, "error")],
    "D11": [(f_d11, "warning")],
    "D12": [(f_d12, "warning")],
    "D13": [(f_d13, "warning")],
    "D14": [(f_d14, "error")],
    "D15": [(f_d15, "warning")],
    "D16": [(f_d16, "warning")],
    "D17": [(f_d17, "warning")],
    "D18": [(f_d18, "warning")],
    "D19": [(f_d19, "warning")],
    "D20": [(f_d20, "warning")],
    "D21": [(f_d21, "warning")],
    "D22": [(f_d22, "error")],
    "D23": [(f_d23, "warning")],
    "D24": [(f_d24, "error")],
    "D25": [(f_d25, "warning")],
    "D26": [(f_d26, "warning")],
    "D27": [(f_d27, "warning"), (f_d27_one_label, "error")],
    "C01": [(f_c01, "warning")],
    "C02": [(f_c02, "error")],
    "C03": [(f_c03, "error")],
    "C04": [(f_c04, "error")],
    "C05": [(f_c05, "error")],
    "C06": [(f_c06, "info")],
    "C07": [(f_c07, "error")],
    "C08": [(f_c08, "warning"), (f_c08_messages, "warning"), (f_c08_flat, "warning")],
    "C09": [(f_c09, "warning")],
    "C10": [(f_c10, "error")],
    "C11": [(f_c11, "error")],
    "C12": [(f_c12, "warning")],
    "C13": [(f_c13, "warning")],
    "C14": [(f_c14, "warning")],
    "C15": [(f_c15, "error")],
    "C16": [(f_c16, "warning")],
    "C17": [(f_c17, "error")],
    "C18": [(f_c18, "warning")],
    "C19": [(f_c19, "error"), (f_c19_inf, "error")],
    "C20": [(f_c20, "warning"), (f_c20_prompt, "error")],
    "C21": [(f_c21, "warning")],
    "C22": [(f_c22, "warning"), (f_c22_sync, "error")],
    "C23": [(f_c23, "error"), (f_c23_cpu, "warning"), (f_c23_dora, "error")],
    "T01": [(f_t01, "error")],
    "T02": [(f_t02, "warning")],
    "T03": [(f_t03, "warning"), (f_t03_rows, "warning")],
    "L01": [(f_l01, "error")],
    "L02": [(f_l02, "error")],
    "L03": [(f_l03, "warning")],
    "L04": [(f_l04, "warning")],
    "L05": [(f_l05, "warning")],
    "L06": [(f_l06, "warning")],
    "L07": [(f_l07, "warning")],
    "L08": [(f_l08, "warning")],
    "L09": [(f_l09, "warning")],
    "L10": [(f_l10, "error")],
    "L11": [(f_l11, "warning")],
}


# -------------------------------------------------------------------- clean counterparts for checks the clean run skips
GEN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def n_d09(w):
    return dict(data=w.data_with(_msgs(w)))


def n_d10(w):
    rows = _rows_pc(w)
    for r in rows:
        r["prompt"] = r["prompt"] + "answer:"
    return dict(data=w.data_with(rows), tokenizer=w.tok_dir, configs=[w.config_with(response_template="answer:")])


def n_c09(w):
    return dict(configs=[w.config_with(assistant_only_loss=True)], tokenizer=w.tok_copy(chat_template=GEN_TEMPLATE))


def n_c11(w):
    return dict(
        configs=[w.config_with(packing=True, attn_implementation="flash_attention_2")],
        data=w.data,
        versions=["trl=0.21.0"],
    )


def n_c12(w):
    return dict(configs=[w.config_with(packing=True, attn_implementation="flash_attention_2")], versions=["trl=0.21.0"])


def n_t01(w):
    return dict(data=w.data_with(_conv_pc(w)), tokenizer=w.tok_dir, configs=[w.config])


def n_l08(w):
    return dict(logs=w.write_json("trainer_state.json", clean_trainer_state(n_rows=2000)))


def n_c20(w):
    # alignment-handbook recipes/zephyr-7b-beta/dpo/config_qlora.yaml's DPO settings, as published
    return _yaml_config(w, "dpo.yaml", _ZEPHYR_DPO.format(beta="0.01", lr="5.0e-6"))


def n_c22(w):
    return _yaml_config(w, "qwen3_lora_dpo.yaml", _LF_DPO_ON_SFT.format(extra="create_new_adapter: true\n"))


def n_c21(w):
    return _yaml_config(w, "sft.yaml", _ULTRACHAT_SFT.format(split="train_sft"))


NO_FIRE = {
    "D22": n_pref,
    "D23": n_pref,
    "D24": n_pref,
    "D25": n_pref,
    "D26": n_pref,
    "D27": n_kto,
    "C21": n_c21,
    "C22": n_c22,
    "C23": n_c23,
    "C20": n_c20,
    "D09": n_d09,
    "D10": n_d10,
    "C09": n_c09,
    "C11": n_c11,
    "C12": n_c12,
    "T01": n_t01,
    "L08": n_l08,
}

SEV = {"error": 0, "warning": 1, "info": 2}


def test_every_check_has_fixtures(clean_result):
    ids = [c.id for c in all_checks()]
    assert len(ids) >= 41
    assert sorted(FIRE) == sorted(ids)
    not_clean = set(ids) - set(clean_result.passed)
    assert not_clean <= set(NO_FIRE), f"checks with no non-firing fixture: {sorted(not_clean - set(NO_FIRE))}"


CASES = [(cid, fn, sev) for cid, lst in FIRE.items() for fn, sev in lst]


@pytest.mark.parametrize("cid,fn,sev", CASES, ids=[f"{c}-{f.__name__}" for c, f, _ in CASES])
def test_check_fires(world, cid, fn, sev):
    res = diagnose(**fn(world), select=[cid])
    found = res.by_id(cid)
    assert found, f"{cid} did not fire; skipped: {[s.reason for s in res.skipped if s.id == cid]}"
    worst = min(found, key=lambda f: SEV[f.severity])
    assert worst.severity == sev, worst.message
    for f in found:
        assert f.message and f.fix and isinstance(f.evidence, dict)
        if f.id.startswith("L"):
            assert f.steps or f.severity == "info"


def test_d10_token_match_names_the_rows(world):
    res = diagnose(**f_d10_tok(world), select=["D10"])
    assert res.by_id("D10")[0].row_ids == [f"r{k}" for k in range(20)]


@pytest.mark.parametrize("cid", sorted(NO_FIRE))
def test_check_does_not_fire(world, cid):
    res = diagnose(**NO_FIRE[cid](world), select=[cid])
    assert cid in res.passed, [(f.message) for f in res.by_id(cid)] or [s.reason for s in res.skipped if s.id == cid]


def test_impossible_values_skip_the_checks_that_compute_with_them(world):
    """C19's fixture: C03/C04 (and the token checks reading max_length) are skipped with the reason, not passed."""
    res = diagnose(**f_c19(world), tokenizer=world.tok_dir)
    (f,) = res.by_id("C19")
    assert {"learning_rate", "num_epochs", "micro_batch_size", "max_length", "lora_r"} <= set(f.evidence["value"])
    reasons = {s.id: s.reason for s in res.skipped}
    for cid in ("C01", "C02", "C03", "C04", "C13", "C18", "D04", "D05", "C07"):
        assert cid not in res.passed and "impossible" in reasons[cid], (cid, reasons.get(cid))


# a training template with a {% generation %} block that covers the end of turn (the shape of TRL's
# chat_templates/qwen2_5_training.jinja), installed by the config itself (alignment-handbook recipes carry a
# chat_template: key; TRL's chat_template_path may name a .jinja file)
_GEN_TEMPLATE = CHATML_GEN_TURNS


def test_c09_reads_the_configs_own_chat_template(world):
    """main: "C09 assistant_only_loss=true but the chat template has no {% generation %} block" although the
    config installs a template that has one."""
    res = diagnose(configs=[world.config_with(assistant_only_loss=True)], tokenizer=world.tok, select=["C09"])
    assert res.by_id("C09")  # the tokenizer's own template has no block
    cfg = world.config_with(assistant_only_loss=True, chat_template=_GEN_TEMPLATE)
    res = diagnose(configs=[cfg], tokenizer=world.tok, select=["C09"])
    assert "C09" in res.passed, [f.message for f in res.by_id("C09")]
    jinja = world.write_text("train.jinja", _GEN_TEMPLATE)
    cfg = world.config_with(assistant_only_loss=True, chat_template_path=Path(jinja).name)
    assert Path(cfg).parent == Path(jinja).parent
    res = diagnose(configs=[cfg], tokenizer=world.tok, select=["C09"])
    assert "C09" in res.passed, [f.message for f in res.by_id("C09")]


def test_c04_max_steps_inside_the_first_epoch_names_the_rows_never_trained(world):
    """The world's 400 rows at an effective batch of 16: max_steps 20 covers 320 of them, so 80 (20%) were never
    trained (warning, with the count); max_steps 25 covers the epoch (no warning); a packed run's steps hold several
    rows each, so its coverage is not judged."""
    short = diagnose(configs=[world.config_with(max_steps=20)], data=world.data, select=["C04"]).by_id("C04")
    (hit,) = [f for f in short if "never trained" in f.message]
    assert hit.severity == "warning" and hit.evidence["never_trained"] == 80 and "80% into its first" in hit.message
    assert hit.fix.startswith("set max_steps to at least 25 (one epoch at this batch)")
    for cfg in (world.config_with(max_steps=25), world.config_with(max_steps=20, packing=True)):
        found = diagnose(configs=[cfg], data=world.data, select=["C04"]).by_id("C04")
        assert not any("never trained" in f.message for f in found)


def test_c12_trl_packing_on_versions_that_keep_rows_apart(world):
    """TRL >= 1.16 with transformers >= 5.24 keeps packed rows apart on sdpa (tests/data/test_trl_packing.py): C12
    passes; with the versions unknown it says so as info; a known older TRL keeps the warning, as does 'wrapped'."""
    packed = world.config_with(packing=True)
    assert "C12" in diagnose(configs=[packed], versions=["trl=1.16.0", "transformers=5.24.0"], select=["C12"]).passed
    (info,) = diagnose(configs=[packed], select=["C12"]).by_id("C12")
    assert info.severity == "info" and "--versions" in info.message
    old = diagnose(configs=[packed], versions=["trl=0.21.0", "transformers=5.24.0"], select=["C12"]).by_id("C12")
    assert [f.severity for f in old] == ["warning"]
    wrapped = world.config_with(packing=True, packing_strategy="wrapped")
    new = ["trl=1.16.0", "transformers=5.24.0"]
    assert [f.severity for f in diagnose(configs=[wrapped], versions=new, select=["C12"]).by_id("C12")] == ["warning"]


def test_c12_axolotl_packing_with_attention_that_drops_its_mask(tmp_path):
    """axolotl >= 0.19 drops the packed attention mask for sdpa / eager and keeps rows apart (its own trainer, run in
    tests/data/test_framework_packing.py): C12 passes; version unknown: info; older, or no attn_implementation (axolotl
    then keeps its segment-id mask, and rows attend across): the warning stays."""

    def cfg(extra: str):
        path = tmp_path / f"axolotl{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text(
            "base_model: m\nadapter: lora\nsample_packing: true\nsequence_len: 512\n"
            "datasets:\n  - path: d.jsonl\n    type: chat_template\n" + extra
        )
        return str(path)

    def severities(path, versions=()):
        res = diagnose(configs=[path], versions=list(versions), select=["C12"])
        return "passed" if "C12" in res.passed else [f.severity for f in res.by_id("C12")]

    for attn in ("attn_implementation: sdpa\n", "attn_implementation: eager\n", "sdp_attention: true\n"):
        assert severities(cfg(attn), ["axolotl=0.19.0"]) == "passed"
        assert severities(cfg(attn)) == ["info"]
        assert severities(cfg(attn), ["axolotl=0.18.0"]) == ["warning"]
    assert severities(cfg(""), ["axolotl=0.19.0"]) == ["warning"]
    assert severities(cfg("flash_attention: true\n")) == "passed"


def test_c12_llamafactory_packing_is_kept_apart_by_neat_packing_only(tmp_path):
    """LLaMA-Factory 0.9.5's collator keeps packed rows apart with neat_packing (a block-diagonal mask for sdpa / eager,
    varlen for flash attention 2), and never without it, flash attention included: its plain packing keeps an
    all-ones mask (tests/data/test_framework_packing.py runs its trainer)."""

    def severities(extra: str):
        path = tmp_path / f"lf{len(list(tmp_path.iterdir()))}.yaml"
        path.write_text("model_name_or_path: m\nstage: sft\nfinetuning_type: lora\ntemplate: qwen\n" + extra)
        res = diagnose(configs=[str(path)], select=["C12"])
        return "passed" if "C12" in res.passed else [f.severity for f in res.by_id("C12")]

    assert severities("neat_packing: true\n") == "passed"
    assert severities("neat_packing: true\nflash_attn: sdpa\n") == "passed"
    assert severities("packing: true\nflash_attn: sdpa\n") == ["warning"]
    assert severities("packing: true\nflash_attn: fa2\n") == ["warning"]
