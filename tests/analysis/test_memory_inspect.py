"""analysis/memory_inspect.py on hand-made records: token classes, frequency classes, the gate by
class with its interval, slot ownership and survival."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analysis.memory_inspect import (
    InspectRecord,
    frequency_classes,
    gate_by_class,
    ownership,
    render_example,
    word_classes,
)


def test_word_classes_of_a_hand_labelled_sequence():
    pieces = ["The", " cat", " met", " Jo", "hn", " Smith", ".", " In", " 20", "24", ",", " call", " my", "_",
              "func", "(", "x", ")", " and", " foo", "Bar", "\n", "Then"]
    c = word_classes(pieces)
    on = {name: [p for p, m in zip(pieces, mask) if m] for name, mask in c.items()}
    assert on["capitalised"] == [" Jo", "hn", " Smith"]  # "The", "In", "Then" start sentences
    assert on["digits"] == [" 20", "24"]
    assert on["identifier"] == [" my", "_", "func", " foo", "Bar"]  # not " call": a space, not "(", follows it
    assert on["symbol"] == [".", ",", "(", ")", "\n"]


def test_word_classes_identifier_rules():
    c = word_classes(["x", " =", " f", "(", "1", ")", " snake", "_case", " camel", "Case", " plain"])
    on = [p for p, m in zip(["x", " =", " f", "(", "1", ")", " snake", "_case", " camel", "Case", " plain"],
                            c["identifier"]) if m]
    assert on == [" f", " snake", "_case", " camel", "Case"]


def test_frequency_classes():
    counts = np.array([600_000, 300_000, 99_990, 9, 1, 0])
    frequent, rare = frequency_classes(counts)
    assert frequent.tolist() == [True, False, False, False, False, False]  # id 0 alone is half the tokens
    assert rare.tolist() == [False, False, False, True, True, True]  # ≤ 10 per million, unseen included


def record(tmp_path: Path, gates: dict, counts: dict | None = None, slots: dict | None = None,
           tokens: dict | None = None) -> InspectRecord:
    return InspectRecord(tmp_path, slots, counts or {}, gates, tokens or {})


def test_gate_by_class_means_and_document_intervals(tmp_path):
    tokens = {0: " the", 1: " Paris", 2: " 42", 3: "."}
    ids = np.array([0, 1, 2, 3, 0, 1], dtype=np.int32)
    doc = np.array([0, 0, 0, 1, 1, 1], dtype=np.int32)
    g = np.array([0.1, 0.9, 0.5, 0.2, 0.3, 0.7], dtype=np.float16)
    rec = record(tmp_path, {"a_ids": ids, "a_doc": doc, "a_fwpkm1": g,
                            "pretrain_counts": np.array([900_000, 5, 99_000, 995], dtype=np.int64)}, tokens=tokens)
    stats = gate_by_class(rec, samples=200)["fwpkm1"]
    g64 = g.astype(np.float64)
    assert stats["all"]["n"] == 6 and stats["all"]["mean"] == pytest.approx(g64.mean())
    # " the Paris 42. the Paris": both " Paris" follow " the", so neither starts a sentence.
    assert stats["capitalised"]["n"] == 2 and stats["capitalised"]["mean"] == pytest.approx((0.9 + 0.7) / 2, abs=1e-3)
    assert stats["digits"]["mean"] == pytest.approx(0.5, abs=1e-3)
    assert stats["frequent"]["n"] == 2 and stats["frequent"]["mean"] == pytest.approx((0.1 + 0.3) / 2, abs=1e-3)
    assert stats["rare"]["n"] == 2  # " Paris": 5 per million
    for v in stats.values():
        assert v["low"] <= v["mean"] + 1e-12 and v["mean"] <= v["high"] + 1e-12
    # Two documents: the interval of "all" spans the two documents' means.
    assert stats["all"]["low"] == pytest.approx(min(g64[:3].mean(), g64[3:].mean()), abs=1e-6)
    assert stats["all"]["high"] == pytest.approx(max(g64[:3].mean(), g64[3:].mean()), abs=1e-6)


def test_ownership_and_survival(tmp_path):
    slots = {"experiences": [{"experience": 1, "domain": "a", "layers": {}}, {"experience": 2, "domain": "b", "layers": {}},
                             {"experience": 3, "domain": "c", "layers": {}}]}
    z = np.zeros(8, dtype=np.int32)
    counts = {
        "reads_L_1": np.array([6, 5, 4, 3, 2, 0, 0, 0], dtype=np.int32),  # half of 20 reads: slots 0 and 1
        "writes_L_1": z,
        "reads_L_2": np.array([0, 0, 0, 0, 0, 0, 1, 1], dtype=np.int32),  # half of 2: slot 6
        "writes_L_2": np.array([0, 3, 0, 0, 0, 0, 0, 0], dtype=np.int32),
        "reads_L_3": z,  # nothing read: no row
        "writes_L_3": np.array([1, 0, 0, 0, 0, 0, 0, 0], dtype=np.int32),
    }
    rows = ownership(record(tmp_path, {}, counts, slots))["L"]
    assert rows == [{"experience": 1, "domain": "a", "owned": 2, "survive": [1, 0]},
                    {"experience": 2, "domain": "b", "owned": 1, "survive": [1]}]


def test_render_example(tmp_path):
    rec = record(tmp_path, {}, tokens={1: "a", 2: " b", 3: "\n", 4: " c"})
    ex = {"before": [1, 2], "token": 3, "next": 4, "after": [4]}
    assert render_example(rec, ex) == "…a b[⏎] c… → ' c'"
    assert render_example(rec, {**ex, "next": None}).endswith("→ '∅'")
