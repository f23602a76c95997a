"""One resolved training setup: how the user's trainer turned rows into tokens and a loss mask.

:func:`resolve_setup` reads a :class:`~gradian.audit.config.TrainConfig` (the config reader Audit uses:
TRL, axolotl, LLaMA-Factory, torchtune, ``gradian train``), the training rows' format and the explicit
flags, and gives a :class:`TrainingSetup`: each tokenisation field with the source it came from
(``"flag --max-length"``, ``"sft.yaml: max_length"``, ``"default (TRL SFTConfig)"``,
``"TRL 1.16 rule: ..."``). :meth:`TrainingSetup.tokenize_spec` is the :class:`TokenizeSpec` every lane
tokenises with. What Gradian cannot reproduce (packing, a trainer's own truncation or EOS rule, a named
template) is listed in :attr:`TrainingSetup.unreproduced`, never approximated silently.

The loss rule per trainer (``loss_on``, see :mod:`gradian.data.tokenize`):

=================  ==========================================================================================
trainer            rule
=================  ==========================================================================================
TRL (SFTTrainer)   ``assistant_only_loss: true`` -> ``assistant``; a ``messages`` row (conversational language
                   modelling: no completion mask) -> ``all``; prompt/completion: ``completion_only_loss``
                   unset or true -> ``completion``, false -> ``all``; ``text`` -> ``all``
gradian train      a ``messages`` row trains its final assistant turn (``completion``); ``completion_only_loss``
                   false -> ``all``
axolotl            ``train_on_inputs: true`` -> ``all``; chat rows: axolotl's own mask (``train_roles``: the
                   content of ``roles_to_train``, default ``[assistant]``, every role under ``train_on_inputs``,
                   and the EOS after it per ``train_on_eos``, default ``turn``); alpaca rows of ``type: alpaca``:
                   its Alpaca prompt (``chat_rule``, :mod:`gradian.data.axolotl_rules`); another type is noted
LLaMA-Factory      ``train_on_prompt: true`` -> ``all``; chat rows: ``mask_history: true`` -> ``completion``
                   (last turn), else ``assistant`` (every turn); chat and alpaca rows rendered by its own
                   ``template:`` (``chat_rule``, :mod:`gradian.data.llamafactory_rules`), ``cutoff_len`` included,
                   for the templates Gradian implements; another is listed as ``chat_template`` not reproduced
torchtune          ``train_on_input: true`` -> ``all``; chat rows -> ``assistant``, rendered by torchtune's own
                   model tokenizer (``chat_rule``, :mod:`gradian.data.torchtune_rules`) for the Qwen2 / Qwen2.5 and
                   Llama-3 tokenizers, and so are alpaca rows of ``alpaca_dataset`` (its Alpaca prompt as the user
                   message); other instruct rows -> ``completion``
=================  ==========================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from gradian.data.tokenize import TokenizeSpec

if TYPE_CHECKING:  # pragma: no cover
    from gradian.audit.config import Reader, TrainConfig

#: the command-line flag of each setup field a user can set
FLAGS = {"max_length": "--max-length", "loss_on": "--loss-on", "add_eos": "--add-eos"}
#: row formats that are chat conversations (a ``prompt_completion`` row may be one too: ``chat=True``)
CHAT_FORMATS = ("messages",)
_NO_CONFIG = "Gradian default (no --config)"


@dataclass(frozen=True)
class TrainingSetup:
    """The tokenisation a training run used, each field with its source. Serialised into the manifest.

    Attributes:
        trainer: ``"trl"``, ``"gradian"``, ``"axolotl"``, ``"llamafactory"``, ``"torchtune"``, or None (no config).
        max_length: truncation length in tokens; None: the trainer does not truncate.
        truncation: ``"keep_start"``, ``"drop"`` (axolotl's default: a longer row is not trained; its gradient is
            zero, :attr:`TokenizeSpec.drop_long`), axolotl's ``"truncate"`` / ``"raise"`` (the start kept; a run that
            raised had no longer row), or the trainer's other rule (then listed in ``unreproduced``, unless the
            trainer's own rule, ``chat_rule``, applies it), or ``"none"``.
        loss_on: the supervised tokens (:class:`~gradian.data.tokenize.TokenizeSpec` ``loss_on``).
        add_eos: EOS appended to plain completions and text rows.
        chat_template: the Jinja template the run trained with (saved beside the adapter, or from the config), which
            renders every lane's chat rows; a template *name* Gradian cannot render is kept here and listed in
            ``unreproduced``; None: the tokenizer's own.
        packing: the trainer packed rows into shared sequences.
        train_roles, train_on_eos: axolotl's chat mask (:attr:`TokenizeSpec.train_roles`); None: ``loss_on`` decides.
        chat_rule, eos_truncate: the trainer's own rendering (:attr:`TokenizeSpec.chat_rule`): torchtune's, named
            from the recipe's ``tokenizer._component_``, LLaMA-Factory's from its ``template:``, axolotl's from
            ``datasets[0].type``; None: the chat template renders chat rows.
        default_system: a LLaMA-Factory config's ``default_system`` (:attr:`TokenizeSpec.default_system`).
        base_quant, base_quant_from: a QLoRA run's 4-bit scheme (``nf4``, ``nf4-dq``, ``fp4``, ``fp4-dq``) and the
            dtype its base was loaded in before quantising (None: as stored): the base is loaded as trained
            (:attr:`gradian.models.spec.ModelSpec.quantize`); None: the base as stored.
        unreproduced: settings of the run that Gradian does not reproduce (e.g. ``"packing"``).
        sources: ``{field: where its value came from}``.
        warnings: one line per flag that contradicts the config (both named).
        notes: why each unreproduced entry is there.
    """

    trainer: str | None
    max_length: int | None
    truncation: str
    loss_on: str
    add_eos: bool
    chat_template: str | None = None
    packing: bool = False
    train_roles: tuple[str, ...] | None = None
    train_on_eos: str = "turn"
    chat_rule: str | None = None
    eos_truncate: bool = False
    default_system: str | None = None
    base_quant: str | None = None
    base_quant_from: str | None = None
    unreproduced: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def tokenize_spec(self) -> TokenizeSpec:
        """The :class:`TokenizeSpec` every lane tokenises with (no truncation: the longest length Gradian takes)."""
        from gradian.validate import LENGTH_MAX

        return TokenizeSpec(
            max_length=self.max_length if self.max_length is not None else LENGTH_MAX,
            loss_on=self.loss_on,  # type: ignore[arg-type]
            add_eos=self.add_eos,
            chat_template=self.chat_template if "chat_template" not in self.unreproduced else None,
            train_roles=self.train_roles,
            train_on_eos=self.train_on_eos,  # type: ignore[arg-type]
            chat_rule=self.chat_rule,
            eos_truncate=self.eos_truncate,
            drop_long=self.truncation == "drop" and "truncation" not in self.unreproduced,
            default_system=self.default_system,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON view: ``{"values": {name: {"value", "from"}}, "unreproduced", "warnings", "notes"}``."""
        names = ("trainer", "max_length", "truncation", "loss_on", "add_eos", "chat_template", "packing")
        if self.train_roles is not None:
            names += ("train_roles", "train_on_eos")
        if self.chat_rule is not None:
            names += ("chat_rule", "eos_truncate")
        if self.default_system is not None:
            names += ("default_system",)
        if self.base_quant is not None:
            names += ("base_quant", "base_quant_from")
        return {
            "values": {n: {"value": getattr(self, n), "from": self.sources.get(n)} for n in names},
            "unreproduced": list(self.unreproduced),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }

    def lines(self) -> list[str]:
        """Human lines: ``name = value  (source)`` per field, then what is not reproduced."""
        out = [f"{n} = {v['value']!r}  ({v['from']})" for n, v in self.to_dict()["values"].items()]
        out += [f"not reproduced: {n}" for n in self.notes]
        return out


