"""Loading a user's base model, tokenizer and PEFT LoRA adapter, with checks.

* Base model: an HF id (resolved from the local HF cache; Gradian never needs
  the network if the model is cached) or a local folder, loaded with
  ``AutoModelForCausalLM``. ``trust_remote_code`` is off unless asked for.
  A ``gguf_file`` inside the folder is supported (it is de-quantised).
* Adapter: a PEFT folder holding ``adapter_config.json`` and
  ``adapter_model.safetensors`` (``.bin`` is read with ``weights_only=True``).
  Before PEFT touches it we check: the adapter type is LoRA (plain or DoRA; IA3,
  prompt tuning, ... are refused), the target modules exist in the base, and
  every ``lora_A``/``lora_B`` (and DoRA magnitude) shape matches the base layer it
  attaches to.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

import torch

from gradian.errors import GradianUserError
from gradian.models.spec import _DEVICE, DTYPE_NAMES, ModelSpec, check_device  # noqa: F401 (their home until now)
from gradian.safeio import check_regular_file, check_size, load_json_file, short_repr

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
T = TypeVar("T")


def resolve_dtype(name: str) -> torch.dtype:
    """The torch dtype named ``name`` (a key of :data:`DTYPES`); any other name is a user error on ``--dtype``."""
    if name not in DTYPES:
        raise GradianUserError(f"unknown dtype {name!r}", where="--dtype", fix=f"use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def resolve_device(name: str) -> str:
    """The concrete device to load on, checked against this machine.

    ``auto`` picks CUDA, else MPS, else CPU. An explicit ``cuda``/``cuda:N``/``mps`` that this machine
    does not have is a one-line user error on ``--device`` (not a crash inside ``model.to``).

    Returns:
        ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"``.
    """
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    check_device(name)
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise GradianUserError("CUDA is not available on this machine", where="--device", fix="use --device cpu")
    if name.startswith("cuda:") and int(name.split(":")[1]) >= torch.cuda.device_count():
        raise GradianUserError(
            f"there is no {name} (this machine has {torch.cuda.device_count()} CUDA device(s))",
            where="--device",
            fix="use --device cuda:0, or --device auto",
        )
    if name == "mps" and not (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()):
        raise GradianUserError("MPS is not available on this machine", where="--device", fix="use --device cpu")
    return name


def _find_gguf(folder: Path) -> str | None:
    if folder.is_dir() and not (folder / "config.json").exists():
        ggufs = sorted(folder.glob("*.gguf"))
        if ggufs:
            return ggufs[0].name
    return None


def _first_line(e: BaseException, limit: int = 160) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:limit]}" if text else type(e).__name__


def quiet_transformers() -> None:
    """Silence transformers' own progress bars and info logs (Gradian shows its own progress)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def _adapter_base_name(folder: Path) -> str | None:
    """``base_model_name_or_path`` of a PEFT adapter folder (None when it names none or is unreadable)."""
    try:
        obj = load_json_file(folder / "adapter_config.json", "adapter config")
    except GradianUserError:
        return None
    name = obj.get("base_model_name_or_path") if isinstance(obj, dict) else None
    return name if isinstance(name, str) and name else None


