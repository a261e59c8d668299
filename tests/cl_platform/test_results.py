import json
import math
import os

import numpy as np
import pytest

from cl_platform.results import ResultsFormatError, ResultsMatrix, RunResults, package_versions

NAN = math.nan


def _matrix(values, experiences=("math", "law", "math")) -> ResultsMatrix:
    return ResultsMatrix(["math", "law", "code"], list(experiences), np.array(values, dtype=float))


def _run(matrix: ResultsMatrix) -> RunResults:
    return RunResults(
        matrix=matrix,
        config_hash="3f2a9c",
        seed=7,
        mode="fast",
        memory_policy="persist",
        strategy="naive",
        versions={"torch": "2.14.1"},
        curves={"math": [(0, 3.2), (10, 2.5), (10, 2.6), (20, NAN)], "law": []},
    )


FULL = [[3.2, 3.4, 2.9], [2.1, 3.5, 2.95], [2.6, 2.2, 3.0], [2.0, 2.4, float("inf")]]
PARTIAL = [[3.2, 3.4, 2.9], [2.1, 3.5, 2.95], [2.6, NAN, NAN], [NAN, NAN, NAN]]


def test_empty_then_record_fills_rows_in_order():
    m = ResultsMatrix.empty(["math", "law"], ["math", "law"])
    assert m.values.shape == (3, 2) and np.isnan(m.values).all()
    assert m.last_complete_row == -1
    m.record(0, "math", 3.0)
    assert m.last_complete_row == -1
    with pytest.raises(ValueError, match="row 0 is not complete"):
        m.record(1, "math", 2.0)
    m.record(0, "law", 3.5)
    assert m.last_complete_row == 0 and not m.is_complete
    m.record(1, "law", 3.6)
    m.record(1, "math", 2.0)
    m.record(2, "math", 2.5)
    m.record(2, "law", 2.2)
    assert m.is_complete and m.last_complete_row == 2
    with pytest.raises(KeyError, match="web"):
        m.record(1, "web", 1.0)
    with pytest.raises(IndexError):
        m.record(3, "math", 1.0)


def test_recurring_domain_experience_mapping():
    m = _matrix(FULL)
    assert [m.trained_domain(t) for t in (1, 2, 3)] == ["math", "law", "math"]
    assert m.training_experiences("math") == [1, 3]
    assert m.training_experiences("code") == []
    with pytest.raises(IndexError):
        m.trained_domain(0)


@pytest.mark.parametrize("values", [FULL, PARTIAL], ids=["full", "killed-mid-run"])
def test_json_round_trip(tmp_path, values):
    run = _run(_matrix(values))
    path = tmp_path / "results.json"
    run.to_json(path)
    # Strict JSON: no NaN/Infinity tokens that other readers reject.
    json.loads(path.read_text(), parse_constant=lambda token: pytest.fail(f"non-JSON {token}"))
    back = RunResults.from_json(path)
    assert back == run
    assert back.matrix.last_complete_row == (3 if values is FULL else 1)
    assert math.isnan(back.curves["math"][3][1])
    assert os.listdir(tmp_path) == ["results.json"]


def test_to_json_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    _run(_matrix(FULL)).to_json(path)
    before = path.read_text()

    def fail(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        _run(_matrix(PARTIAL)).to_json(path)
    assert path.read_text() == before
    assert os.listdir(tmp_path) == ["results.json"]


def test_matrix_validation_names_the_field():
    with pytest.raises(ResultsFormatError, match=r"experiences\[1\]"):
        _matrix(FULL, experiences=("math", "web", "math"))
    with pytest.raises(ResultsFormatError, match="'values' has shape"):
        _matrix(FULL[:3])
    with pytest.raises(ResultsFormatError, match="'domains' has duplicates"):
        ResultsMatrix(["math", "math"], [], np.zeros((1, 2)))
    with pytest.raises(ResultsFormatError, match="row 2 has measurements but row 1"):
        _matrix([FULL[0], [2.1, NAN, 2.9], FULL[2], [NAN] * 3])


def _corrupt(tmp_path, edit) -> str:
    data = _run(_matrix(FULL)).to_dict()
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsFormatError) as err:
        RunResults.from_json(path)
    assert str(path) in str(err.value)
    return str(err.value)


def test_load_validation_names_the_field(tmp_path):
    assert "'seed'" in _corrupt(tmp_path, lambda d: d.update(seed="7"))
    assert "'mode'" in _corrupt(tmp_path, lambda d: d.update(mode="slow"))
    assert "missing field 'strategy'" in _corrupt(tmp_path, lambda d: d.pop("strategy"))
    assert "'schema_version'" in _corrupt(tmp_path, lambda d: d.update(schema_version=99))
    assert "matrix.values[1][2]" in _corrupt(
        tmp_path, lambda d: d["matrix"]["values"][1].__setitem__(2, "x")
    )
    assert "matrix.values[2]" in _corrupt(tmp_path, lambda d: d["matrix"]["values"][2].pop())
    assert "'matrix'" in _corrupt(tmp_path, lambda d: d["matrix"].update(lower_is_better="yes"))
    assert "curves['math'][1]" in _corrupt(
        tmp_path, lambda d: d["curves"].update(math=[[10, 1.0], [5, 2.0]])
    )
    assert "curves['web']" in _corrupt(tmp_path, lambda d: d["curves"].update(web=[]))


def test_not_json_is_a_format_error(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{"seed": ')
    with pytest.raises(ResultsFormatError, match="not valid JSON"):
        RunResults.from_json(path)


def test_add_point_keeps_steps_ordered():
    run = _run(_matrix(FULL))
    run.add_point("law", 5, 3.0)
    run.add_point("law", 5, 2.9)
    assert run.curves["law"] == [(5, 3.0), (5, 2.9)]
    with pytest.raises(ResultsFormatError, match="before the previous step"):
        run.add_point("law", 4, 2.8)


def test_package_versions_reads_metadata_and_skips_missing():
    versions = package_versions(("numpy", "no-such-package-xyz"))
    assert versions == {"numpy": np.__version__}


def test_the_memory_reset_rows_round_trip_and_must_match_the_matrix(tmp_path):
    run = _run(_matrix(FULL))
    assert "memory_reset" not in run.to_dict()  # results from before it read back as None
    run.memory_reset = _matrix(PARTIAL)
    path = tmp_path / "r.json"
    run.to_json(path)
    back = RunResults.from_json(path)
    assert np.array_equal(back.memory_reset.values, run.memory_reset.values, equal_nan=True)
    assert back.memory_reset.domains == run.matrix.domains
    with pytest.raises(ResultsFormatError, match="'memory_reset' must be a matrix of the same domains"):
        RunResults(**{**run.__dict__, "memory_reset": _matrix(FULL, experiences=("math", "law", "law"))})
    data = run.to_dict()
    data["memory_reset"]["values"][1][0] = "x"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(ResultsFormatError, match=r"memory_reset\.values\[1\]\[0\]"):
        RunResults.from_json(bad)
