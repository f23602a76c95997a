"""The layout of src/gradian: no import circle, and the lower layers import nothing above them.

The import graph is read from the source with ``ast`` (nothing is imported): every ``import`` and
``from ... import`` in a module, at top level, inside functions and under ``TYPE_CHECKING`` alike, is an
edge from that module to the gradian module it names (``from gradian.x import y`` is an edge to
``gradian.x.y`` when that is a module, else to ``gradian.x``). A cycle is a strongly connected component
of more than one module (or a module importing itself).
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "gradian"


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> its file, for every ``.py`` under ``src/gradian`` (a package is its ``__init__``)."""
    out: dict[str, Path] = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute dotted name of a (possibly relative) ``from`` target."""
    if level == 0:
        return name or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, bool]]:
    """(imported gradian module or ``pkg.attr`` candidate, at top level?) for every import in a module."""
    out: list[tuple[str, bool]] = []
    for node, at_top in _walk(tree, True):
        if isinstance(node, ast.Import):
            out += [(alias.name, at_top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            # `from pkg import sub` imports the module pkg.sub when there is one, else the name from pkg
            target = _resolve(module, is_package, node.level, node.module)
            out += [(f"{target}.{alias.name}", at_top) for alias in node.names]
    return out


def _walk(node: ast.AST, at_top: bool):
    """Every node under ``node`` with whether it runs at import time (not in a function, not under TYPE_CHECKING)."""
    for child in ast.iter_child_nodes(node):
        yield child, at_top
        inner = at_top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(child, ast.If) and _is_type_checking(child):
            yield child.test, at_top
            for grandchild in child.body:
                yield grandchild, False
                yield from _walk(grandchild, False)
            for grandchild in child.orelse:
                yield grandchild, at_top
                yield from _walk(grandchild, at_top)
            continue
        yield from _walk(child, inner)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(src: Path = SRC, *, top_level_only: bool = False) -> dict[str, set[str]]:
    """Module -> the gradian modules it imports (function-level imports included unless ``top_level_only``)."""
    return {k: set(v) for k, v in _import_graph(src, top_level_only).items()}


@functools.cache
def _import_graph(src: Path, top_level_only: bool) -> dict[str, frozenset[str]]:
    files = module_files(src)
    graph: dict[str, frozenset[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for target, at_top in _imports(tree, module, is_package):
            if top_level_only and not at_top:
                continue
            if target.split(".")[0] != PACKAGE:
                continue
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.add(target)
        graph[module] = frozenset(edges)
    return graph


def external_top_level_imports(module: str, src: Path = SRC) -> set[str]:
    """The top-level packages a module imports at import time (outside functions and ``TYPE_CHECKING``)."""
    path = module_files(src)[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
            elif isinstance(node, ast.If) and not _is_type_checking(node):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(found)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


#: The layers, bottom first (docs/architecture.md): a module imports only from its own layer or below.
LAYERS: tuple[tuple[str, ...], ...] = (
    (  # 0: the bottom, torch-free on import
        "gradian.errors",
        "gradian.defaults",
        "gradian.sign",
        "gradian.schema",
        "gradian.validate",
        "gradian.util",
        "gradian.safeio",
        "gradian.paths",
        "gradian.tables",
        "gradian.version",
        "gradian.libversions",
        "gradian.runfile",
        "gradian.runtypes",
        "gradian.index.identity",
        "gradian.data",
    ),
    (  # 1
        "gradian.models",
        "gradian.gradients",
        "gradian.index.spec",
        "gradian.index.store",
        "gradian.index.shards",
        "gradian.index.size",
        "gradian.index.build",
        "gradian.distributed",
    ),
    ("gradian.engines", "gradian.finetune"),  # 2
    (  # 3: the lanes (a lane may use another), and what plans and builds a run's indexes and its cache
        "gradian.index.plan",
        "gradian.index.joint",
        "gradian.cache",
        "gradian.evaluate",
        "gradian.attribute",
        "gradian.audit",
        "gradian.report",
        "gradian.verify",
        "gradian.worlds",
        "gradian.train",
        "gradian.trainconfig",
        "gradian.doctor",
    ),
    ("gradian.attributor", "gradian.commands", "gradian.cli", "gradian.__main__"),  # 4: the front
)

#: Imports that go up a layer, each inside a function, and why (nothing else may).
UPWARD = {
    # a run's specs are checked by their own dataclasses, which live with the code they configure, each in a
    # module that imports no torch (test_load_run_imports_no_torch)
    ("gradian.runfile", "gradian.attribute.datacheck"),
    ("gradian.runfile", "gradian.attribute.queries"),
    ("gradian.runfile", "gradian.attribute.spec"),
    ("gradian.runfile", "gradian.evaluate"),
    ("gradian.runfile", "gradian.evaluate.result"),
    ("gradian.runfile", "gradian.index.spec"),
    ("gradian.runfile", "gradian.models.spec"),
    # the typed run reads its evaluation and failing items back through Evaluate's own records
    ("gradian.runtypes", "gradian.evaluate"),
    # the training setup reads the trainer's config through the one config reader
    ("gradian.data.setup", "gradian.audit.config"),
    # ... and the attention axolotl keeps packed rows apart with, one table for the setup and Audit's C12
    ("gradian.data.setup", "gradian.audit.config.axolotl"),
    # the run's identity hashes every file of an lm-eval --log_samples folder, which only its reader can name
    ("gradian.index.identity", "gradian.evaluate.lm_eval"),
    # gradian train prints with the CLI's console and progress bar
    ("gradian.train", "gradian.commands._common"),
}


def layer(module: str) -> int:
    """The layer of a module (the root package ``gradian`` stands apart: its public names are lazy)."""
    for i, prefixes in enumerate(LAYERS):
        if _under(module, prefixes):
            return i
    raise AssertionError(
        f"{module} is in no layer: add it to LAYERS (tests/test_architecture.py, docs/architecture.md)"
    )


#: The bottom layer: modules every lane may import; they import no torch at top level and nothing of the
#: lanes (attribute/, report/, evaluate/, audit/, verify/, commands, the CLI, the Python API).
BOTTOM = LAYERS[0]
LANES = LAYERS[3] + LAYERS[4]


def test_graph_reads_the_package():
    """The graph holds every module and the edges one knows are there (so the assertions below bite)."""
    graph = import_graph()
    assert len(graph) > 100
    assert "gradian.errors" in graph["gradian.attribute.changes"]
    assert "gradian.attribute.evidence" in graph["gradian.attribute.run"]
    assert "gradian.runfile" in graph["gradian.report.builders"]


def test_cycle_finder_finds_a_planted_circle(tmp_path):
    """A three-module circle written to disk is found (and only it)."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from gradian.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from gradian import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("import gradian.a\n")
    assert cycles(import_graph(tmp_path)) == [["gradian.a", "gradian.c", "gradian.sub.b"]]


