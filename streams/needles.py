"""Needle in a haystack on real text (the FwPKM paper's protocol, issue 8): a stretch of a shipped
corpus with `needles` sentences "The secret number for ID-xxxx is dddddd." inserted at given
depths, then a question about one of them, answered by exact match of the number.

    cfg = NeedleConfig(haystack_tokens=1024, needles=5)
    ep = make_episode(cfg, tokenizer, source_tokens, rng, depths=cfg.depths)
    ep.haystack            # list[int]: the text with the needles in it
    ep.question, ep.answer # list[int]: "... The secret number for ID-xxxx is" and " dddddd"

Everything is token lists: the haystack is exactly `haystack_tokens` long, a window of a split's
packed tokens (documents joined by <eot>, as the model reads them) with the needles inserted, each
between two tokens of the window at round(depth · window length), and the needle's number is encoded exactly as the answer is (the
same token ids), so that exact match asks for the tokens the needle holds. The question restates
the needle's opening words, so the tokens that precede the answer are the tokens that preceded
the number in the needle.

**Any needle** (style `secret`): `template` is the sentence, any "... {id} ... is {number}." with
the number last (the paper's "The secret number for ID-{id} is {number}." by default);
`id_alphabet` "digits" (1000–9999 at `id_length` 4, as before the field) or "hex" (the paper's 4
hex characters); `number_digits` the number's length. The question is the paper's for any
template: "What is <the sentence up to ' is', first letter lowered>? <the sentence up to the number>".
A base pretrained with the retrieval knob's `form: secret` has read the paper's sentence: test it
on another template and other text, so that what is measured is retrieval, not the template.

`style: fact` swaps the needle for the retrieval knob's own kind of sentence (streams/retrieval.py:
" Zorostbar Rentha's locker number is 1677.", an invented name and a 4-digit number) and the
question for the needle restated up to its number, as the knob's episodes recall a fact: the task a
base pretrained with the knob was trained on, on held-out text, where "secret" asks whether the
skill carries over to a sentence it never saw.

`style: word` is a diagnostic beside them: the knob's facts whose value is a word of a closed set
(" Zorostbar Rentha's lucky stone is opal.": a colour, town or stone, 8 of each, distinct over the
episode's needles). A 4-digit number is 3–4 tokens drawn from thousands of values, and exact match
needs every one (experiments/LOG.md, stop 45); a word is 2–4 tokens too with the shipped
tokenizer, but its first token names it among its 8 (except " o": ochre, olive, opal), so the
memory is asked for one choice. A model that knows the closed set is right by chance 1 time in 8.

`form: name_last` says the fact and word needles as the knob's `form: name_last` says its facts
(" The lucky stone of Zorostbar Rentha is opal.": the name right before the value), with the same
draws; the question restates the needle up to its value, as before. The secret needle already
has its ID right before "is", and refuses the field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from streams.retrieval import ATTRIBUTES, FORMS, NEEDLE, VALUES, invented_name, subject

PAPER_TEMPLATE = NEEDLE + " {number}."  # "The secret number for ID-{id} is {number}."
ALPHABETS = {"digits": "0123456789", "hex": "0123456789abcdef"}  # the paper's IDs are 4 hex characters
STYLES = ("secret", "fact", "word")
WORD_VALUES = sum(map(len, VALUES.values()))  # distinct answers style "word" can draw


@dataclass(frozen=True)
class NeedleConfig:
    haystack_tokens: int = 1024  # tokens of corpus text, before the needles go in
    needles: int = 5
    # Where the needles go, as fractions of the haystack (0 = its start, 1 = its end). The
    # default keeps every needle more than 200 tokens before the question (beyond a 128-token
    # attention window) for a 1,024-token haystack.
    depths: tuple[float, ...] = (0.05, 0.2, 0.35, 0.5, 0.65)
    style: str = "secret"  # "secret": the paper's needle; "fact", "word": the retrieval knob's facts (module doc)
    form: str = "name_first"  # fact and word needles: the name first or right before the value (module doc)
    # Style "secret" (module doc, "Any needle"): the sentence, its IDs and its numbers.
    template: str = PAPER_TEMPLATE  # "... {id} is {number}." with the number last
    id_alphabet: str = "digits"  # "digits" (no leading 0, as 1000-9999) or "hex" (any of 16^length)
    id_length: int = 4
    number_digits: int = 6  # the numbers are drawn from [10^(digits-1), 10^digits)

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"needles.style must be one of {list(STYLES)}, got {self.style!r}")
        if self.form not in FORMS:
            raise ValueError(f"needles.form must be one of {list(FORMS)}, got {self.form!r}")
        if self.style == "secret" and self.form != "name_first":
            raise ValueError("needles.form applies to styles 'fact' and 'word'; the secret needle has its ID right "
                             "before 'is' already")
        check_template(self.template)
        if self.style != "secret" and (self.template, self.id_alphabet, self.id_length, self.number_digits) != \
                (PAPER_TEMPLATE, "digits", 4, 6):
            raise ValueError("needles.template, id_alphabet, id_length and number_digits apply to style 'secret'")
        if self.id_alphabet not in ALPHABETS:
            raise ValueError(f"needles.id_alphabet must be one of {list(ALPHABETS)}, got {self.id_alphabet!r}")
        for name in ("haystack_tokens", "needles", "id_length", "number_digits"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"needles.{name} must be a positive int, got {value!r}")
        object.__setattr__(self, "depths", tuple(self.depths))
        check_depths(self.depths, "needles.depths")
        if len(self.depths) != self.needles:
            raise ValueError(f"needles.depths has {len(self.depths)} entries for needles={self.needles}")
        if self.haystack_tokens < 20 * self.needles:
            raise ValueError(f"needles.haystack_tokens ({self.haystack_tokens}) is shorter than its {self.needles} "
                             f"needles (~16 tokens each) need: at least {20 * self.needles}")
        if self.style == "secret" and self.needles > id_count(self.id_alphabet, self.id_length):
            raise ValueError(f"needles.needles ({self.needles}) is more than the {id_count(self.id_alphabet, self.id_length)} "
                             f"distinct IDs of {self.id_length} {self.id_alphabet} characters")
        if self.style == "word" and self.needles > WORD_VALUES:
            raise ValueError(f"needles.needles ({self.needles}) is more than the {WORD_VALUES} distinct word values "
                             f"style 'word' has")


def check_template(template: str) -> None:
    """A secret needle's sentence: `{id}` once, then `{number}` once, last but for punctuation,
    after " is" (so that the question can ask "What is ...?" and restate the needle up to the number)."""
    if not isinstance(template, str) or template.count("{id}") != 1 or template.count("{number}") != 1:
        raise ValueError(f"needles.template must hold {{id}} once and {{number}} once, got {template!r}")
    opening, tail = template.split("{number}")
    if "{id}" not in opening or not opening.endswith(" is ") or tail.strip(".!;") != "":
        raise ValueError(f"needles.template must read '... {{id}} ... is {{number}}.' (the number last, after "
                         f"' is '), got {template!r}")


def id_count(alphabet: str, length: int) -> int:
    base = len(ALPHABETS[alphabet])
    return base ** length - (base ** (length - 1) if alphabet == "digits" else 0)


def draw_ids(cfg: NeedleConfig, rng: np.random.Generator) -> list[str]:
    """cfg.needles distinct IDs: decimal without a leading 0 (1000-9999 at length 4), or hex."""
    if cfg.id_alphabet == "digits":
        low = 10 ** (cfg.id_length - 1)
        return [str(x) for x in rng.choice(np.arange(low, 10 * low), size=cfg.needles, replace=False)]
    return [format(int(x), f"0{cfg.id_length}x") for x in rng.choice(16 ** cfg.id_length, size=cfg.needles, replace=False)]


def question_text(template: str, id_: str) -> str:
    """The paper's question for any template: "What is <the needle up to ' is', first letter
    lowered>? <the needle up to its number>" ("What is the secret number for ID-xxxx? The secret
    number for ID-xxxx is")."""
    opening = template.split("{number}")[0].rstrip().replace("{id}", id_)
    asked = opening[:-len(" is")]
    return f"What is {asked[:1].lower()}{asked[1:]}? {opening}"