def resolve_base(spec: ModelSpec, need: tuple[str, ...] = ("config.json",)) -> tuple[str, dict[str, Any]]:
    """Where ``spec.base`` is on this machine, and the loading keywords that keep it local.

    A local folder is used as is, unless it is a PEFT adapter folder (``adapter_config.json``, no
    ``config.json``): that is a user error naming its ``base_model_name_or_path`` and the fix. Any
    other name is an HF id, looked up in the local HF cache only
    (``huggingface_hub.try_to_load_from_cache``, no network): an id with none of the ``need``
    files cached fails at once; a cached one loads with ``local_files_only=True`` (never a
    network retry).

    Returns:
        ``(base, kwargs)`` with ``kwargs`` holding ``local_files_only`` for a cached id.
    """
    p = Path(spec.base).expanduser()
    if p.exists():
        if p.is_dir() and (p / "adapter_config.json").is_file() and not (p / "config.json").is_file():
            name = _adapter_base_name(p)
            raise GradianUserError(
                "this is a LoRA adapter folder (adapter_config.json), not a base model"
                + (f"; it was trained on {name!r}" if name else ""),
                where=f"--base {spec.base}",
                fix=f"pass --base {name or '<the base model>'} --adapter {spec.base}",
            )
        return str(p), {}
    looks_local = spec.base.startswith((".", "/", "~")) or spec.base.count("/") > 1 or "\\" in spec.base
    if looks_local:
        raise GradianUserError("base model folder not found", where=f"--base {spec.base}", fix="check the path")
    try:
        from huggingface_hub import try_to_load_from_cache
        from huggingface_hub.constants import HF_HUB_CACHE

        names = (spec.gguf_file,) if spec.gguf_file else need
        hits = [try_to_load_from_cache(spec.base, n) for n in names]
    except Exception as e:  # HFValidationError: not a valid repo id
        raise GradianUserError(
            f"not a local folder nor a valid HF id ({_first_line(e, 100)})",
            where=f"--base {spec.base}",
            fix="pass a local model folder or an HF id in the local cache",
        ) from None
    if not any(isinstance(h, str) for h in hits):
        raise GradianUserError(
            f"not a local folder, and the HF id is not in the local cache ({HF_HUB_CACHE})",
            where=f"--base {spec.base}",
            fix=f"download it first (huggingface-cli download {spec.base}) or pass a local model folder",
        )
    return spec.base, {"local_files_only": True}


def load_tokenizer(spec: ModelSpec):
    """The base model's tokenizer (from the GGUF file when the folder holds one), with a pad token.

    A tokenizer without a pad token gets its EOS token as pad; padding is never supervised
    (:func:`gradian.data.tokenize.collate`), so this masks no real EOS.

    Raises:
        GradianUserError: the folder or id holds no loadable tokenizer.
    """
    from transformers import AutoTokenizer

    base, local = resolve_base(spec, ("tokenizer_config.json", "tokenizer.json", "config.json"))
    kw: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code, **local}
    gguf = spec.gguf_file or _find_gguf(Path(base))
    if gguf:
        kw["gguf_file"] = gguf
    try:
        tok = AutoTokenizer.from_pretrained(base, **kw)
    except (
        Exception
    ) as e:  # transformers/tokenizers raise many types on a bad folder (OSError, ValueError, KeyError ...)
        raise GradianUserError(
            f"cannot load a tokenizer ({_first_line(e)})",
            where=spec.base,
            fix="pass a local model folder or an HF id that is in the local cache",
        ) from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base(spec: ModelSpec):
    """Load the base causal LM in eval mode (dropout off), all parameters frozen.

    Returns:
        ``(model, tokenizer)``.
    """
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    dtype = resolve_dtype(spec.dtype)
    device = resolve_device(spec.device)
    base, local = resolve_base(spec)
    kw: dict[str, Any] = {"trust_remote_code": spec.trust_remote_code, **local}
    gguf = spec.gguf_file or _find_gguf(Path(base))
    if gguf:
        kw["gguf_file"] = gguf
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype, **kw)
            except TypeError:  # transformers 4.x spells it torch_dtype
                model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=dtype, **kw)
    except Exception as e:  # OSError, ValueError, but also KeyError/RuntimeError/SafetensorError on damaged files
        msg = _first_line(e, 200)
        fix = "pass a local model folder, or an HF id already in the local cache"
        if "trust_remote_code" in str(e):
            fix = "this model needs custom code: pass --trust-remote-code if you trust it"
        raise GradianUserError(f"cannot load the base model ({msg})", where=spec.base, fix=fix) from None
    model.to(device=device, dtype=dtype)
    if spec.quantize:  # a QLoRA run: the 4-bit base its adapter was trained on
        from gradian.models.quant import quantize_base

        src = spec.quantize_from or _stored_dtype(base, kw)
        model.gradian_quantization = quantize_base(model, spec.quantize, DTYPES[src])
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, load_tokenizer(spec)


