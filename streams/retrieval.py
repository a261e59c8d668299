"""Retrieval episodes in the pretraining text: a knob that teaches the memory to recall (issue 22).

    retrieval: {fraction: 0.1, facts: 4, min_distance: 256}      # in a stream YAML

A base pretrained on ordinary prose has little reason to carry anything across thousands of
tokens: most next tokens are predictable from the last hundred. This knob makes a fraction of
each domain's *pretraining* segments into episodes where something said early must be recalled
late, beside the text: `facts` sentences about invented names (" Zorostbar Rentha's locker
number is 1677.") are inserted into the first half of the segment, and each one is said again, word for
word, at least `min_distance` tokens later (beyond the attention window), where only a memory
can supply its value. The loss is the ordinary next-token loss over the whole segment; nothing
marks the episode. Eval, dev and adapt splits never get episodes, so every score stays on real
text; the pretraining data fingerprint (and with it the base key) covers the change, and
`fraction: 0` (the default) leaves the segments untouched.

By default the facts use their own template and names, not the NIAH needles' ("The secret number
for ID-xxxx is"), so that NIAH measures whether the skill carries over to a sentence never trained on;
NIAH's `needles.style: fact` asks the trained kind of fact instead (new names, held-out text).

`form: name_last` says the same fact with its key right before the value (" The locker number of
Zorostbar Rentha is 1677.", as the paper's needle "The secret number for ID-xxxx is"); the default
`name_first` puts the name 4–6 tokens before it and the attribute right before. The draws are the
same in both forms (only the sentence's words move), so two bases that differ in `form` read the
same names, values and places.

`form: secret` says the paper's needle itself (" The secret number for ID-4821 is 735219.": a
distinct 4-digit ID per fact, a 6-digit number, the draws of `clp niah`'s secret needles): every
fact has the one attribute, so only the ID tells them apart (`attributes` does not apply). NIAH's
secret needles then ask the trained task on held-out text, as `needles.style: fact` does for the
other forms; the deviation from the paper (whose base never saw the template) is the point: it
asks whether the memory can learn retrieval by a key at this scale at all (experiments/LOG.md).

`form: keyed` is the retrieval mix of issue 53: each episode draws a noun (" access code"), a key
prefix ("#", "user ", none), an alphabet (decimal or hex) and a key length (3–5), and its facts
are " The access code for #3fa0 is 48213." with distinct keys and numbers of 3–7 digits, so that
only the key tells them apart, as in the paper's needles; each fact's second mention is the
question and its answer (" What is the access code for #3fa0? The access code for #3fa0 is
48213."), as NIAH asks. Never the NIAH needle's noun or "ID-" prefix: NIAH's default needle is a
held-out sentence of the trained shape.

`attributes: k` (k ≥ 1) makes each episode draw k of the six attributes and its facts use only
those, with no value twice in the episode: with k = 1 every fact of an episode has the same
attribute ("... 's home town is ..."), so only the name tells them apart. With the default (0)
each fact draws its own attribute, and an attribute alone often identifies a fact: a memory keyed
by the words just before the value can recall it without the name (experiments/LOG.md, stop 46).

Rule (deterministic from the stream seed and the domain name): rows chosen with
`numpy.random.default_rng([seed, crc32(domain), 1])`; per row, facts drawn from the same
generator; a fact's first mention at a random token boundary of the segment's first half, its
recall at a random boundary at least `min_distance` tokens after the first mention's end; the
inserted tokens take the document index of the token before them; the row is then cut back to
its length (the text at its end is what makes room).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Invented names (two syllables each, capitalised) and attributes with their kind of value.
SYLLABLES = ("ka", "vo", "del", "sur", "im", "ren", "tha", "mor", "qui", "lis", "bar", "nek", "ost", "ul", "fen",
             "dra", "pel", "zor", "wyn", "ga")
ATTRIBUTES = (("locker number", "number"), ("favourite colour", "colour"), ("home town", "town"),
              ("pass code", "number"), ("lucky stone", "stone"), ("room number", "number"))
VALUES = {
    "colour": ("amber", "teal", "crimson", "violet", "ochre", "indigo", "scarlet", "olive"),
    "town": ("Harlow", "Tamsin", "Brecon", "Alnwick", "Ludlow", "Whitby", "Penrith", "Thirsk"),
    "stone": ("jasper", "onyx", "garnet", "opal", "agate", "beryl", "topaz", "quartz"),
}
FORMS = ("name_first", "name_last")  # where the name stands: "X's <attribute> is", "The <attribute> of X is"
KNOB_FORMS = FORMS + ("secret", "keyed")  # the knob can also say the paper's needle, or keyed facts (module doc)
# Form "keyed": the things a key opens and how keys are written. Never the NIAH needle's own
# ("secret number", "ID-"): NIAH then asks a sentence of the trained shape that was never trained on.
KEYED_NOUNS = ("access code", "locker number", "room number", "ticket number", "serial number", "account number",
               "pin", "order number", "booking code", "badge number")
KEYED_PREFIXES = ("", "#", "key ", "user ", "item ", "unit ")
KEYED_ALPHABETS = ("0123456789", "0123456789abcdef")
NEEDLE = "The secret number for ID-{id} is"  # the paper's needle up to its number (streams/needles.py)


@dataclass(frozen=True)
class RetrievalConfig:
    fraction: float = 0.0  # of each domain's pretraining segments made into episodes
    facts: int = 4  # facts per episode, each said twice
    min_distance: int = 256  # tokens from the end of a fact's first mention to its recall
    attributes: int = 0  # attributes an episode's facts share (0: each fact draws its own; module doc)
    form: str = "name_first"  # one of KNOB_FORMS: the name before the attribute, right before the value, or an ID

    def __post_init__(self) -> None:
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) or not 0 <= self.fraction <= 1:
            raise ValueError(f"retrieval.fraction must be a number in [0, 1], got {self.fraction!r}")
        for name in ("facts", "min_distance"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"retrieval.{name} must be a positive int, got {value!r}")
        a = self.attributes
        if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a <= len(ATTRIBUTES):
            raise ValueError(f"retrieval.attributes must be an int in [0, {len(ATTRIBUTES)}], got {a!r}")
        if self.form not in KNOB_FORMS:
            raise ValueError(f"retrieval.form must be one of {list(KNOB_FORMS)}, got {self.form!r}")
        if self.form in ("secret", "keyed") and a:
            raise ValueError(f"retrieval.attributes does not apply to form {self.form!r}: every fact of an episode has "
                             "the one attribute, and only its ID tells it apart")
        smallest = min(map(len, VALUES.values()))
        if a and self.facts > smallest:
            raise ValueError(f"retrieval.facts ({self.facts}) with attributes: an episode's values are distinct, and a "
                             f"word attribute has {smallest}: at most {smallest} facts")

    @property
    def active(self) -> bool:
        return self.fraction > 0


def invented_name(rng: np.random.Generator) -> str:
    """ "Zorostbar Rentha": three syllables and two, capitalised (two draws from `rng`)."""
    first = "".join(rng.choice(SYLLABLES, size=3)).capitalize()
    last = "".join(rng.choice(SYLLABLES, size=2)).capitalize()
    return f"{first} {last}"


def subject(name: str, attribute: str, form: str = "name_first") -> str:
    """What a fact is about, in its sentence's words: "Zorostbar Rentha's locker number" or, with
    `form="name_last"`, "The locker number of Zorostbar Rentha"."""
    return f"{name}'s {attribute}" if form == "name_first" else f"The {attribute} of {name}"


def fact_sentence(rng: np.random.Generator, attributes: Sequence[tuple[str, str]] = ATTRIBUTES,
                  taken: Sequence[str] = (), form: str = "name_first") -> tuple[str, str]:
    """(" Zorostbar Rentha's locker number is 1677.", "1677"): an attribute of `attributes`, a value
    not in `taken` (drawn again until it is not), said in `form` (the same draws in every form)."""
    name = invented_name(rng)
    attribute, kind = attributes[int(rng.integers(len(attributes)))]
    while True:
        value = str(int(rng.integers(1000, 10000))) if kind == "number" else str(rng.choice(VALUES[kind]))
        if value not in taken:
            return f" {subject(name, attribute, form)} is {value}.", value


def episode_facts(rng: np.random.Generator, cfg: RetrievalConfig) -> list[str]:
    """One episode's `cfg.facts` sentences. With `cfg.attributes`, first draw that many attributes,
    and keep the episode's values distinct; without, each fact is drawn alone (as before the field
    existed: the same draws, so the knob bases' pretraining tokens are unchanged). Form "secret":
    distinct 4-digit IDs and 6-digit numbers, as NIAH's secret needles draw them."""
    if cfg.form == "secret":
        ids = rng.choice(np.arange(1000, 10000), size=cfg.facts, replace=False)
        numbers = rng.integers(100000, 1000000, size=cfg.facts)
        return [f" {NEEDLE.format(id=int(i))} {int(n)}." for i, n in zip(ids, numbers)]
    if not cfg.attributes:
        return [fact_sentence(rng, form=cfg.form)[0] for _ in range(cfg.facts)]
    chosen = [ATTRIBUTES[i] for i in rng.choice(len(ATTRIBUTES), size=cfg.attributes, replace=False)]
    sentences: list[str] = []
    values: list[str] = []
    for _ in range(cfg.facts):
        sentence, value = fact_sentence(rng, chosen, values, cfg.form)
        sentences.append(sentence)
        values.append(value)
    return sentences


