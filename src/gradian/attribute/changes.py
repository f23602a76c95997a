"""Whether a run's inputs on disk are still the ones it recorded.

``gradian verify``, ``gradian report`` and ``Attributor.from_run`` read a finished run's inputs again (its training
data, eval set, adapter, base model, configs and checkpoints). Each is hashed the way the index hashes it and compared
with ``run.json``'s ``manifest.identity``; a changed input is a one-line user error unless the caller allows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from gradian.errors import GradianUserError
from gradian.index.identity import dataset_identity, file_hash


def eval_sha(path: Path) -> str:
    """The eval set's sha256 as the run recorded it (:func:`gradian.index.identity.dataset_identity`)."""
    return dataset_identity(path)["sha256"]  # the hash the run recorded (lm-eval's samples files included)


def changed_inputs(run: dict[str, Any], *, checkpoints: bool = False, need_eval: bool = True) -> list[tuple[str, str]]:
    """The run's inputs whose content on disk is not what the run recorded: ``[(what, path), ...]``.

    Compares ``manifest.identity`` (the hashes :func:`attribute_run` recorded: the training data, the eval
    set, the adapter, the base model, the training configs and, with ``checkpoints``, every trajectory
    checkpoint) with the files now at ``manifest.paths``, hashed the way the index hashes them
    (:mod:`gradian.index.identity`, memoised by path, size and mtime: an unchanged file is read once).
    An input the run did not record a hash for is not compared.

    Raises:
        GradianUserError: an input the run needs is gone (``need_eval``: the eval set counts).
    """
    from gradian.index.identity import adapter_unchanged, model_identity

    man = run["manifest"]
    ident, paths = man["identity"], man["paths"]
    gone = [("training data", paths["data"]), ("adapter", paths["adapter"])]
    if need_eval:
        gone.append(("eval set", paths["eval"]))
    for what, p in gone:
        if not Path(p).exists():
            raise GradianUserError(
                f"the run's {what} is gone", where=str(p), fix="restore it, or re-run gradian attribute"
            )
    out: list[tuple[str, str]] = []
    if dataset_identity(paths["data"])["sha256"] != ident["dataset"]["sha256"]:
        out.append(("training data", paths["data"]))
    if Path(paths["eval"]).exists() and eval_sha(Path(paths["eval"])) != ident["eval"]["sha256"]:
        out.append(("eval set", paths["eval"]))
    if ident.get("adapter") and not adapter_unchanged(paths["adapter"], ident["adapter"]["sha256"]):
        out.append(("adapter", paths["adapter"]))
    if (ident.get("base") or {}).get("sha256") and model_identity(paths["base"]).get("sha256") != ident["base"][
        "sha256"
    ]:
        out.append(("base model", paths["base"]))
    for c in paths.get("configs") or []:
        want = (ident.get("configs") or {}).get(Path(c).name)
        if want and Path(c).is_file() and file_hash(c) != want:
            out.append(("training config", c))
    traj = (run.get("attribution") or {}).get("trajectory") or {}
    for c in traj.get("checkpoints") or [] if checkpoints else []:
        if c.get("adapter_sha256") and not c.get("final"):
            if not Path(c["path"]).is_dir() or not adapter_unchanged(c["path"], c["adapter_sha256"]):
                out.append((f"checkpoint (step {c.get('step')})", c["path"]))
    return out


def check_inputs(
    run: dict[str, Any],
    *,
    allow_changed_inputs: bool = False,
    flag: str = "--allow-changed-inputs",
    say: Callable[[str], None] | None = None,
    **kw: Any,
) -> list[tuple[str, str]]:
    """:func:`changed_inputs`, as a one-line user error naming the first changed file (unless allowed).

    Args:
        allow_changed_inputs: go on with the files as they are now; each change is said (``say``).
        flag: how the caller spells the permission, for the fix.
        kw: passed to :func:`changed_inputs`.

    Returns:
        the changed inputs (empty when none changed).
    """
    changed = changed_inputs(run, **kw)
    if changed and not allow_changed_inputs:
        what, path = changed[0]
        more = f" (and {len(changed) - 1} more: {', '.join(w for w, _ in changed[1:])})" if len(changed) > 1 else ""
        raise GradianUserError(
            f"the run's {what} changed since the run (its sha256 differs from run.json's){more}",
            where=str(path),
            fix=f"restore the file the run used, re-run gradian attribute, or pass {flag} to use it as it is now",
        )
    for what, path in changed:
        if say is not None:
            say(f"note: the run's {what} changed since the run ({path}); using it as it is now ({flag})")
    return changed