def _stored_dtype(base: str, kw: dict[str, Any]) -> str:
    """The dtype the base's config.json names (``dtype`` / ``torch_dtype``), as a :data:`DTYPE_NAMES` name: the one
    a trainer loads it in with ``dtype="auto"``; float32 when it names none (or for a GGUF base).
    """
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(base, **{k: v for k, v in kw.items() if k != "gguf_file"})
    except Exception:  # a GGUF-only folder has no config.json: its weights are de-quantised to float32
        return "float32"
    named = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    name = str(named).split(".")[-1] if named is not None else "float32"
    return name if name in DTYPES else "float32"


# --------------------------------------------------------------------------- adapters

SUPPORTED_PEFT = {"LORA"}


def read_adapter_config(adapter_dir: str | Path) -> dict[str, Any]:
    """The parsed ``adapter_config.json`` of a PEFT adapter folder (bounded read).

    Raises:
        GradianUserError: the folder or its config is missing, or the config is not a JSON object.
    """
    d = Path(adapter_dir)
    cfg_path = d / "adapter_config.json"
    if not d.is_dir():
        raise GradianUserError(
            "adapter folder not found", where=str(d), fix="pass the folder PEFT's save_pretrained wrote"
        )
    if not cfg_path.exists():
        from gradian.paths import checkpoint_folders

        saved = checkpoint_folders(d)  # a run's output folder with no final adapter at its top (torchtune's)
        raise GradianUserError(
            "no adapter_config.json in the adapter folder"
            + (
                f" (a training run's output folder: its checkpoints are {saved[0].name}..{saved[-1].name})"
                if saved
                else ""
            ),
            where=str(d),
            fix=f"pass its last checkpoint, --adapter {saved[-1]}"
            if saved
            else "pass the folder PEFT's save_pretrained wrote",
        )
    cfg = load_json_file(cfg_path, "adapter config", fix="fix the JSON, or re-save the adapter with PEFT")
    if not isinstance(cfg, dict):
        raise GradianUserError(
            f"top level is a JSON {type(cfg).__name__}, not an object",
            where=str(cfg_path),
            fix="re-save the adapter with PEFT's save_pretrained",
        )
    return cfg


def _checked_weights(obj: Any, where: str) -> dict[str, torch.Tensor]:
    """``obj`` (what the weights file held) as ``{name: tensor}``: a dict of dense, finite, floating-point tensors.

    Raises:
        GradianUserError: naming the file and, for a bad value, its key.
    """
    fix = "re-save the adapter with PEFT's save_pretrained (safetensors)"
    if not isinstance(obj, dict):
        raise GradianUserError(
            f"the file holds {short_repr(obj, 40)}, not a dict of tensors (name -> tensor)", where=where, fix=fix
        )
    for k, t in obj.items():
        if not isinstance(k, str):
            raise GradianUserError(f"key {short_repr(k, 40)} is not a tensor name", where=where, fix=fix)
        if not isinstance(t, torch.Tensor):
            raise GradianUserError(f"{k} is {short_repr(t, 40)}, not a tensor", where=where, fix=fix)
        if t.layout != torch.strided or not t.dtype.is_floating_point:
            raise GradianUserError(
                f"{k} is a {t.dtype} {str(t.layout).replace('torch.', '')} tensor, not a dense floating-point one",
                where=where,
                fix=fix,
            )
        if not bool(torch.isfinite(t).all()):
            raise GradianUserError(
                f"{k} holds NaN or inf", where=where, fix=fix + " from a run whose loss stayed finite"
            )
    return obj