def check_depths(depths: Sequence[float], where: str) -> None:
    bad = [d for d in depths if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1]
    if bad:
        raise ValueError(f"{where}: depth {bad[0]!r} is outside [0, 1] (0 = the haystack's start, 1 = its end)")


@dataclass
class Episode:
    haystack: list[int]  # the corpus window with the needles inserted
    question: list[int]  # read after the haystack
    answer: list[int]  # the asked needle's number, as the needle holds it
    ids: list[str]  # every needle's ID, in depth order
    numbers: list[str]
    asked: int  # index of the asked needle
    needle_spans: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each needle in haystack
    candidates: list[list[int]] = field(default_factory=list)  # every needle's number as an answer (answer = [asked])
    answer_starts: list[int] = field(default_factory=list)  # where each needle's number begins in haystack

    def attribute_count(self) -> int:
        """How many needles have the asked needle's attribute, itself included (a fact's words
        besides the name; every secret needle has the same one). A model that recalls the
        episode's values of that attribute but not which name holds which is right 1 time in this."""
        def attribute(id_: str) -> str:
            return id_.split("'s ", 1)[1] if "'s " in id_ else "secret number"

        return sum(attribute(i) == attribute(self.ids[self.asked]) for i in self.ids)

    def attribute_shared(self) -> bool:
        """Whether another needle has the asked needle's attribute: then only the name or ID tells
        the asked needle apart."""
        return self.attribute_count() > 1

    def distance(self) -> int:
        """Tokens between the end of the asked needle and the end of the question."""
        return len(self.haystack) - self.needle_spans[self.asked][1] + len(self.question)