def examples_format(examples) -> tuple[str, bool]:
    """``(the most common row format, any row is a chat)`` of loaded examples (``prompt_completion`` if none)."""
    from collections import Counter

    fmt = Counter(ex.format for ex in examples).most_common(1)[0][0] if examples else "prompt_completion"
    return fmt, any(ex.is_chat for ex in examples)


def row_format(path: str | Path) -> tuple[str, bool]:
    """:func:`examples_format` of a training file (:func:`load_examples`)."""
    from gradian.data.formats import load_examples

    return examples_format(load_examples(path))


def card_config(card) -> TrainConfig | None:
    """The config a run without one is read with when its trainer's model card names the trainer
    (:class:`gradian.audit.config.runfolder.TrainerCard`): TRL's ``SFTConfig`` defaults for an ``SFTTrainer`` card,
    LLaMA-Factory's for a LLaMA-Factory card (its stage unsaid: SFT assumed), the trainer named from the card.

    For the setup only (Audit is not given it: its checks would judge defaults the run may not have used). None for
    a TRL trainer other than SFT (a preference run's data is refused by Attribute anyway).
    """
    from gradian.audit.config import TrainConfig, apply_defaults

    if card is None or not card.sft:
        return None
    cfg = TrainConfig()
    cfg.set("trainer", card.trainer, f"{card.says()}; no training config of the run reads")
    cfg.formats.append(card.trainer)
    if card.version:
        cfg.versions[card.trainer] = card.version
        cfg.version_sources[card.trainer] = str(card.path)
    apply_defaults(cfg)
    return cfg


def setup_from_files(
    config_paths: list[str | Path] | tuple,
    data: str | Path,
    flags: Mapping[str, Any] | None = None,
    *,
    adapter: str | Path | None = None,
    examples=None,
    card=None,
) -> TrainingSetup:
    """:func:`resolve_setup` for ``gradian attribute [--config ...] --data ... --adapter ...``: the merged config
    (none: the defaults of the trainer whose model card ``card`` is beside the adapter (:func:`card_config`), else
    Gradian's defaults), the rows' format and the template saved beside the adapter.

    Args:
        examples: the rows already loaded from ``data`` (:func:`load_examples`), so the file is read once.

    Raises:
        GradianUserError: an unreadable config or data file (named).
    """
    from gradian.audit.config import load_config

    fmt, chat = examples_format(examples) if examples is not None else row_format(data)
    config = load_config(list(config_paths)) if config_paths else card_config(card)
    setup = resolve_setup(config, fmt, chat=chat, flags=flags, saved_template=adapter_template(adapter))
    return with_card_quant(setup, adapter)


def _config_readers(paths: Sequence[str]) -> list[Reader]:
    """A :class:`~gradian.audit.config.Reader` over each YAML / JSON config file of the run, in order: the keys the
    config model does not keep (LLaMA-Factory's ``mask_history``, a torchtune recipe's components) are read from
    them.
    """
    from gradian.audit.config import Reader, read_mapping

    out = []
    for p in paths:
        path = Path(p)
        if path.is_file() and path.suffix.lower() in (".yaml", ".yml", ".json"):
            out.append(Reader(read_mapping(path)[0], str(path)))
    return out


def _lf_key(readers: Sequence[Reader], key: str, kind: str = "bool") -> tuple[Any, str | None]:
    """``(value, where)`` of a LLaMA-Factory key the config model does not keep (``mask_history``,
    ``default_system``); ``(None, None)`` when no file sets it.
    """
    for r in readers:
        if r.has(key):
            return (r.bool_(key) if kind == "bool" else r.get(key)), r.where(key)
    return None, None


def _lf_rule(
    cfg: TrainConfig, data_format: str, readers: Sequence[Reader]
) -> tuple[str | None, str, list[str], str | None]:
    """``(rule, source, notes, template note)`` of a LLaMA-Factory run's own rendering
    (:mod:`gradian.data.llamafactory_rules`), read from its ``template:``; rule None: not a row LLaMA-Factory renders
    (plain prompt/completion or text) or a template Gradian does not reproduce (the template note says so). Settings
    the rule does not take are in ``notes``, so the mask is stated as not reproduced.
    """
    from gradian.data.llamafactory_rules import TEMPLATES, VERSION, rule_for_template

    if data_format not in CHAT_FORMATS + ("alpaca",):
        return None, "", [], None
    name = cfg.chat_template
    where = cfg.source("chat_template") or "LLaMA-Factory config: template"
    if not name and not cfg.paths:  # LLaMA-Factory's defaults, from its model card: the template is not recorded
        return (
            None,
            where,
            [],
            "chat_template: LLaMA-Factory renders rows with the template: of its config (its own slots and default "
            "system prompt), which this run folder does not record; Gradian renders them with the chat template "
            "saved beside the adapter (pass the config with --config)",
        )
    if not name:  # get_template_and_fix_tokenizer parses the tokenizer's own chat template (parse_template)
        return None, where, [], None
    rule = rule_for_template(name)
    if rule is None:
        return (
            None,
            where,
            [],
            f"chat_template: LLaMA-Factory renders rows with its own registered template {name!r} ({where}: its "
            "slots, each encoded on its own, and its default system prompt), not the tokenizer's Jinja; Gradian "
            f"reproduces {', '.join(TEMPLATES)} and renders this one with the tokenizer's chat template",
        )
    notes = []
    mh, mh_where = _lf_key(readers, "mask_history")
    if mh and cfg.train_on_inputs:
        notes.append(
            f"{mh_where} with train_on_prompt: LLaMA-Factory trains every prompt and the last answer only; Gradian's "
            "rule trains one or the other"
        )
    return rule, f"{where} ({VERSION} data/template.py, processor/supervised.py)", notes, None