def read_adapter_weights(adapter_dir: str | Path) -> dict[str, torch.Tensor]:
    """The adapter's tensors. safetensors preferred; ``.bin`` only with ``weights_only=True``.

    Either way the content is checked (:func:`_checked_weights`): a dict of names to dense, finite,
    floating-point tensors.
    """
    d = Path(adapter_dir)
    st = d / "adapter_model.safetensors"
    if st.exists():
        from safetensors.torch import load_file

        check_size(st, check_regular_file(st, "adapter weights").st_size, "adapter weights")
        try:
            obj = load_file(str(st))
        except Exception as e:
            raise GradianUserError(
                f"unreadable safetensors ({type(e).__name__})", where=str(st), fix="re-save the adapter"
            ) from None
        return _checked_weights(obj, str(st))
    binf = d / "adapter_model.bin"
    if binf.exists():
        check_size(binf, check_regular_file(binf, "adapter weights").st_size, "adapter weights")
        try:
            obj = torch.load(str(binf), map_location="cpu", weights_only=True)
        except Exception as e:
            raise GradianUserError(
                f"cannot read adapter_model.bin safely ({type(e).__name__}); Gradian never unpickles arbitrary objects",
                where=str(binf),
                fix="re-save the adapter with safe_serialization=True (safetensors)",
            ) from None
        return _checked_weights(obj, str(binf))
    raise GradianUserError(
        "no adapter_model.safetensors in the adapter folder",
        where=str(d),
        fix="pass the folder PEFT's save_pretrained wrote",
    )


def _module_suffix(key: str) -> tuple[str, str] | None:
    """``...layers.0.self_attn.q_proj.lora_A.weight`` → (``layers.0.self_attn.q_proj``, ``lora_A``)."""
    parts = key.split(".")
    for tag in ("lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector"):
        if tag in parts:
            i = parts.index(tag)
            return ".".join(parts[:i]), tag
    return None