def make_episode(cfg: NeedleConfig, tokenizer, source: np.ndarray, rng: np.random.Generator,
                 depths: Sequence[float] | None = None, asked: int | None = None) -> Episode:
    """One haystack from a random window of `source` (1-D token ids) with `cfg.needles` needles
    at `depths` (default cfg.depths; sorted), distinct IDs and numbers (`cfg.id_alphabet`,
    `id_length`, `number_digits`), and a question about needle `asked` (default: drawn)."""
    depths = sorted(cfg.depths if depths is None else depths)
    check_depths(depths, "needle depths")
    if len(depths) != cfg.needles:
        raise ValueError(f"needle depths: {len(depths)} given for {cfg.needles} needles")
    if cfg.haystack_tokens > len(source):
        raise ValueError(f"the haystack source has {len(source):,} tokens, fewer than needles.haystack_tokens = "
                         f"{cfg.haystack_tokens:,}")
    if cfg.style == "secret":
        ids = draw_ids(cfg, rng)
        low = 10 ** (cfg.number_digits - 1)
        numbers = [str(int(x)) for x in rng.integers(low, 10 * low, size=cfg.needles)]
    elif cfg.style == "fact":  # ids are the facts' subjects ("Zorostbar Rentha's locker number"), numbers distinct
        ids = fact_subjects(rng, cfg.needles)
        numbers = [str(x) for x in rng.choice(np.arange(1000, 10000), size=cfg.needles, replace=False)]
    else:  # "word": the "numbers" are the facts' word values
        ids, numbers = word_facts(rng, cfg.needles)
    asked = int(rng.integers(0, cfg.needles)) if asked is None else asked
    if not 0 <= asked < cfg.needles:
        raise ValueError(f"asked needle {asked} does not exist (needles: {cfg.needles})")
    needles = [needle_tokens(tokenizer, id_, number, cfg.style, cfg.form, cfg.template) for id_, number in zip(ids, numbers)]
    n = cfg.haystack_tokens - sum(map(len, needles))  # corpus tokens, so the haystack is haystack_tokens long
    start = int(rng.integers(0, len(source) - n + 1))
    text = [int(t) for t in source[start:start + n]]
    haystack: list[int] = []
    spans, starts = [], []
    tail = len(tokenizer.encode(ending(cfg.template, cfg.style)))  # the needle's tokens after its number
    cut_prev = 0
    for depth, needle, number in zip(depths, needles, numbers):
        cut = round(depth * n)
        haystack += text[cut_prev:cut]
        spans.append((len(haystack), len(haystack) + len(needle)))
        starts.append(len(haystack) + len(needle) - tail - len(answer_tokens(tokenizer, number)))
        haystack += needle
        cut_prev = cut
    haystack += text[cut_prev:]
    # The paper's question asks, then restates; a fact is recalled by restating it, as in the knob.
    asking = (" " + question_text(cfg.template, ids[asked]) if cfg.style == "secret"
              else opening(ids[asked], cfg.style, cfg.form))
    question = tokenizer.encode(asking)
    candidates = [answer_tokens(tokenizer, number) for number in numbers]
    return Episode(haystack, question, candidates[asked], ids, numbers, asked, spans, candidates, starts)