def _torchtune_chat(readers: Sequence[Reader]) -> tuple[str | None, str, list[str]]:
    """``(rule, source, notes)`` of a torchtune recipe's chat rendering, read from its ``tokenizer._component_``
    (:data:`gradian.data.torchtune_rules.COMPONENTS`); rule None: a family Gradian does not implement (noted).

    Settings that change torchtune's rendering and that the rule does not take (a ``tokenizer.prompt_template``, a
    ``dataset.new_system_prompt``, another ``eos_token``) are noted, so the mask is stated as not reproduced.
    """
    from gradian.data.torchtune_rules import SOURCES, rule_for_component

    comp, where, notes = None, "torchtune config", []
    for r in readers:
        if r.has("tokenizer._component_"):
            comp, where = r.get("tokenizer._component_"), r.where("tokenizer._component_")
            for key in ("tokenizer.prompt_template", "tokenizer.eos_token"):
                if r.get(key) is not None:
                    notes.append(
                        f"{r.where(key)}: torchtune renders with it; Gradian's torchtune rule does not read it"
                    )
        ds = r.get("dataset")
        for d in ds if isinstance(ds, list) else [ds]:
            if isinstance(d, dict) and d.get("new_system_prompt") is not None:
                notes.append(f"{r.path}: dataset.new_system_prompt replaces the rows' system turn; Gradian does not")
    rule = rule_for_component(comp)
    if rule is None:
        notes.append(
            f"torchtune renders messages with its own model tokenizer ({comp or 'no tokenizer._component_'}), "
            "not a chat template: an assistant message's header is trained with it and the last one ends in EOS "
            "instead of its end-of-turn; Gradian reproduces the qwen2 / qwen2_5 / llama3 tokenizers only and renders "
            "this one with the chat template"
        )
        return None, where, notes
    return rule, f"{where} ({SOURCES[rule]})", notes


def _axolotl_instruction_rule(cfg: TrainConfig) -> tuple[str | None, str, list[str]]:
    """``(rule, source, notes)`` for instruction (alpaca) rows of an axolotl run, from its first dataset's ``type``
    (:mod:`gradian.data.axolotl_rules`); rule None: a type Gradian does not reproduce (noted).
    """
    from gradian.data.axolotl_rules import TYPES, VERSION

    ds = list(cfg.datasets or [])
    first = ds[0] if ds else {}
    kind = first.get("type") or ("a custom mapping" if first.get("type_mapping") else None)
    where = f"datasets[{first['index']}].type" if ds else "axolotl config"
    rule = TYPES.get(kind) if isinstance(kind, str) else None
    if rule is None:
        return (
            None,
            where,
            [
                f"axolotl renders instruction rows with its prompt strategy ({where}: {kind!r}), its own prompt text "
                f"around them; Gradian reproduces type {', '.join(TYPES)} and renders this one as instruction + output"
            ],
        )
    notes = []
    if any((d.get("type") or None) != kind for d in ds[1:]):
        notes.append(f"axolotl datasets of other types than {where}'s; Gradian renders every row as {where}")
    return rule, f"{where}: {kind} ({VERSION} prompters.py AlpacaPrompter, prompt_tokenizers.py)", notes


def _torchtune_alpaca(readers: Sequence[Reader]) -> bool:
    """The recipe's dataset is torchtune's ``alpaca_dataset`` / ``alpaca_cleaned_dataset`` (its
    ``data/_messages.py`` ``AlpacaToMessages``: the Alpaca prompt as the user message, the output as the assistant's),
    with no ``column_map``.
    """
    for r in readers:
        ds = r.get("dataset")
        for d in ds if isinstance(ds, list) else [ds]:
            comp = str(d.get("_component_") or "") if isinstance(d, dict) else ""
            if comp.rsplit(".", 1)[-1] in ("alpaca_dataset", "alpaca_cleaned_dataset") and not d.get("column_map"):
                return True
    return False


def _held_out_note(cfg: TrainConfig, trainer: str | None) -> str | None:
    """A note when the trainer held some of the training rows out for evaluation, or None.

    axolotl 0.19.0 (``utils/data/shared.py`` ``create_train_validation_split``: ``train_test_split(test_size=
    val_set_size, shuffle=False)`` of the dataset as it prepared it) and LLaMA-Factory 0.9.5
    (``data/data_utils.py`` ``split_dataset``: ``train_test_split(test_size=val_size, seed=seed)``) train on the
    rest only: a fraction (below 1) or a count of rows, chosen after their own loading, filtering and shuffling,
    which Gradian does not replay. So every row of ``--data`` is scored, the held-out ones too.
    """
    size = cfg.val_set_size
    if trainer not in ("axolotl", "llamafactory") or not size or size <= 0:
        return None
    what = f"{size:g} of the rows" if size < 1 else f"{int(size)} rows"
    return (
        f"held-out rows ({cfg.source('val_set_size') or 'config'}): {trainer} held out {what} for evaluation and "
        "trained on the rest; Gradian scores every row of --data, the held-out ones too (they cannot have harmed "
        "the run: pass --data without them to leave them out)"
    )


