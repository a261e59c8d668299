"""No test compares a wall time against a bound: a slower CI machine of the same kind would fail
it and block every landing. Speed is measured by benchmarks (BENCHMARKS.md, experiments/LOG.md).

Read from the source: an `assert` may not use a clock call, or a name whose value came from one
(`t0 = time.perf_counter()`, `cold = time.perf_counter() - t0`, ...). Clocks used for polling
deadlines (waiting for a process) are allowed outside asserts.
"""

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
CLOCKS = {"time", "perf_counter", "monotonic", "process_time", "perf_counter_ns", "monotonic_ns", "time_ns"}


def _is_clock_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "time":
        return f.attr in CLOCKS
    return isinstance(f, ast.Name) and f.id in CLOCKS - {"time"}


def timed_asserts(source: str) -> list[int]:
    """Line numbers of asserts that read a clock, directly or through assigned names."""
    tree = ast.parse(source)
    timed: set[str] = set()
    changed = True
    while changed:  # names derived from clock values, to a fixed point
        changed = False
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                uses = any(_is_clock_call(n) or (isinstance(n, ast.Name) and n.id in timed) for n in ast.walk(node.value))
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if uses and isinstance(n, ast.Name) and n.id not in timed:
                            timed.add(n.id)
                            changed = True
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert)
            and any(_is_clock_call(n) or (isinstance(n, ast.Name) and n.id in timed) for n in ast.walk(node))]


def test_the_check_finds_a_timed_assert():
    assert timed_asserts("import time\nt0 = time.perf_counter()\nwork()\ncold = time.perf_counter() - t0\nassert cold < 60\n") == [5]
    assert timed_asserts("from time import perf_counter\nassert perf_counter() < 1\n") == [2]
    assert timed_asserts("deadline = time.time() + 120\nwhile time.time() < deadline:\n    pass\nassert done\n") == []


@pytest.mark.parametrize("path", sorted(TESTS.rglob("*.py")), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_test_asserts_a_wall_time(path):
    assert timed_asserts(path.read_text(encoding="utf-8")) == [], f"{path.name}: timing asserts (make them benchmarks)"
