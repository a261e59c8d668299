"""docs/architecture.md's module map names every module, so a newcomer finds each one there.

A row's first cell lists modules in backticks: a path (`experiments/multi/seeds.py`), a bare name
in the folder of the path before it in the same cell (`compare.py`, `report_inputs`), or a folder
(`cl_platform/memory/`) that stands for every module under it.
"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cl_platform", "streams", "strategies", "experiments", "analysis")


def mapped(text: str) -> tuple[set[str], set[str]]:
    """(module paths, folder prefixes) the map's rows name."""
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    files, folders = set(), set()
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for token in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
            if token.endswith("/"):
                folders.add(token)
                continue
            if "/" in token:
                folder = token.rsplit("/", 1)[0] + "/"
                files.add(token)
            elif folder:
                files.add(folder + (token if token.endswith(".py") else token + ".py"))
    return files, folders


def modules() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
                  if p.name != "__init__.py")


def test_every_module_is_in_the_map():
    files, folders = mapped((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))
    missing = [m for m in modules() if m not in files and not any(m.startswith(f) for f in folders)]
    assert not missing, f"add these to docs/architecture.md's module map: {missing}"
    stale = sorted(f for f in files if not (ROOT / f).is_file())
    assert not stale, f"docs/architecture.md's module map names modules that do not exist: {stale}"


def test_the_map_reader_finds_a_missing_module():
    text = "## Module map\n| module | concept |\n|---|---|\n| `a/b.py`, `c.py` | x |\n| `d/` | y |\n## Next\n| `e/f.py` | z |\n"
    files, folders = mapped(text)
    assert files == {"a/b.py", "a/c.py"} and folders == {"d/"}  # the next section's row is not the map's