def _axolotl_mask(cfg: TrainConfig) -> tuple[tuple[str, ...], str, str, list[str]]:
    """``(train_roles, train_on_eos, source, notes)`` of an axolotl run's chat mask (axolotl 0.19.0
    ``prompt_strategies/chat_template.py`` ``load``: ``roles_to_train`` defaults to ``["assistant"]``,
    ``train_on_eos`` to ``"turn"``; ``train_on_inputs: true`` trains every turn). Settings that differ between
    datasets: the first dataset's, and a note.
    """
    ds = list(cfg.datasets or [])
    first = ds[0] if ds else {}
    roles = tuple(first.get("roles_to_train") or ("assistant",))
    eos = first.get("train_on_eos") or "turn"
    where = f"datasets[{first['index']}]" if ds else "default"
    notes = []
    for d in ds[1:]:
        if tuple(d.get("roles_to_train") or ("assistant",)) != roles or (d.get("train_on_eos") or "turn") != eos:
            notes.append(
                f"axolotl datasets[{d['index']}] trains other roles or EOS than datasets[0]; Gradian uses datasets[0]'s"
            )
    if cfg.train_on_inputs:
        roles = ("*",)
    src = (
        f"axolotl 0.19.0 rule: the content of roles {list(roles)} and EOS train_on_eos={eos!r} "
        f"({where}{', train_on_inputs' if cfg.train_on_inputs else ''})"
    )
    return roles, eos, src, notes


def _loss_rule(cfg: TrainConfig, data_format: str, chat: bool, readers: Sequence[Reader]) -> tuple[str, str, list[str]]:
    """``(loss_on, source, notes of what is not reproduced)`` for the config's trainer and the rows' format."""
    src = cfg.source
    t = cfg.trainer
    notes: list[str] = []
    if data_format == "text":
        return "all", f"{t} rule: a text row trains on every token", notes
    if t == "trl" and "gradian" in cfg.formats:
        if cfg.completion_only_loss is False:
            return "all", src("completion_only_loss") or "?", notes
        if data_format == "messages":
            return "completion", src("messages_loss") or "gradian train: final assistant turn", notes
        return "completion", src("completion_only_loss") or "gradian train default", notes
    if t == "trl":
        if cfg.assistant_only_loss and chat:
            if data_format != "messages" and cfg.completion_only_loss is not False:
                notes.append(
                    "assistant_only_loss with prompt/completion chat rows: TRL keeps the assistant tokens inside the "
                    "completion only; Gradian supervises every assistant span"
                )
            return "assistant", src("assistant_only_loss") or "?", notes
        if data_format == "messages":
            return (
                "all",
                "TRL 1.16 rule: a 'messages' row has no completion mask, so SFTTrainer trains every token"
                + (f" ({src('completion_only_loss')} does not apply)" if cfg.completion_only_loss else ""),
                notes,
            )
        if cfg.completion_only_loss is False:
            return "all", src("completion_only_loss") or "?", notes
        return (
            "completion",
            src("completion_only_loss") or "TRL 1.16 rule: completion_only_loss unset -> on for prompt/completion rows",
            notes,
        )
    if cfg.train_on_inputs:
        return "all", src("train_on_inputs") or "?", notes
    if t == "axolotl":
        if chat:
            return "assistant", "axolotl rule: roles_to_train defaults to [assistant] (every assistant turn)", notes
        return "completion", src("train_on_inputs") or "default (axolotl)", notes
    if t == "llamafactory":
        if chat:
            mh, where = _lf_key(readers, "mask_history")
            if mh:
                return "completion", f"{where} (the last assistant turn only)", notes
            return (
                "assistant",
                (where or "default (LLaMA-Factory: mask_history false)") + " (every assistant turn)",
                notes,
            )
        return "completion", src("train_on_inputs") or "default (LLaMA-Factory)", notes
    if t == "torchtune":
        if chat:
            return "assistant", f"{src('train_on_inputs') or 'default (torchtune)'} (every assistant message)", notes
        return "completion", src("train_on_inputs") or "default (torchtune)", notes
    return "completion", f"Gradian default (trainer {t!r}: no rule known)", notes


def adapter_template(adapter: str | Path | None) -> tuple[str, str] | None:
    """``(text, where)`` of the chat template a run saved beside its adapter, or None.

    The adapter folder's ``chat_template.jinja`` (transformers >= 4.54), else its ``tokenizer_config.json``
    ``chat_template`` string (what TRL, axolotl and LLaMA-Factory save with the tokenizer they trained with);
    a run folder that holds only ``checkpoint-N/`` folders: the last checkpoint's.
    """
    from gradian.data.templates import saved_template

    if adapter is None or not Path(adapter).is_dir():
        return None
    folder = Path(adapter)
    found = saved_template(folder)
    if found is None and not (folder / "adapter_config.json").is_file():
        ckpts = [p for p in folder.glob("checkpoint-*") if p.is_dir() and p.name.split("-", 1)[1].isdigit()]
        if ckpts:
            found = saved_template(max(ckpts, key=lambda p: int(p.name.split("-", 1)[1])))
    return found


#: the block PEFT's model card writes for an adapter trained on a bitsandbytes base
#: (``PeftModel.create_or_update_model_card``; Hub adapters saved with older PEFT carry it, while PEFT 0.21.2 left
#: it out in a run here): a line per ``BitsAndBytesConfig`` field, ``- load_in_4bit: True``
_CARD_QUANT = "The following `bitsandbytes` quantization config was used during training:"


def card_quant(adapter: str | Path | None) -> tuple[str, str] | None:
    """``(scheme, where)`` of a 4-bit base named by the adapter's model card (``README.md``: :data:`_CARD_QUANT` and
    its ``- name: value`` lines), or None (no card, no such block, or not 4-bit).
    """
    from gradian.errors import GradianUserError
    from gradian.safeio import read_text

    card = Path(adapter) / "README.md" if adapter is not None else None
    if card is None or not card.is_file():
        return None
    try:
        lines = read_text(card, "model card").splitlines()
    except GradianUserError:
        return None
    if _CARD_QUANT not in lines:
        return None
    fields: dict[str, str] = {}
    for line in lines[lines.index(_CARD_QUANT) + 1 :]:
        name, sep, value = line.strip().removeprefix("- ").partition(": ")
        if not line.strip().startswith("- ") or not sep:
            break
        fields[name.strip()] = value.strip()
    if fields.get("load_in_4bit") != "True" or fields.get("quant_method", "bitsandbytes") != "bitsandbytes":
        return None
    kind = fields.get("bnb_4bit_quant_type", "fp4")  # BitsAndBytesConfig's own default
    if kind not in ("nf4", "fp4"):
        return None
    scheme = kind + ("-dq" if fields.get("bnb_4bit_use_double_quant") == "True" else "")
    return scheme, f"{card}: PEFT's bitsandbytes block (load_in_4bit, bnb_4bit_quant_type {kind})"


