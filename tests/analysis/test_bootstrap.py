"""Paired bootstrap over evaluation documents: intervals from a run's per-document losses, and of
the difference of two runs that scored the same documents."""
import numpy as np
import pytest

from analysis.bootstrap import bootstrap, difference_bootstrap
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


def two_strategies(rng, cut_on):
    """Runs A and B on the same 40 documents per domain of very different difficulty; B forgets
    math 0.05 nats less than A on the documents `cut_on` selects (a boolean mask)."""
    difficulty = {d: rng.uniform(3, 7, size=40) for d in ("math", "law")}
    tokens = {d: rng.integers(50, 500, size=40) for d in ("math", "law")}
    m, law = difficulty["math"], difficulty["law"]
    a = {"math": np.stack([m, m - 0.3, m - 0.1]), "law": np.stack([law, law, law - 0.2])}
    b = {"math": np.stack([m, m - 0.3, m - 0.1 - 0.05 * cut_on]), "law": a["law"]}
    return run_with_docs(a, tokens), run_with_docs(b, tokens), tokens


def test_the_difference_of_two_runs_on_the_same_documents_keeps_their_pairing():
    a, b, _ = two_strategies(np.random.default_rng(0), np.ones(40, dtype=bool))
    d = difference_bootstrap(a, b, samples=300, seed=1)["metrics"]["average_forgetting"]
    # forgetting of math (the only domain trained before the last): 0.2 for A, 0.15 for B, on
    # every document, so every draw gives −0.05 though the documents' losses differ by nats
    assert d == pytest.approx({"value": -0.05, "low": -0.05, "high": -0.05})
    own = bootstrap(a, samples=300, seed=1)["metrics"]["average_final"]
    assert own["high"] - own["low"] > 0.3  # each run alone spreads with the documents' difficulty


def test_a_difference_carried_by_few_documents_reaches_zero_and_mismatched_runs_are_refused():
    cut_on = np.zeros(40, dtype=bool)
    cut_on[:2] = True
    a, b, tokens = two_strategies(np.random.default_rng(0), cut_on)
    d = difference_bootstrap(a, b, samples=2000, seed=0)["metrics"]["average_forgetting"]
    assert d["value"] < 0 and d["high"] == pytest.approx(0.0)  # most draws miss one of the two documents
    other = {k: v.copy() for k, v in tokens.items()}
    other["law"][0] += 1
    c = run_with_docs({"math": np.full((3, 40), 5.0), "law": np.full((3, 40), 5.0)}, other)
    with pytest.raises(ValueError, match="domain 'law': the runs did not score the same documents"):
        difference_bootstrap(a, c)
