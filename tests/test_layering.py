"""Dependencies point one way: experiments → strategies, streams, analysis → cl_platform, and no
module imports itself back through others (no import cycles, between packages or inside one).

Imports are read from the source (every `import` anywhere in a file, including ones inside
functions and TYPE_CHECKING blocks), so a lazy import cannot hide a wrong-way dependency or a cycle.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cl_platform", "streams", "strategies", "experiments", "analysis")

# Everything that imports torch when imported: analysis must run where none of it is installed.
TORCH_STACK = {
    "torch", "torchvision", "torchaudio", "torchmetrics",
    "lightning", "lightning_fabric", "pytorch_lightning", "avalanche",
}

FORBIDDEN: dict[str, set[str]] = {
    "cl_platform": {"streams", "strategies", "experiments", "analysis"},
    "streams": {"strategies", "experiments", "analysis"},
    "strategies": {"streams", "experiments", "analysis"},
    "analysis": {"streams", "strategies", "experiments"} | TORCH_STACK,
    "experiments": set(),
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


def _python_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_packages_exist():
    assert all((ROOT / pkg / "__init__.py").is_file() for pkg in PACKAGES)


@pytest.mark.parametrize("path", _python_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_dependency_direction(path):
    owner = path.relative_to(ROOT).parts[0]
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for line, name in _imported_modules(path)
        if name.split(".")[0] in FORBIDDEN[owner]
    ]
    assert not bad, f"{owner} must not import these (see docs/architecture.md):\n" + "\n".join(bad)


# Studies share only the skeleton and the baseline family; one study never imports another's
# internals (a shared piece moves into one of these instead).
STUDY_SHARED = {"experiments.studies", "experiments.studies.study", "experiments.studies.family",
                "experiments.studies.needle_reading"}  # niah's own helper (how it reads an episode), no study


def _study_imports_of_other_studies(root: Path) -> list[str]:
    studies = root / "experiments" / "studies"
    bad = []
    for path in sorted(studies.glob("*.py")):
        me = _module_name(path)
        for line, name in _imported_modules(path):
            if name.startswith("experiments.studies") and name not in STUDY_SHARED | {me}:
                bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


def test_no_study_imports_another_study():
    bad = _study_imports_of_other_studies(ROOT)
    assert not bad, "a study imports another study (share through study.py or family.py):\n" + "\n".join(bad)


def _study_imports_from_outside(root: Path) -> list[str]:
    """Imports of experiments.studies.* in experiments/multi/ and experiments/cli.py (the command
    table names study commands as strings, which import nothing)."""
    files = sorted((root / "experiments" / "multi").glob("*.py")) + [root / "experiments" / "cli.py"]
    return [f"{p.relative_to(root)}:{line} imports {name}" for p in files if p.is_file()
            for line, name in _imported_modules(p) if name.startswith("experiments.studies")]


def test_multi_and_the_command_line_import_no_study():
    bad = _study_imports_from_outside(ROOT)
    assert not bad, "config-file helpers live in experiments/config_files.py, not in a study:\n" + "\n".join(bad)


def test_the_outside_rule_finds_a_study_import(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    multi = tmp_path / "experiments" / "multi"
    multi.mkdir(parents=True)
    (multi / "x.py").write_text("def f():\n    from experiments.studies.study import parse_seeds\n")
    assert _study_imports_from_outside(tmp_path) == ["experiments/multi/x.py:2 imports experiments.studies.study"]


def test_the_study_rule_finds_a_study_import(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    studies = tmp_path / "experiments" / "studies"
    studies.mkdir(parents=True)
    (studies / "a.py").write_text("from experiments.studies.study import cached\nfrom .family import Family\n")
    (studies / "b.py").write_text("def f():\n    from experiments.studies.a import helper\n")
    assert _study_imports_of_other_studies(tmp_path) == ["experiments/studies/b.py:2 imports experiments.studies.a"]


def test_resolves_relative_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / "analysis" / "sub" / "mod.py"
    module.parent.mkdir(parents=True)
    module.write_text(
        "from . import a\nfrom ..table import b\nfrom ... import streams\nimport torch.nn\n"
    )
    assert [name for _, name in _imported_modules(module)] == [
        "analysis.sub", "analysis.table", "", "torch.nn"
    ]


def test_analysis_imports_without_torch():
    # The source check above cannot see what a cl_platform module (or cl_platform/__init__.py)
    # pulls in when analysis imports it; importing for real in a clean interpreter can.
    modules = sorted(_module_name(p) for p in (ROOT / "analysis").rglob("*.py"))
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(sorted(m for m in {sorted(TORCH_STACK)!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", f"importing analysis loaded {out.stdout.strip()}"


def _import_graph(root: Path) -> dict[str, set[str]]:
    """Module → the project modules it imports (a `from pkg import name` counts as pkg.name when
    that is a module, else as pkg)."""
    files = sorted(p for pkg in PACKAGES if (root / pkg).is_dir() for p in (root / pkg).rglob("*.py"))
    modules = {_module_name(p) for p in files}
    graph: dict[str, set[str]] = {}
    for path in files:
        me = _module_name(path)
        edges = set()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
        for _, name in _imported_modules(path):
            targets = {f"{name}.{n}" for n in names} & modules
            edges |= targets or ({name} & modules)
        graph[me] = edges - {me}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycles():
    cycle = _cycle(_import_graph(ROOT))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    pkg = tmp_path / "cl_platform"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cl_platform.b import thing\n")
    (pkg / "b.py").write_text("def f():\n    from cl_platform import a  # lazy, still a cycle\n")
    assert _cycle(_import_graph(tmp_path)) == ["cl_platform.a", "cl_platform.b", "cl_platform.a"]