def answer_tokens(tokenizer, number: str) -> list[int]:
    return tokenizer.encode(" " + number)


def opening(id_: str, style: str = "secret", form: str = "name_first", template: str = PAPER_TEMPLATE) -> str:
    """The needle's words before its number. A fact's ID is its subject said name first
    ("<name>'s <attribute>", as fact_subjects and word_facts make it), said again in `form`."""
    if style == "secret":
        return " " + template.split("{number}")[0].rstrip().replace("{id}", id_)
    name, attribute = id_.split("'s ", 1)
    return f" {subject(name, attribute, form)} is"


def ending(template: str, style: str) -> str:
    """What follows the number: the template's punctuation ("." for the knob's facts)."""
    return template.split("{number}")[1] if style == "secret" else "."


def needle_tokens(tokenizer, id_: str, number: str, style: str = "secret", form: str = "name_first",
                  template: str = PAPER_TEMPLATE) -> list[int]:
    """" The secret number for ID-xxxx is dddddd." (or the template's sentence, or " <name>'s
    <attribute> is dddd.", or in `form` name_last " The <attribute> of <name> is dddd.") with the
    number encoded as the answer is."""
    return (tokenizer.encode(opening(id_, style, form, template)) + answer_tokens(tokenizer, number)
            + tokenizer.encode(ending(template, style)))


def fact_subjects(rng: np.random.Generator, n: int) -> list[str]:
    """n distinct "<First> <Last>'s <attribute>" with a numeric attribute, from the retrieval knob's
    syllables and attributes (the same kind of name, new draws)."""
    numeric = [a for a, kind in ATTRIBUTES if kind == "number"]
    out: list[str] = []
    while len(out) < n:
        subject = f"{invented_name(rng)}'s {numeric[int(rng.integers(len(numeric)))]}"
        if subject not in out:
            out.append(subject)
    return out


def word_facts(rng: np.random.Generator, n: int) -> tuple[list[str], list[str]]:
    """n distinct "<First> <Last>'s <attribute>" with a word-valued attribute (a colour, town or
    stone) and their values, no value twice, so that the candidates differ."""
    worded = [(a, kind) for a, kind in ATTRIBUTES if kind != "number"]
    subjects: list[str] = []
    values: list[str] = []
    while len(subjects) < n:
        attribute, kind = worded[int(rng.integers(len(worded)))]
        subject = f"{invented_name(rng)}'s {attribute}"
        free = [v for v in VALUES[kind] if v not in values]
        if free and subject not in subjects:
            subjects.append(subject)
            values.append(str(free[int(rng.integers(len(free)))]))
    return subjects, values