def test_every_import_goes_down_the_layers():
    """No module imports from a layer above its own, but for the function-level imports listed in UPWARD."""
    graph, top = import_graph(), import_graph(top_level_only=True)
    up = {(m, w) for m in graph if m != PACKAGE for w in graph[m] if w != PACKAGE and layer(w) > layer(m)}
    assert sorted(up - UPWARD) == []
    assert sorted((m, w) for m, w in up if w in top[m]) == []  # none of them at import time
    assert sorted(UPWARD - up) == []  # the list stays exact


def test_no_import_circle_in_src():
    """No module of src/gradian reaches itself through imports, function-level ones included."""
    assert cycles(import_graph()) == []


def import_time_reach(module: str) -> set[str]:
    """Every gradian module that ``import module`` runs: its top-level imports, theirs, and the packages above each."""
    graph = import_graph(top_level_only=True)
    for m in list(graph):
        parts = m.split(".")
        graph[m] = graph[m] | ({".".join(parts[:i]) for i in range(1, len(parts))} & set(graph))
    return reachable(graph, module) | {module}


def import_time_externals(module: str) -> set[str]:
    """The third-party packages ``import module`` imports (top level of every module it runs)."""
    return set().union(*(external_top_level_imports(m) for m in import_time_reach(module)))


HEAVY = {"torch", "transformers", "peft", "datasets", "accelerate"}


@pytest.mark.parametrize("module", [m for m in module_files() if _under(m, BOTTOM)])
def test_bottom_layer_imports_no_lane_and_no_torch(module):
    """The bottom layer (errors, sign, the run's file, identities, data readers) stays at the bottom: importing it
    runs no lane module (attribute/, report/, evaluate/, audit/, verify/, the commands) and imports no torch.
    """
    above = sorted(m for m in import_time_reach(module) if _under(m, LANES))
    assert above == [], f"{module} imports {above}"
    heavy = sorted(import_time_externals(module) & HEAVY)
    assert heavy == [], f"{module} imports {heavy} on import"