def _in_out(module: torch.nn.Module) -> tuple[int, int] | None:
    """(in_features, out_features) of a Linear or GPT-2 Conv1D; None for other layers."""
    if isinstance(module, torch.nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D":  # transformers.pytorch_utils.Conv1D, weight (in, out)
        w = module.weight
        return int(w.shape[0]), int(w.shape[1])
    return None


def check_adapter_fits(
    model: torch.nn.Module,
    adapter_dir: str | Path,
    cfg: dict[str, Any] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
) -> None:
    """Refuse adapters Gradian cannot handle and adapters that do not fit ``model``.

    ``cfg`` and ``weights``, when given, are the adapter's config and tensors already read (else read here).

    Raises :class:`GradianUserError` with the module and shapes that disagree.
    """
    d = Path(adapter_dir)
    cfg = cfg if cfg is not None else read_adapter_config(d)
    where = str(d / "adapter_config.json")
    ptype = str(cfg.get("peft_type", "")).upper()
    if ptype not in SUPPORTED_PEFT:
        raise GradianUserError(
            f"adapter type {ptype or '(missing peft_type)'} is not supported; "
            "Gradian attributes through LoRA matrices only",
            where=f"{where}: peft_type",
            fix="use a LoRA adapter (peft_type LORA)",
        )
    r_cfg = cfg.get("r")
    if "r" in cfg and (isinstance(r_cfg, bool) or not isinstance(r_cfg, int) or r_cfg < 1):
        raise GradianUserError(
            f"r is {r_cfg!r}; a LoRA rank must be a positive whole number",
            where=f"{where}: r",
            fix="set r to the rank of the saved lora_A/lora_B weights (re-save the adapter with PEFT)",
        )
    alpha = cfg.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (alpha == alpha and abs(alpha) < 1e12):
        raise GradianUserError(
            f"lora_alpha is {alpha!r}, not a number",
            where=f"{where}: lora_alpha",
            fix="set lora_alpha to the value the adapter was trained with",
        )
    modules = dict(model.named_modules())
    _check_target_modules(cfg.get("target_modules"), modules, where)
    weights = weights if weights is not None else read_adapter_weights(d)
    # Map the adapter's module paths onto the base's by longest matching suffix.
    base_names = list(modules)
    checked = magnitudes = 0
    for key, t in weights.items():
        parsed = _module_suffix(key)
        if parsed is None:
            continue
        path, tag = parsed
        if tag.startswith("lora_embedding"):
            raise GradianUserError(
                f"LoRA on an embedding layer ({path}) is not supported",
                where=str(d),
                fix="attribute an adapter whose target_modules are Linear layers",
            )
        if tag in ("lora_A", "lora_B") and key.endswith(".bias"):
            raise GradianUserError(
                f"the adapter has a bias on its LoRA matrices ({key}: PEFT's lora_bias), which Gradian does not "
                "attribute",
                where=f"{where}: lora_bias",
                fix="attribute an adapter trained with lora_bias false (PEFT's default)",
            )
        if tag == "lora_magnitude_vector" and not cfg.get("use_dora"):
            raise GradianUserError(
                f"the adapter has a DoRA magnitude vector ({key}) but adapter_config.json does not set use_dora, so "
                "PEFT would load another model than the one trained",
                where=f"{where}: use_dora",
                fix="set use_dora: true in adapter_config.json (or re-save the adapter with PEFT)",
            )
        stripped = path
        for prefix in ("base_model.model.", "base_model."):
            if stripped.startswith(prefix):
                stripped = stripped[len(prefix) :]
                break
        target = modules.get(stripped)
        if target is None:
            cands = [n for n in base_names if n.endswith("." + stripped) or stripped.endswith("." + n)]
            target = modules[cands[0]] if len(cands) == 1 else None
        if target is None:
            raise GradianUserError(
                f"the adapter targets module {stripped!r}, which the base model does not have",
                where=str(d),
                fix="pass the base model this adapter was trained on (see base_model_name_or_path)",
            )
        io = _in_out(target)
        if io is None:
            raise GradianUserError(
                f"the adapter targets {stripped!r}, a {type(target).__name__}; only Linear/Conv1D layers are supported",
                where=str(d),
                fix="attribute an adapter on Linear layers",
            )
        fin, fout = io
        if cfg.get("fan_in_fan_out") and type(target).__name__ != "Conv1D":
            fin, fout = fout, fin
        if tag == "lora_magnitude_vector":
            if tuple(t.shape) != (fout,):
                raise GradianUserError(
                    f"{key} has shape {tuple(t.shape)} but the base layer {stripped} needs ({fout},)",
                    where=str(d),
                    fix="pass the base model this adapter was trained on (see base_model_name_or_path)",
                )
            magnitudes += 1
            continue
        if t.dim() != 2:
            raise GradianUserError(
                f"{key} has shape {tuple(t.shape)}; a LoRA matrix has 2 dimensions",
                where=str(d),
                fix="re-save the adapter with PEFT's save_pretrained",
            )
        r = t.shape[0] if tag == "lora_A" else t.shape[1]
        if r_cfg is not None and not cfg.get("rank_pattern") and r != r_cfg:
            raise GradianUserError(
                f"{key} has rank {r} but adapter_config.json says r = {r_cfg}",
                where=f"{where}: r",
                fix="set r to the saved weights' rank (re-save the adapter with PEFT)",
            )
        if not _targeted(stripped, cfg.get("target_modules")):
            raise GradianUserError(
                f"the adapter has weights for {stripped!r}, but target_modules does not name it, so PEFT would "
                "silently drop them",
                where=f"{where}: target_modules",
                fix="add the module to target_modules (or re-save the adapter with PEFT)",
            )
        expected = (r, fin) if tag == "lora_A" else (fout, r)
        if tuple(t.shape) != expected:
            raise GradianUserError(
                f"{key} has shape {tuple(t.shape)} but the base layer {stripped} needs {expected}",
                where=str(d),
                fix="pass the base model this adapter was trained on (see base_model_name_or_path)",
            )
        checked += 1
    if checked == 0:
        raise GradianUserError("the adapter holds no LoRA weights", where=str(d), fix="re-save the adapter with PEFT")
    if cfg.get("use_dora") and magnitudes * 2 != checked:
        raise GradianUserError(
            f"use_dora is set but the adapter holds {magnitudes} DoRA magnitude vectors for {checked // 2} LoRA "
            "layers; PEFT would start the missing ones from the base weights' norms, not the trained values",
            where=str(d),
            fix="re-save the adapter with PEFT's save_pretrained (it writes every lora_magnitude_vector)",
        )


def _targeted(module_path: str, target_modules: Any) -> bool:
    """Whether PEFT's ``target_modules`` selects ``module_path`` (suffix match for a list, full regex match
    for a string; ``all-linear`` selects every Linear).
    """
    if target_modules is None:
        return True  # PEFT picks the architecture's defaults; the shape check still applies
    if isinstance(target_modules, str):
        if target_modules == "all-linear":
            return True
        try:
            return re.fullmatch(target_modules, module_path) is not None
        except re.error:
            return False
    return any(module_path == t or module_path.endswith("." + t) for t in target_modules if isinstance(t, str))


def _check_target_modules(target_modules: Any, modules: dict[str, torch.nn.Module], where: str) -> None:
    """Every entry of a list ``target_modules`` must name a module of the base (PEFT raises, or silently
    skips it); a regex string must match at least one.
    """
    if target_modules is None or target_modules == "all-linear":
        return
    names = [n for n in modules if n]
    if isinstance(target_modules, str):
        try:
            re.compile(target_modules)
        except re.error as e:
            raise GradianUserError(
                f"target_modules is not a valid regular expression ({e})",
                where=f"{where}: target_modules",
                fix="list the module names instead",
            ) from None
        if not any(re.fullmatch(target_modules, n) for n in names):
            raise GradianUserError(
                f"target_modules {target_modules!r} matches no module of the base model",
                where=f"{where}: target_modules",
                fix="pass the base model this adapter was trained on (see base_model_name_or_path)",
            )
        return
    if not isinstance(target_modules, (list, tuple)) or not all(isinstance(t, str) for t in target_modules):
        raise GradianUserError(
            "target_modules must be a list of module names or a regex string",
            where=f"{where}: target_modules",
            fix="re-save the adapter with PEFT",
        )
    missing = [t for t in target_modules if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in modules.items() if _in_out(m) is not None})
        raise GradianUserError(
            f"target_modules names {', '.join(map(repr, missing))}, which the base model does not have",
            where=f"{where}: target_modules",
            fix="pass the base model this adapter was trained on "
            f"(this base's Linear layers: {', '.join(leaves[:10])})",
        )