def with_card_quant(setup: TrainingSetup, adapter: str | Path | None) -> TrainingSetup:
    """``setup`` with the 4-bit base its adapter's model card names (:func:`card_quant`), when no config said."""
    import dataclasses

    if setup.base_quant is not None or "base_quant" in setup.unreproduced:
        return setup
    found = card_quant(adapter)
    if found is None:
        return setup
    sources = {**setup.sources, "base_quant": found[1], "base_quant_from": "the base's stored dtype"}
    return dataclasses.replace(setup, base_quant=found[0], base_quant_from=None, sources=sources)


def trained_quant(
    setup: TrainingSetup | None, adapter: str | Path | None = None, config_paths: Sequence[str | Path] = ()
) -> tuple[str, str | None, str] | None:
    """``(scheme, load dtype, source)`` of the 4-bit base a QLoRA run trained on, or None when it did not: from a
    resolved ``setup``; without one, from the run's ``config_paths`` (as :func:`setup_from_files` reads them, without
    the rows: ``gradian evaluate``) or else the adapter's model card (:func:`card_quant`).
    """
    if setup is not None:
        if not setup.base_quant:
            return None
        return setup.base_quant, setup.base_quant_from, setup.sources.get("base_quant", "")
    if config_paths:
        from gradian.audit.config import load_config

        quant, frm, src, _ = _base_quant(load_config(list(config_paths)))
        if quant:
            return quant, frm, src
    found = card_quant(adapter)
    return (found[0], None, found[1]) if found else None


def _base_quant(c: TrainConfig) -> tuple[str | None, str | None, str, str | None]:
    """A QLoRA run's base as its trainer quantised it: ``(scheme, load dtype, source, None)``, or ``(None, None, "",
    note)`` when it trained on a quantised base Gradian does not reproduce, or all None when it did not.

    bitsandbytes 4-bit (``BitsAndBytesConfig``) as TRL (``load_in_4bit``, ModelConfig ``bnb_4bit_quant_type`` nf4,
    ``use_bnb_nested_quant`` false), axolotl 0.19.0 (``adapter: qlora`` + ``load_in_4bit``: nf4 with double
    quantisation, ``bnb_config_kwargs`` over them) and LLaMA-Factory 0.9.5 (``quantization_bit: 4``:
    ``quantization_type`` nf4, ``double_quantization`` true) set it up; the last two load the base in bf16 / fp16 as
    their ``bf16`` / ``fp16`` say (neither: the stored dtype is taken; axolotl then picks by the hardware, 16-bit on
    the test machine). tests/data/test_frameworks_real.py holds this to both trainers' own model loaders. 8-bit
    bases, torchtune's QLoRA (torchao's own NF4) and LLaMA-Factory's other ``quantization_method`` values are listed
    as not reproduced.
    """
    if c.load_in_8bit:
        return (
            None,
            None,
            "",
            f"base_quant: the run trained on an 8-bit base ({c.source('load_in_8bit')}); "
            "Gradian uses the base as stored",
        )
    if not c.load_in_4bit and not (c.trainer == "torchtune" and c.finetuning == "qlora"):
        return None, None, "", None
    where = c.source("load_in_4bit") or c.source("finetuning")
    if c.trainer not in ("trl", "axolotl", "llamafactory") or (c.quant_method or "bnb").lower() not in (
        "bnb",
        "bitsandbytes",
    ):
        how = (
            "torchao's NF4"
            if c.trainer == "torchtune"
            else f"{c.trainer or 'its trainer'}'s {c.quant_method or '4-bit'} quantisation"
        )
        return (
            None,
            None,
            "",
            f"base_quant: the run trained on a 4-bit base ({where}, {how}); Gradian uses the base as stored",
        )
    kind = (c.quant_type or "nf4").lower()
    if kind not in ("nf4", "fp4"):
        return (
            None,
            None,
            "",
            f"base_quant: 4-bit type {kind!r} ({c.source('quant_type')}) is not reproduced; the base as stored is used",
        )
    scheme = kind + ("-dq" if c.double_quant else "")
    if c.trainer == "trl":
        load = (c.load_dtype or "").lower().replace("torch.", "")
        load = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(load, load)
        frm = load if load in ("bfloat16", "float16", "float32") else None  # "auto" / unset: the stored dtype
    else:  # axolotl's torch_dtype and LLaMA-Factory's compute dtype follow bf16 / fp16; neither said: the trainer
        # picks by the hardware (axolotl) or leaves transformers its default, the stored dtype (LLaMA-Factory)
        frm = "bfloat16" if c.bf16 else "float16" if c.fp16 else None
    src = f"{where}; {c.source('quant_type')}; double quantisation {c.source('double_quant')}"
    return scheme, frm, src, None


def _listed(source: str, why: str) -> tuple[bool, str]:
    """:func:`_packing`'s answer for a packing Gradian does not reproduce: ``(False, note)``."""
    return False, f"packing ({source}): {why}; Gradian scores each row alone"


def _first_label(setting: str, how: str) -> str:
    """Why a packing whose rows start with a label is not reproduced: the row packed before predicts that label."""
    return (
        f"each row's first token is a label ({setting}) and {how}, so the row packed before it is also trained to "
        "predict it"
    )


#: what a packed run's dropped last batch means for the scores (axolotl's multipack sampler, torchtune's DataLoader)
_DROPPED = "which rows, its shuffle decides, and Gradian scores them all"