def test_report_imports_no_torch_and_no_attribute_code():
    """The report imports the run's file (gradian.runfile) plainly, and nothing of attribute/ or torch."""
    graph = import_graph(top_level_only=True)
    for module in [m for m in graph if _under(m, ("gradian.report",))]:
        reached = import_time_reach(module)
        assert not [m for m in reached if _under(m, ("gradian.attribute",))], module
        assert not import_time_externals(module) & HEAVY, module
    assert "gradian.runfile" in graph["gradian.report.views"]


def test_finetune_stands_below_attribute():
    """Loading a fine-tune and its training index imports nothing of attribute/ (it is what attribute/ uses)."""
    graph = import_graph()
    assert "gradian.finetune" in graph
    reached = reachable(graph, "gradian.finetune")
    assert not [m for m in reached if _under(m, ("gradian.attribute", "gradian.attributor", "gradian.report"))]


_NO_TORCH = (
    "import runpy, sys\n"
    "sys.argv = ['gradian'] + sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_module('gradian', run_name='__main__')\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "else:\n"
    "    code = 0\n"
    "heavy = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy))\n"
    "sys.exit(code)\n"
)


@pytest.mark.parametrize("argv", [["--help"], ["attribute", "--help"], ["diagnose", "--help"], ["verify", "--help"]])
def test_help_imports_no_torch(argv):
    """``gradian --help`` and a command's ``--help`` print their help without importing torch."""
    env = {"PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH, *argv], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout.lower()
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY=", proc.stdout[-500:]


def test_engine_help_read_from_source_is_the_registrys():
    """``gradian attribute --help``'s engine list (read from the engine files) is the registry's own text."""
    from gradian.commands._options import engine_help
    from gradian.engines.registry import help_text

    assert engine_help() == help_text()
    assert "datainf (" in engine_help()


_LOAD_RUN = (
    "import sys\n"
    "from gradian.errors import GradianUserError\n"
    "from gradian.runfile import load_run\n"
    "from gradian.runtypes import Run\n"
    "try:\n"
    "    run = load_run(sys.argv[1])\n"
    "    print('SPECS=' + ','.join(sorted(Run.from_dict(run).manifest.identity['specs'])))\n"
    "except GradianUserError as e:\n"
    "    print('ERROR=' + e.what)\n"
    "heavy = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
    "print('HEAVY=' + ','.join(heavy))\n"
)


def _run_with_specs(tmp_path: Path, name: str, **change) -> Path:
    """A run.json whose specs are the writer's own (each spec's ``to_dict``), with ``change`` applied."""
    import json

    from gradian.attribute.spec import AttributeSpec
    from gradian.evaluate import EvalSpec
    from gradian.index.spec import GradSpec
    from gradian.models.spec import ModelSpec
    from gradian.runfile import RUN_SCHEMA

    specs = {
        "model": ModelSpec("some/base", device="cpu").to_dict(),
        "grad": GradSpec(unit="sentence").to_dict(),
        "attribute": AttributeSpec(second_engine="ekfac").to_dict(),
        "eval": EvalSpec().to_dict(),
        "seed": 0,
    }
    for spec, (key, value) in change.items():
        specs[spec][key] = value
    d = tmp_path / name
    d.mkdir()
    (d / "run.json").write_text(json.dumps({"schema": RUN_SCHEMA, "manifest": {"identity": {"specs": specs}}}))
    return d


@pytest.mark.parametrize(
    "change, expect",
    [
        ({}, "SPECS=attribute,eval,grad,model,seed"),
        # the specs' own checks run in that process: the engine registry, the dtype and unit choices
        ({"attribute": ("engine", {"name": "nope"})}, "ERROR=manifest.identity.specs.attribute: unknown engine"),
        ({"model": ("dtype", "int3")}, "ERROR=manifest.identity.specs.model: unknown dtype 'int3'"),
        ({"grad": ("storage_dtype", "int3")}, "ERROR=manifest.identity.specs.grad: unknown storage_dtype"),
    ],
)
def test_load_run_imports_no_torch(tmp_path, change, expect):
    """Loading and checking a run.json (``load_run``, ``Run.from_dict``) reads every spec through its own
    dataclass without importing torch: the specs live in torch-free modules (``gradian.models.spec``,
    ``gradian.index.spec``, ``gradian.attribute.spec``, ``gradian.evaluate.spec``, the engine files).
    """
    run_dir = _run_with_specs(tmp_path, "run", **change)
    env = {"PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", _LOAD_RUN, str(run_dir)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0].startswith(expect), proc.stdout
    assert lines[-1] == "HEAVY=", proc.stdout