def load_adapter(model: torch.nn.Module, adapter_dir: str | Path, base_name: str | None = None):
    """Attach a checked LoRA adapter to ``model`` with PEFT.

    Only LoRA parameters require grad; LoRA dropout is disabled (eval mode and
    dropout modules replaced by identity), so gradients are deterministic.

    Returns:
        ``(peft_model, adapter_config_dict, notes)``; ``notes`` lists non-fatal
        observations (e.g. a ``base_model_name_or_path`` that names another model).
    """
    from peft import PeftModel

    from gradian.models.torchtune_export import is_torchtune_export, torchtune_fix

    cfg = read_adapter_config(adapter_dir)
    tt = None
    if is_torchtune_export(adapter_dir):  # torchtune's export: its weights are read here, and checked as put right
        tt = torchtune_fix(
            read_adapter_weights(adapter_dir), adapter_dir, getattr(model, "config", None), bool(cfg.get("use_dora"))
        )
        if tt.dora:
            cfg = {**cfg, "use_dora": True}
    check_adapter_fits(model, adapter_dir, cfg, tt.weights if tt else None)
    notes: list[str] = [n for n in [not_attributed(cfg), residual_base(cfg)] if n] + (tt.notes if tt else [])
    declared = cfg.get("base_model_name_or_path")
    if declared and base_name:
        a = Path(str(declared).rstrip("/")).name.lower()
        b = Path(str(base_name).rstrip("/")).name.lower()
        if a and b and a != b and a not in b and b not in a:
            notes.append(
                f"adapter_config.json says base_model_name_or_path={declared!r}, but the base given is {base_name!r}; "
                "the shapes fit, so Gradian continues"
            )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_config = None
            if tt is not None and tt.dora:  # DoRA, as torchtune trained it, though its adapter_config.json omits it
                from peft import PeftConfig

                peft_config = PeftConfig.from_pretrained(str(adapter_dir))
                peft_config.use_dora = True
            peft_model = PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True, config=peft_config)
    except Exception as e:  # PEFT raises ValueError/TypeError/KeyError/RuntimeError on configs it cannot apply
        raise GradianUserError(
            f"PEFT cannot load this adapter ({_first_line(e)})",
            where=str(Path(adapter_dir) / "adapter_config.json"),
            fix="re-save the adapter with PEFT's save_pretrained, against the base model it was trained on",
        ) from None
    if tt is not None:  # put right: loaded as torchtune trained it, and in the index identity (finetune.py)
        if tt.tag is not None:
            set_lora_weights(peft_model, tt.weights, adapter_dir)
        tags = [t for t in (tt.tag, "torchtune-use-dora" if tt.dora else None) if t]
        if tags:
            peft_model.gradian_adapter_fix = "+".join(tags)
    prepare_lora_for_gradients(peft_model)
    return peft_model, cfg, notes


