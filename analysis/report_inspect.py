"""The report's sections from a run's memory recorder (run_dir/inspect/, `cl.inspect: true`):

    slots  per FwPKM layer and experience, the slots its domain wrote most: how often they were
           written and read, the strongest writers (token, ±10 tokens, the next token the write
           teaches the slot to return) and readers; which slots each domain owns and how many of
           them later domains leave untouched
    gate   the mean gate by token class with 95 % document-bootstrap intervals, and a sample of
           each domain's eval text shaded by the gate of each token

Present only when the run recorded them; numbers come from analysis/memory_inspect.py.
"""

from __future__ import annotations

from analysis.memory_inspect import (
    CLASSES,
    InspectRecord,
    gate_by_class,
    load_inspect,
    ownership,
    render_example,
)
from analysis.report_document import Highlight, Paragraph, Section, Table, num, slug
from analysis.report_inputs import RunInput

SHOWN_SLOTS = 4  # of the recorded top slots, per layer and experience
SHOWN_EXAMPLES = 3
SAMPLE_TOKENS = 160  # tokens of highlighted text per domain and layer

CLASS_NOTES = {
    "all": "every recorded token",
    "frequent": "ids making up half of the pretraining tokens",
    "rare": "≤ 10 per million pretraining tokens",
    "capitalised": "capitalised word, not sentence-initial (proper names)",
    "digits": "word with a digit",
    "identifier": "snake_case / camelCase / called",
    "symbol": "punctuation, whitespace, operators",
}


def inspect_sections(run: RunInput, prefix: str) -> list[Section]:
    rec = load_inspect(run.path)
    if rec is None:
        return []
    return [s for s in (slots_section(rec, prefix), gate_section(rec, prefix)) if s is not None]


def slots_section(rec: InspectRecord, prefix: str) -> Section | None:
    if not rec.slots or not rec.slots.get("experiences"):
        return None
    bounds = rec.slots.get("bounds", {})
    blocks: list = [Paragraph(
        "For each experience, the slots its domain wrote most (summed write weight g·w over the experience), "
        "with the strongest writes: the token whose query addressed the slot, in brackets with its context, "
        "and after the arrow the next token, whose value the write teaches the slot to return (look-ahead "
        "target). Readers are the tokens of the domain's eval split that read the slot at the evaluation right "
        f"after the experience (weight g·w). Recorded during the run: the {bounds.get('top_slots', '?')} top "
        f"slots per layer and experience, {bounds.get('examples', '?')} examples each; shown: "
        f"{SHOWN_SLOTS} slots, {SHOWN_EXAMPLES} examples.")]
    for entry in rec.slots["experiences"]:
        label = f"{entry['experience']} {entry['domain']}"
        if entry.get("partial"):
            blocks.append(Paragraph(f"Experience {label} was recorded from a resume on: counts and examples cover "
                                    "only the part streamed after it.", note=True))
        for layer, slots in entry["layers"].items():
            rows = []
            for s in slots[:SHOWN_SLOTS]:
                writers = "; ".join(render_example(rec, ex) for ex in s["writers"][:SHOWN_EXAMPLES])
                readers = "; ".join(render_example(rec, ex) for ex in s["readers"][:SHOWN_EXAMPLES]) or "–"
                rows.append([str(s["slot"]), str(s["writes"]), str(s["reads"]), writers, readers])
            blocks.append(Table(f"{prefix}-slots-{entry['experience']}-{slug(layer)}",
                                ["slot", "writes", "reads", "strongest writers", "strongest readers"], rows,
                                f"experience {label}, {layer}"))
    owned = ownership(rec)
    if owned:
        blocks.append(Paragraph(
            "Which slots each domain owns and how many survive: a domain owns the fewest most-read slots that "
            "serve half of its reads at the evaluation right after its experience; a slot survives while no "
            "later experience writes into it."))
        for layer, rows in owned.items():
            later = max((len(r["survive"]) for r in rows), default=0)
            cols = ["experience", "owned slots", *[f"left after +{i}" for i in range(1, later + 1)]]
            table = [[f"{r['experience']} {r['domain']}", str(r["owned"]),
                      *[_share(v, r["owned"]) for v in r["survive"]], *["–"] * (later - len(r["survive"]))]
                     for r in rows]
            blocks.append(Table(f"{prefix}-owned-{slug(layer)}", cols, table, f"{layer}: owned slots and survivors"))
    return Section(f"{prefix}-slots", "What the slots hold", blocks, level=3)


def gate_section(rec: InspectRecord, prefix: str) -> Section | None:
    domains = rec.gate_domains
    if not domains:
        return None
    stats = gate_by_class(rec)
    blocks: list = [Paragraph(
        "The FwPKM gate g of each token (o = g·v̂ + (1 − g)·v: how much of the layer's output comes from the "
        "memory) over the first tokens of every domain's eval split at the last evaluation, by token class "
        "(a token can be in several). Intervals: 95 % bootstrap over documents. The paper's reading: the gate "
        "opens for rare entities and proper names, while the slow weights carry general patterns.")]
    for layer, by_class in stats.items():
        rows = [[name, CLASS_NOTES[name], str(v["n"]), num(v["mean"]), f"[{num(v['low'])}, {num(v['high'])}]"]
                for name in CLASSES if (v := by_class.get(name))]
        blocks.append(Table(f"{prefix}-gate-{slug(layer)}", ["class", "definition", "tokens", "mean gate", "95 % interval"],
                            rows, f"{layer}: mean gate by token class"))
    for domain in domains:
        ids = rec.gates[f"{domain}_ids"][:SAMPLE_TOKENS]
        for layer in rec.gate_layers(domain):
            gates = rec.gates[f"{domain}_{layer}"][:SAMPLE_TOKENS].astype(float)
            if not len(gates):
                continue
            top = float(gates.max()) or 1.0
            mark = float(sorted(gates)[int(0.9 * (len(gates) - 1))])
            pieces = [(rec.text(i), float(g)) for i, g in zip(ids.tolist(), gates.tolist())]
            blocks.append(Highlight(pieces, f"{domain}, {layer}: the first {len(pieces)} eval tokens shaded by the "
                                    f"gate (darkest = {top:.3f}; bold in Markdown: the top tenth, ≥ {mark:.3f})",
                                    mark=mark, scale=top))
    return Section(f"{prefix}-gate", "When the gate opens", blocks, level=3)


def _share(value: int, total: int) -> str:
    return f"{value} ({100 * value / total:.0f} %)" if total else str(value)
