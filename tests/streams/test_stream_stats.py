"""`clp data stats CONFIG`: the per-split table and the domain-overlap tables, with real values."""
from __future__ import annotations

import numpy as np

from experiments.cli import main as clp
from streams.stats import overlap_tables


def test_overlap_tables_on_known_distributions():
    counts = {"a": np.array([5, 5, 0, 0]), "b": np.array([0, 5, 5, 0]), "c": np.array([5, 5, 0, 0])}
    mass, jac = overlap_tables(counts)
    assert np.allclose(mass, [[1, 0.5, 1], [0.5, 1, 0.5], [1, 0.5, 1]])
    assert np.allclose(jac, [[1, 1 / 3, 1], [1 / 3, 1, 1 / 3], [1, 1 / 3, 1]])


def test_clp_data_stats(small, small_scenario, stream_cache, tmp_path, capsys):
    config = tmp_path / "small.yaml"
    domains = "\n".join(
        f"  - {{name: {n}, source: 'corpus:{n}', filters: {{max_documents: {k}}}}}" for n, k in small.slices.items()
    )
    b = small.budget
    config.write_text(
        f"domains:\n{domains}\norder: [code, web]\nseq_len: {small.seq_len}\ncache_dir: {stream_cache}\n"
        f"token_budget: {{pretrain: {b.pretrain}, adapt: {b.adapt}, eval: {b.eval}}}\n",
        encoding="utf-8",
    )
    assert clp(["data", "stats", str(config)]) == 0
    out = capsys.readouterr().out
    assert "order: code -> web" in out
    lines = out.splitlines()
    law = lines.index(next(line for line in lines if line.startswith("law ")))
    assert lines[law].split()[:3] == ["law", "(all)", str(small.slices["law"])]
    pre, adapt, ev = (lines[law + i].split() for i in (1, 2, 3))
    n_docs = small_scenario.domains["law"].splits["pretrain"].n_docs
    assert pre == ["pretrain", str(n_docs), f"{b.pretrain:,}", str(b.pretrain // small.seq_len)]
    assert adapt[0] == "adapt" and adapt[2:] == [f"{b.adapt:,}", str(b.adapt // small.seq_len)]
    assert ev[0] == "eval" and ev[2:] == [f"{b.eval:,}", str(b.eval // small.seq_len)]
    mass_row = next(line for line in lines if line.startswith("mass overlap")).split()[2:]
    assert mass_row == small.domains
    code_row = lines[lines.index(next(line for line in lines if line.startswith("mass overlap"))) + 3].split()
    values = [float(v) for v in code_row[1:]]
    assert code_row[0] == "code" and values[2] == 1.0 and all(0.1 < v < 0.9 for i, v in enumerate(values) if i != 2)