def not_attributed(cfg: dict[str, Any]) -> str | None:
    """A note naming what else the adapter trained (PEFT's ``modules_to_save``, ``trainable_token_indices``, a
    ``bias`` other than ``none``): those parameters are loaded, so the model is the one trained, but the gradients
    Gradian scores are the LoRA matrices' (and DoRA magnitudes') only. None when the adapter trained nothing else.
    """
    what = []
    saved = cfg.get("modules_to_save")
    if saved:
        what.append(f"modules_to_save {saved if isinstance(saved, str) else ', '.join(map(str, saved))} (whole layers)")
    if cfg.get("trainable_token_indices"):
        what.append("trainable_token_indices (embedding rows)")
    if cfg.get("bias") not in (None, "none"):
        what.append(f"bias: {cfg['bias']} (the base layers' biases)")
    if not what:
        return None
    return (
        f"the adapter also trained {'; '.join(what)}: they are loaded, so the model is the one trained, but the "
        "scores use the LoRA matrices' gradients only, so what those parameters learned from a row is not in them"
    )


#: PEFT ``init_lora_weights`` values that change the base weights at initialisation (the adapter then adds to the
#: residual base PEFT computed, unless it was saved with ``path_initial_model_for_weight_conversion``, which converts
#: it to a plain LoRA of twice the rank and writes ``init_lora_weights: true``)
_RESIDUAL_INITS = ("pissa", "olora", "corda", "loftq")


def residual_base(cfg: dict[str, Any]) -> str | None:
    """A note when the adapter was initialised by a method that rewrites the base (PiSSA, OLoRA, CorDA, LoftQ) and
    saved without PEFT's conversion: it is meant for that residual base, not the original model. None otherwise.
    """
    init = cfg.get("init_lora_weights")
    if not isinstance(init, str) or not init.lower().startswith(_RESIDUAL_INITS):
        return None
    return (
        f"adapter_config.json says init_lora_weights: {init}: PEFT then rewrites the base weights at initialisation, "
        "so unless --base is the residual model saved then, base + adapter is not the model trained (re-save the "
        "adapter with save_pretrained(path_initial_model_for_weight_conversion=...) to attribute it on the original "
        "base; attribute's data check compares its loss on the training rows with the base's)"
    )