def keyed_facts(rng: np.random.Generator, n: int) -> list[tuple[str, str]]:
    """n facts of one episode in form "keyed" (module doc): (first mention, second mention)."""
    noun = KEYED_NOUNS[int(rng.integers(len(KEYED_NOUNS)))]
    prefix = KEYED_PREFIXES[int(rng.integers(len(KEYED_PREFIXES)))]
    alphabet = KEYED_ALPHABETS[int(rng.integers(len(KEYED_ALPHABETS)))]
    length = int(rng.integers(3, 6))
    keys: list[str] = []
    while len(keys) < n:  # distinct keys: only the key tells an episode's facts apart
        key = "".join(rng.choice(list(alphabet), size=length))
        if key not in keys:
            keys.append(key)
    out = []
    for key in keys:
        digits = int(rng.integers(3, 8))
        number = str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))
        said = f"The {noun} for {prefix}{key} is"
        out.append((f" {said} {number}.", f" What is the {noun} for {prefix}{key}? {said} {number}."))
    return out


def episode_mentions(rng: np.random.Generator, cfg: RetrievalConfig) -> list[tuple[str, str]]:
    """One episode's facts as (first mention, second mention): the same sentence twice, but in form
    "keyed", whose second mention asks for the value first."""
    if cfg.form == "keyed":
        return keyed_facts(rng, cfg.facts)
    return [(f, f) for f in episode_facts(rng, cfg)]