def _axolotl_packing(c: TrainConfig, source: str) -> tuple[str | None, tuple[str, str], str]:
    """:func:`_packing` for axolotl's ``sample_packing`` (0.19.0: its multipack sampler, its
    ``V2BatchSamplerDataCollatorForSeq2Seq`` and HF Trainer's loss over the packed labels).

    tests/data/test_framework_packing.py runs axolotl's own trainer on CPU: with sdpa or eager each packed batch's
    gradient is ``Σ_r n_r g_r / Σ_r n_r`` over Gradian's rows (to 1e-6), with no ``attn_implementation`` it is not,
    and where a row's first token is a label (``train_on_inputs``, text rows) the row packed before it predicts it
    (axolotl does not mask a row's first label), a term of that neighbour's that Gradian cannot know.
    """
    from gradian.audit.config.axolotl import PACKING_APART
    from gradian.libversions import before

    impl = (c.attn_implementation or "").lower().split("@", 1)[0]
    where = c.source("attn_implementation") or "not said"
    if not impl:
        why = (
            "no attn_implementation: axolotl keeps the packed attention mask, so rows attend to the rows packed "
            "before them (axolotl warns so itself)"
        )
    elif not impl.startswith(PACKING_APART):
        why = f"attention {impl!r} ({where}): axolotl does not keep packed rows apart with it"
    elif before(c.versions, "axolotl", "0.19"):
        why = f"axolotl {c.versions['axolotl']} with attention {impl!r}: only axolotl 0.19's packing was run"
    else:
        why = None
    kept = (
        f"sample_packing ({source}; attention {impl} from {where}): axolotl 0.19 drops the packed attention "
        "mask and restarts position_ids at each row, so a row attends within itself and its gradient is its "
        "own term of the packed loss, as Gradian scores it (axolotl's multipack sampler also drops the last "
        f"incomplete batch of packs in each epoch; {_DROPPED})"
    )
    return why, ("train_on_inputs, or text rows", "axolotl does not mask it at a row's start"), kept


def _llamafactory_packing(c: TrainConfig, source: str) -> tuple[str | None, tuple[str, str], str]:
    """:func:`_packing` for LLaMA-Factory 0.9.5 (``data/processor/supervised.py`` packs whole rows, ``position_ids``
    restarting at each; ``data/collator.py`` ``SFTDataCollatorWith4DAttentionMask``).

    tests/data/test_framework_packing.py runs its trainer: with ``neat_packing`` each packed batch's gradient is
    ``Σ_r n_r g_r / Σ_r n_r`` over Gradian's rows (to 1e-6; sdpa and eager get a block-diagonal 4D mask, flash
    attention 2 its varlen path), plain ``packing`` keeps the mask all ones (rows attend across), and with
    ``train_on_prompt`` a row's first token is a label the row packed before it predicts.
    """
    impl = (c.attn_implementation or "").lower()
    if (c.packing_strategy or "").lower() != "neat":
        why = "without neat_packing, LLaMA-Factory lets packed rows attend to each other"
    elif impl and impl not in ("sdpa", "eager", "flash_attention_2", "auto"):
        why = f"attention {impl!r} ({c.source('attn_implementation')}) with neat_packing was not run"
    else:
        why = None
    kept = (
        f"neat_packing ({source}): LLaMA-Factory packs whole rows with position_ids restarting and attention "
        "kept within each row, so a row's gradient is its own term of the packed loss, as Gradian scores it"
    )
    return why, ("train_on_prompt", "LLaMA-Factory does not mask it at a row's start"), kept


def _torchtune_packing(c: TrainConfig, source: str) -> tuple[str | None, tuple[str, str], str]:
    """:func:`_packing` for torchtune's ``packed: true`` (0.6.1: ``datasets/_packed.py`` ``PackedDataset`` packs
    whole rows greedily, ``input_pos`` restarting at each; ``padded_collate_packed`` gives a block-causal mask, a
    flex-attention ``BlockMask`` on CUDA; its LoRA recipes' loss is the cross-entropy over the shifted packed labels,
    normalised by the step's supervised tokens).

    tests/data/test_framework_packing.py runs its ``lora_finetune_single_device`` recipe: each step's gradient is
    ``Σ_r n_r g_r / Σ_r n_r`` over Gradian's rows where a row's first token is never a label (the Llama-3 tokenizer's
    BOS is always masked; a Qwen2 row's first token is its first message's, masked unless ``train_on_input``); where
    it is a label, the last token of the row packed before it is trained to predict it.
    """
    from gradian.libversions import before

    why = (
        f"torchtune {c.versions['torchtune']}: only torchtune 0.6's packing was run"
        if before(c.versions, "torchtune", "0.6")
        else None
    )
    kept = (
        f"packed ({source}): torchtune packs whole rows with input_pos restarting and a block-causal mask, so a "
        "row attends within itself and its gradient is its own term of the packed loss, as Gradian scores it "
        f"(its DataLoader also drops the last incomplete batch of packs in each epoch; {_DROPPED})"
    )
    return why, ("train_on_input, or text rows", "torchtune shifts the labels across the packed sequence"), kept


def _packing(c: TrainConfig, source: str, first_trained: bool = False) -> tuple[bool, str]:
    """Whether a packed run trained each row on its own (so Gradian's row-alone gradient is its term of the
    packed loss), and the note that says so or why not.

    TRL >= 0.20's ``packing_strategy="bfd"`` (1.16's default) keeps each row whole (a row over ``max_length`` cut at
    it, as Gradian cuts it) and trains padding-free: ``position_ids`` restart at each row, the label at a row's
    first token is masked, and the model (called with ``use_cache=False``) masks attention within each row, for
    flash attention's varlen kernels and transformers' sdpa / eager alike. tests/data/test_trl_packing.py holds
    the gradient of TRL 1.16's ``compute_loss`` on its packed batches (transformers 5.24, sdpa) equal to
    ``Σ_r n_r g_r / Σ_r n_r`` over Gradian's rows. ``bfd_split`` trains a long row's overflow as a row of its own,
    ``wrapped`` cuts rows across sequences: those stay unreproduced. axolotl's, LLaMA-Factory's and torchtune's:
    :func:`_axolotl_packing`, :func:`_llamafactory_packing`, :func:`_torchtune_packing` each give why their packing
    lets rows attend across (None where it keeps them apart), the note when it does keep them apart, and the
    setting behind a row's first label; none of the three masks that label, so where ``first_trained`` (a row's
    first token is a label) the row packed before it is trained to predict it, and the packing is listed.
    """
    from gradian.libversions import before

    own = {"axolotl": _axolotl_packing, "llamafactory": _llamafactory_packing, "torchtune": _torchtune_packing}
    if c.trainer in own:  # (why not apart, or None; where a row's first label comes from; the note when apart)
        why, first, kept = own[c.trainer](c, source)
        if why is None and first_trained:
            why = _first_label(*first)
        return _listed(source, why) if why else (True, kept)

    strategy = (c.packing_strategy or "").lower()
    where = c.source("packing_strategy") or "not said"
    # TRL before 0.20 dropped the completion masks of packed rows (Audit's C11); unknown: TRL 1.16's rules
    old_trl = bool(before(c.versions, "trl", "0.20"))
    if c.trainer == "trl" and strategy == "bfd" and not old_trl:
        return True, (
            f"packing bfd ({source}; packing_strategy from {where}): TRL keeps each row whole and apart in its packed "
            "sequences (position_ids restart, attention within the row), so a row's gradient is its own term of "
            "the packed loss, as Gradian scores it"
        )
    why = {
        "bfd_split": "a row longer than max_length has its overflow trained as a row of its own",
        "wrapped": "rows are cut across sequence boundaries",
    }.get(strategy, "rows shared sequences in training")
    return _listed(f"{source}, {strategy}" if strategy else source, why)


