"""Paired bootstrap over evaluation documents: intervals from a run's per-document losses."""
import numpy as np
import pytest

from analysis.bootstrap import bootstrap
from cl_platform.results import ResultsMatrix, RunResults


def run_with_docs(per_doc_loss: dict[str, np.ndarray], tokens: dict[str, np.ndarray]) -> RunResults:
    """per_doc_loss[d]: (rows, docs) per-token loss of each document; tokens[d]: (docs,)."""
    domains = list(per_doc_loss)
    rows = next(iter(per_doc_loss.values())).shape[0]
    doc_losses = {str(t): {d: [[float(per_doc_loss[d][t, k] * tokens[d][k]), int(tokens[d][k])]
                                for k in range(len(tokens[d]))] for d in domains} for t in range(rows)}
    values = [[float((per_doc_loss[d][t] * tokens[d]).sum() / tokens[d].sum()) for d in domains] for t in range(rows)]
    matrix = ResultsMatrix(domains, domains[: rows - 1], values)
    return RunResults(matrix=matrix, config_hash="h", seed=0, mode="fast", memory_policy="frozen", strategy="naive",
                      doc_losses=doc_losses)


def test_a_gain_shared_by_every_document_has_no_spread_though_the_documents_differ():
    rng = np.random.default_rng(0)
    difficulty = {d: rng.uniform(3, 7, size=40) for d in ("math", "law")}
    tokens = {d: rng.integers(50, 500, size=40) for d in ("math", "law")}
    # math gains exactly 0.1 on every document in experience 1, law 0.2 in experience 2
    loss = {"math": np.stack([difficulty["math"], difficulty["math"] - 0.1, difficulty["math"] - 0.1]),
            "law": np.stack([difficulty["law"], difficulty["law"], difficulty["law"] - 0.2])}
    ci = bootstrap(run_with_docs(loss, tokens), samples=300, seed=1)
    gains = ci["adaptation_gain_per_experience"]
    assert gains[0] == pytest.approx({"value": 0.1, "low": 0.1, "high": 0.1})
    assert gains[1] == pytest.approx({"value": 0.2, "low": 0.2, "high": 0.2})
    # ... while each cell on its own spreads with the documents' difficulty
    low, high = np.array(ci["matrix_low"]), np.array(ci["matrix_high"])
    assert (high - low > 0.3).all()
    assert ci["documents"] == {"math": 40, "law": 40}


def test_a_gain_carried_by_few_documents_gets_an_interval_that_reaches_zero():
    tokens = {"math": np.full(30, 100)}
    before = np.full(30, 5.0)
    after = before.copy()
    after[:2] -= 1.5  # two documents improve a lot, 28 not at all
    ci = bootstrap(run_with_docs({"math": np.stack([before, after])}, tokens), samples=2000, seed=0)
    gain = ci["adaptation_gain_per_experience"][0]
    assert gain["value"] == pytest.approx(0.1)
    assert gain["low"] == pytest.approx(0.0) and gain["high"] > 0.15
    assert ci["metrics"]["adaptation_gain"]["value"] == pytest.approx(0.1)


def test_same_seed_same_intervals_and_missing_documents_are_named():
    tokens = {"math": np.array([10, 20, 30])}
    results = run_with_docs({"math": np.array([[5.0, 4.0, 6.0], [4.5, 4.0, 5.0]])}, tokens)
    assert repr(bootstrap(results, samples=50, seed=3)) == repr(bootstrap(results, samples=50, seed=3))  # NaN-safe
    results.doc_losses.pop("1")
    with pytest.raises(ValueError, match=r"rows \[1\] have no per-document losses"):
        bootstrap(results)