def insert_episodes(tokens: np.ndarray, doc_index: np.ndarray, cfg: RetrievalConfig, tokenizer, seed: int,
                    domain: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Episodes in `round(fraction · S)` of the (S, T+1) rows; returns (tokens, doc_index, rows
    changed). Rows too short for the episode (first half + distance) are refused."""
    S, width = tokens.shape
    n_rows = int(round(cfg.fraction * S))
    if n_rows == 0:
        return tokens, doc_index, np.empty(0, dtype=np.int64)
    rng = np.random.default_rng([seed, zlib.crc32(domain.encode("utf-8")), 1])
    rows = np.sort(rng.choice(S, size=n_rows, replace=False))
    tokens, doc_index = tokens.copy(), doc_index.copy()
    half = width // 2
    for row in rows:
        mentions = episode_mentions(rng, cfg)
        facts = [tokenizer.encode(first) for first, _ in mentions]
        again = [tokenizer.encode(second) for _, second in mentions]
        span, both = sum(map(len, facts)), sum(map(len, facts)) + sum(map(len, again))
        if half + cfg.min_distance + both > width:
            raise ValueError(f"retrieval: {cfg.facts} facts ({span} tokens) with min_distance {cfg.min_distance} do not fit "
                             f"in a {width - 1}-token segment; use fewer facts or a shorter distance")
        # Insertion points in the original row (the boundary before token p); first mentions in
        # the first half, recalls after all of them by min_distance + the facts inserted between.
        firsts = np.sort(rng.integers(1, half - span, size=cfg.facts))
        inserts = [(int(p), fact) for p, fact in zip(firsts, facts)]
        order = rng.permutation(cfg.facts)  # recalled in another order than said
        # Every recall ends before the cut: at most `both` tokens are inserted up to it.
        recalls = np.sort(rng.integers(int(firsts[-1]) + cfg.min_distance, width - both + 1, size=cfg.facts))
        inserts += [(int(p), again[i]) for p, i in zip(recalls, order)]
        inserts.sort(key=lambda item: item[0])
        new_tokens: list[int] = []
        new_docs: list[int] = []
        prev = 0
        for p, fact in inserts:
            new_tokens += tokens[row, prev:p].tolist() + fact
            new_docs += doc_index[row, prev:p].tolist() + [int(doc_index[row, p - 1])] * len(fact)
            prev = p
        new_tokens += tokens[row, prev:].tolist()
        new_docs += doc_index[row, prev:].tolist()
        tokens[row] = new_tokens[:width]
        doc_index[row] = new_docs[:width]
    return tokens, doc_index, rows