def _training_template(c: TrainConfig, saved: tuple[str, str] | None) -> tuple[str | None, str, str | None]:
    """``(template text or name, source, note when Gradian cannot render with it)`` of a config's run.

    In order (as Audit's ``training_template``): the template saved beside the adapter; a literal Jinja
    ``chat_template`` in the config (TRL's reader puts a ``.jinja`` ``chat_template_path``'s text there; axolotl's
    ``chat_template_jinja``); the config's ``.jinja`` ``chat_template_path`` read beside the config; else a template
    *name* (axolotl ``chat_template: chatml``, LLaMA-Factory ``template: qwen``, a TRL ``chat_template_path`` that is
    a tokenizer id), which Gradian cannot render and lists as not reproduced; else the tokenizer's own.
    """
    from gradian.data.templates import read_template

    if saved is not None:
        return saved[0], saved[1], None
    if c.chat_template and ("{%" in c.chat_template or "{{" in c.chat_template):
        return c.chat_template, c.source("chat_template") or "config: chat_template", None
    ctp = c.chat_template_path
    if ctp and ctp.endswith((".jinja", ".j2")):
        for cand in [Path(ctp)] + [Path(x).parent / ctp for x in c.paths]:
            if cand.is_file():
                return read_template(cand), f"{c.source('chat_template_path')} ({cand})", None
    name = c.chat_template or ctp
    src = c.source("chat_template") or c.source("chat_template_path") or "the tokenizer's own chat template"
    if name and name != "tokenizer_default":
        return (
            name,
            src,
            f"chat_template: the config names {name!r} ({src}), not a Jinja template Gradian can read; Gradian renders "
            "chat rows with the tokenizer's chat template (pass the adapter folder the run saved its tokenizer in, "
            "or a config whose chat_template_path is the .jinja file)",
        )
    return None, src, None