def _dora_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """PEFT's DoRA layers of ``model`` (``lora_magnitude_vector[adapter]``: they hold the ``_dora_cache``)."""
    return [m for m in model.modules() if hasattr(m, "_dora_cache")]


def clear_dora_cache(model: torch.nn.Module) -> None:
    """Forget what PEFT's DoRA layers cached (``BA`` and ``‖W + s·BA‖``): after any change of the adapter's weights."""
    for m in _dora_layers(model):
        m._cache_clear()


@contextlib.contextmanager
def dora_caching(model: torch.nn.Module) -> Iterator[None]:
    """PEFT's DoRA caching on for the block: each DoRA layer forms ``BA`` and its weight norm ``‖W + s·BA‖`` once,
    not in every forward (PEFT's ``ENABLE_DORA_CACHING``, used only in eval mode). The values are the same, so the
    results are; generation, which runs a forward per token, is ~5x faster on SmolLM2 all-linear DoRA. The cache
    holds a full ``BA`` per layer (and PEFT keeps the graph that formed it): +0.9 GB peak RSS over an index build
    on SmolLM2 all-linear DoRA for 8% less time, so Evaluate uses it and the index builds do not. Weights must not
    change inside the block except through :func:`set_lora_weights` or
    :func:`gradian.attribute.trajectory.checkpoint_weights`, which clear the cache. A no-op for a model without DoRA
    layers or a PEFT without the flag; the flag and the caches are restored and cleared on exit.
    """
    from peft.tuners.lora import dora

    if not hasattr(dora, "ENABLE_DORA_CACHING") or not _dora_layers(model):
        yield
        return
    before = dora.ENABLE_DORA_CACHING
    clear_dora_cache(model)
    dora.ENABLE_DORA_CACHING = True
    try:
        yield
    finally:
        dora.ENABLE_DORA_CACHING = before
        clear_dora_cache(model)


def dora_cached(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn(model, ...)`` run inside :func:`dora_caching` of its first argument (a model it holds for its whole call
    and changes only through :func:`set_lora_weights` or checkpoint swaps).
    """

    @functools.wraps(fn)
    def wrapper(model, *args, **kwargs):
        with dora_caching(model):
            return fn(model, *args, **kwargs)

    return wrapper


def set_lora_weights(peft_model: torch.nn.Module, weights: dict[str, torch.Tensor], where: str | Path) -> None:
    """Copy an adapter's PEFT-named LoRA tensors into the loaded ``peft_model`` in place (hooks and module
    references stay valid).

    Raises:
        GradianUserError: a LoRA tensor has no place in the loaded adapter.
    """
    from peft import set_peft_model_state_dict

    with torch.no_grad():
        res = set_peft_model_state_dict(peft_model, weights)
    clear_dora_cache(peft_model)
    unplaced = [k for k in getattr(res, "unexpected_keys", []) if "lora_" in k]
    if unplaced:
        raise GradianUserError(
            f"checkpoint tensor {unplaced[0]} has no place in the loaded adapter",
            where=str(where),
            fix="pass only checkpoints of this adapter's training run (--checkpoints)",
        )


def prepare_lora_for_gradients(peft_model: torch.nn.Module) -> None:
    """Eval mode, LoRA dropout → identity, only ``lora_A``/``lora_B`` weights (and DoRA magnitudes) require grad."""
    peft_model.eval()
    for mod in peft_model.modules():
        if hasattr(mod, "lora_dropout"):
            for k in list(mod.lora_dropout.keys()):
                mod.lora_dropout[k] = torch.nn.Identity()
    for name, p in peft_model.named_parameters():
        p.requires_grad_(is_adapter_param(name))


def is_adapter_param(name: str) -> bool:
    """Whether a PEFT parameter name is one Gradian attributes: a ``lora_A``/``lora_B`` matrix or a DoRA magnitude."""
    return ".lora_A." in name or ".lora_B." in name or ".lora_magnitude_vector." in name