def resolve_setup(
    config: TrainConfig | None,
    data_format: str = "prompt_completion",
    *,
    chat: bool | None = None,
    flags: Mapping[str, Any] | None = None,
    saved_template: tuple[str, str] | None = None,
) -> TrainingSetup:
    """The run's training setup from its config, its rows' format and the explicit flags.

    Args:
        config: the merged config (:func:`gradian.audit.config.load_config`), or None (today's defaults:
            ``TokenizeSpec()``).
        data_format: the training rows' format (:data:`gradian.data.formats.FORMATS`; the most common one).
        chat: the rows are chat conversations (default: ``data_format == "messages"``).
        flags: the flags the user gave explicitly, by field (``{"max_length": 512}``); each beats the config and
            is named as the source, and a flag that contradicts an explicit config value adds one warning line.
        saved_template: ``(text, where)`` of the chat template the run saved beside its adapter
            (:func:`adapter_template`); it beats the config's (it is what the trainer's tokenizer held).

    Returns:
        the :class:`TrainingSetup`.
    """
    flags = dict(flags or {})
    chat = data_format in CHAT_FORMATS if chat is None else chat
    d = TokenizeSpec()
    sources: dict[str, str] = {}
    notes: list[str] = []
    unrep: list[str] = []
    if config is None:
        values: dict[str, Any] = {
            "trainer": None,
            "max_length": d.max_length,
            "truncation": "keep_start",
            "loss_on": d.loss_on,
            "add_eos": d.add_eos,
            "chat_template": saved_template[0] if saved_template else None,
            "packing": False,
        }
        sources = {k: _NO_CONFIG for k in values}
        sources["chat_template"] = saved_template[1] if saved_template else "the tokenizer's own chat template"
        cfg_explicit: dict[str, str] = {}
    else:
        c = config
        name = "gradian" if "gradian" in c.formats else c.trainer
        values = {"trainer": name}
        sources["trainer"] = c.source("trainer") or (", ".join(c.paths) or "config")
        if c.truncation == "none" or c.max_length is None:
            values["max_length"], values["truncation"] = None, "none"
            sources["max_length"] = c.source("truncation") or c.source("max_length") or "config: no max_length"
        else:
            values["max_length"] = c.max_length
            sources["max_length"] = c.source("max_length") or "?"
            values["truncation"] = c.truncation or "keep_start"
        sources["truncation"] = c.source("truncation") or sources["max_length"]
        tr = values["truncation"]
        readers = _config_readers(c.paths)  # each config file read once, for the keys the config model does not keep
        tt_alpaca = name == "torchtune" and data_format == "alpaca" and _torchtune_alpaca(readers)
        tt_rule, tt_src, tt_notes = (
            _torchtune_chat(readers) if ((chat or tt_alpaca) and name == "torchtune") else (None, "", [])
        )
        lf_rule, lf_src, lf_notes, lf_tnote = (
            _lf_rule(c, data_format, readers) if name == "llamafactory" else (None, "", [], None)
        )
        values["chat_rule"], values["eos_truncate"] = tt_rule, bool(tt_rule and values["max_length"] is not None)
        ax_rule, ax_src, ax_notes = (
            _axolotl_instruction_rule(c) if (name == "axolotl" and data_format == "alpaca") else (None, "", [])
        )
        if lf_rule or ax_rule:
            values["chat_rule"], sources["chat_rule"] = lf_rule or ax_rule, lf_src or ax_src
        if lf_rule:  # written where a row has no system turn, in place of the template's
            ds, ds_where = _lf_key(readers, "default_system", "str")
            if ds is not None:
                values["default_system"], sources["default_system"] = str(ds), str(ds_where)
        if tt_rule:
            sources["chat_rule"] = tt_src
            sources["eos_truncate"] = (
                f"{sources['max_length']} (torchtune 0.6.1 data/_utils.py truncate: EOS over the last kept token)"
                if values["eos_truncate"]
                else sources["max_length"]
            )
        axolotl_cut = name == "axolotl" and tr in ("drop", "truncate", "raise")  # utils/data/utils.py, 0.19.0
        if axolotl_cut:
            sources["truncation"] += {
                "drop": " (axolotl 0.19.0 _drop_outside_range: a row longer than sequence_len is not trained; "
                "Gradian scores it with no supervised token)",
                "truncate": " (axolotl 0.19.0 truncate_long_seq: the first sequence_len tokens)",
                "raise": " (axolotl 0.19.0 stops on a longer row: every row it trained fits)",
            }[tr]
        if tr not in ("keep_start", "none") and not axolotl_cut and not ((tt_rule or lf_rule) and tr == "truncate"):
            unrep.append("truncation")
            rule = {
                "drop": "drops rows longer than max_length",
                "keep_end": "keeps the end of a long row",
                "truncate": "shortens a long row by its own rule",
            }.get(tr, f"truncates by {tr!r}")
            if name == "torchtune" and tr == "truncate":  # torchtune 0.6.1 torchtune/data/_utils.py: truncate()
                rule = "keeps the start of a long row and writes EOS over its last token"
            notes.append(
                f"truncation: {name} {rule} ({sources['truncation']}); Gradian keeps the start "
                "(rows within max_length are unaffected)"
            )
        loss, lsrc, lnotes = _loss_rule(c, data_format, chat, readers)
        values["loss_on"], sources["loss_on"] = loss, lsrc
        values["train_roles"], values["train_on_eos"] = None, "turn"
        if chat and c.trainer == "axolotl" and data_format != "text":
            roles, eos, msrc, mnotes = _axolotl_mask(c)
            values["train_roles"], values["train_on_eos"] = roles, eos
            sources["train_roles"] = sources["train_on_eos"] = msrc
            lnotes = lnotes + mnotes
        lnotes = lnotes + tt_notes + lf_notes + ax_notes
        if name == "torchtune" and not chat and not (tt_alpaca and tt_rule):
            # torchtune 0.6.1 data/_messages.py InputOutputToMessages, _text_completion
            lnotes.append(
                "torchtune turns instruct rows into user/assistant messages for its model tokenizer's "
                "tokenize_messages (and text rows into BOS + text + EOS); Gradian renders them with its plain "
                "prompt/completion rule"
            )
        if lnotes:
            unrep.append("loss_mask")
            notes += lnotes
        values["add_eos"] = d.add_eos
        if name in ("trl", "gradian"):
            sources["add_eos"] = "TRL 1.16 rule: EOS appended to non-conversational completions and text"
        else:
            sources["add_eos"] = f"Gradian default (TRL's EOS rule; {name}'s own EOS rule is not read)"
        tmpl, tsrc, tnote = _training_template(c, saved_template)
        values["chat_template"], sources["chat_template"] = tmpl, tsrc
        if lf_rule:  # LLaMA-Factory renders with its own template, never the tokenizer's Jinja
            values["chat_template"], sources["chat_template"] = None, f"not used: {lf_src}"
            tnote = None
        elif lf_tnote:
            tnote = lf_tnote
        if tnote:
            unrep.append("chat_template")
            notes.append(tnote)
        held = _held_out_note(c, name)
        if held:
            unrep.append("rows")
            notes.append(held)
        values["packing"] = bool(c.packing)
        sources["packing"] = c.source("packing") or "not said (assumed off)"
        if c.packing:
            # a row's first token is a label: text rows, and rows with every token trained (never an axolotl chat
            # row: axolotl labels turn contents; never under torchtune's Llama-3 rule: its BOS is always masked;
            # tests/data/test_framework_packing.py)
            first_trained = data_format == "text" or (
                values["loss_on"] == "all"
                and (not chat or name != "axolotl")
                and values.get("chat_rule") != "torchtune_llama3"
            )
            kept_apart, note = _packing(c, sources["packing"], first_trained)
            if kept_apart:  # reproduced: said beside the value, not among what is not reproduced
                sources["packing"] = note
            else:
                unrep.append("packing")
                notes.append(note)
        quant, quant_from, quant_src, quant_note = _base_quant(c)
        if quant:
            values["base_quant"], values["base_quant_from"] = quant, quant_from
            sources["base_quant"], sources["base_quant_from"] = (
                quant_src,
                c.source("load_dtype")
                or ("the training dtype (bf16/fp16)" if quant_from else "the base's stored dtype"),
            )
        elif quant_note:
            unrep.append("base_quant")
            notes.append(quant_note)
        cfg_explicit = {k: v for k, v in sources.items() if not v.startswith(("default", "TRL 1.16", "Gradian"))}
    warnings: list[str] = []
    for k, v in flags.items():
        if k not in FLAGS:
            raise ValueError(f"{k!r} is not a setup flag ({', '.join(FLAGS)})")
        if k in cfg_explicit and values.get(k) != v:
            warnings.append(
                f"{FLAGS[k]} {v} overrides {cfg_explicit[k]} = {values.get(k)!r}: the gradients use {v!r}, "
                "not what the run trained with"
            )
        values[k] = v
        sources[k] = f"flag {FLAGS[k]}"
        if k == "loss_on" and values.get("train_roles") is not None:  # the flag's rule, not axolotl's content mask
            values["train_roles"], values["train_on_eos"] = None, "turn"
            sources["train_roles"] = sources["train_on_eos"] = f"flag {FLAGS[k]}"
    if values["max_length"] is not None and values["truncation"] == "none":
        values["truncation"] = "keep_start"
        sources["truncation"] = sources["max_length"]
    setup = TrainingSetup(
        **values,  # the fields by name; one not set (no config: train_roles and the rest) keeps its default
        unreproduced=tuple(dict.fromkeys(unrep)),
        sources=sources,
        warnings=tuple(warnings),
        notes=tuple(notes),
    )
    setup.tokenize_spec()  # a flag's bad value fails here, naming the flag
    return setup
