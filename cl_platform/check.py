"""The one validation idiom of every config dataclass (`check(...)` in `__post_init__`), and the
one YAML reader of run and stream configs (`read_yaml`).

    @dataclass
    class FwPKMConfig:
        topk: int = 8
        def __post_init__(self):
            check(isinstance(self.topk, int) and self.topk >= 1, self, "topk", "must be a positive int")

A failed check raises `ConfigError` naming the class and field (`FwPKMConfig.topk=0: must be a
positive int`). The configuration loader (`cl_platform.config`) builds the tree section by section
and re-raises with the dotted path a user wrote (`run config field 'model.fwpkm.topk': 0 must be a
positive int`), so the same check serves Python users and YAML / command-line users.
"""

from __future__ import annotations

import dataclasses
import difflib

import math
from pathlib import Path
from typing import Any, Sequence

import yaml


class ConfigError(ValueError):
    """A configuration value is invalid. `field` is its name in the owning dataclass (or its dotted
    path once the loader knows where it sits); `value` and `why` say what is wrong."""

    def __init__(self, message: str, *, field: str | None = None, value: Any = None, why: str | None = None,
                 owner: str | None = None):
        super().__init__(message)
        self.field, self.value, self.why, self.owner = field, value, why, owner

    def at(self, path: str) -> "ConfigError":
        """The same error, reported at dotted path `path` + '.' + field."""
        if self.field is None or self.why is None:
            where = ".".join(p for p in (path, self.field) if p)
            return ConfigError(f"run config field '{where}': {self}", field=where)
        where = f"{path}.{self.field}" if path else self.field
        return ConfigError(f"run config field '{where}': {self.value!r} {self.why}", field=where,
                           value=self.value, why=self.why)


def check(ok: bool, owner: Any, field: str, why: str) -> None:
    """Raise `ConfigError` for `owner.field` unless `ok`."""
    if not ok:
        value = getattr(owner, field)
        name = type(owner).__name__
        raise ConfigError(f"{name}.{field}={value!r}: {why}", field=field, value=value, why=why, owner=name)


def check_writable(folder: str | Path, field: str, owner: str = "run config") -> None:
    """`folder` exists and takes new files, or can be made (its nearest existing parent does): a
    runs root on a read-only or unmounted share is named before an hour of pretraining, not after.
    Probed by creating and removing a file, which permission bits alone do not tell (root, a
    read-only file system, a full quota)."""
    import tempfile

    path = Path(folder).expanduser().absolute()
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{owner} field '{field}': {folder} cannot be a folder: {parent} is a file", field=field)
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as err:
        raise ConfigError(f"{owner} field '{field}': {folder} is not writable here "
                          f"({err.strerror or type(err).__name__}: {parent})", field=field) from None


def is_int(value: Any, low: int | None = None) -> bool:
    """An int (not a bool) that is ≥ `low` when given."""
    return isinstance(value, int) and not isinstance(value, bool) and (low is None or value >= low)


def is_number(value: Any, low: float | None = None, strict: bool = False) -> bool:
    """A finite int or float (not a bool), ≥ `low` (> with `strict`) when given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return low is None or (value > low if strict else value >= low)


def check_keys(cls: type, data: Any, where: str) -> None:
    """A YAML mapping destined for dataclass `cls` is a mapping and uses only its field names
    (for configs built by hand rather than through `cl_platform.config`: the stream files)."""
    from dataclasses import fields

    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}", field=where)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        near = [m for key in unknown for m in difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.5)]
        hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
        raise ConfigError(f"{where}: unknown key(s) {unknown}{hint} Expected some of {sorted(known)}", field=where)


def from_mapping(cls: type, data: Any, where: str, whole_file: bool = False) -> Any:
    """Dataclass `cls` from a flat YAML mapping, its keys checked first. `whole_file`: `data` is
    a whole file's and `where` names it, so a bad value's error names the file too."""
    check_keys(cls, data, where)
    if not whole_file:
        return cls(**data)
    try:
        return cls(**data)
    except ValueError as err:  # ConfigError, or a nested loader's own ValueError
        raise ConfigError(f"{where}: {err}", field=getattr(err, "field", None)) from None


def yaml_problem(err: Exception) -> str:
    """A YAML parser error in one line: what is wrong and where ("expected ..., line 3, column 7")."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """The one YAML reader (run and stream configs): a mapping, or an error naming the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({yaml_problem(err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a {what} must be a mapping of fields, got {type(data).__name__}")
    return data


def split_overrides(overrides: Sequence[str], cls: type) -> tuple[list[str], list[str]]:
    """(`key=value` overrides of dataclass `cls`'s fields, the rest): a comparison's or a sweep's
    own fields, and the run-config overrides its members all get (`runs_root=DIR`). A key's first
    dotted step decides; a name both have (`name`) is the file's."""
    own = {f.name for f in dataclasses.fields(cls)}
    # An item without '=' stays the file's, whose loader names it (expected key=value).
    mine = [o for o in overrides if "=" not in str(o) or str(o).partition("=")[0].split(".", 1)[0] in own]
    return mine, [o for o in overrides if o not in mine]


def apply_overrides(data: dict[str, Any], overrides: Sequence[str], what: str) -> dict[str, Any]:
    """`key=value` command-line overrides into a config file's mapping, before it is typed and
    checked (so a bad value is refused by the same checks as in the file). `key` is a dotted path;
    a path step may itself hold dots where the mapping has such a key (a sweep's
    `space.cl.fwpkm.chunk.choices=[64,128]`: the longest existing key wins). The value is YAML."""
    for item in overrides:
        key, sep, text = str(item).partition("=")
        if not sep or not key:
            raise ConfigError(f"command-line override {item!r}: expected key=value, key a dotted field path of the {what}")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"command line: {key}: value {text!r} is not valid YAML ({yaml_problem(err)})") from None
        node, rest, where = data, key, []
        while True:
            step = max((k for k in node if isinstance(k, str) and (rest == k or rest.startswith(k + "."))),
                       key=len, default=rest.split(".", 1)[0])
            where.append(step)
            rest = rest[len(step) + 1:]
            if not rest:
                node[step] = value
                break
            child = node.setdefault(step, {})
            if not isinstance(child, dict):
                raise ConfigError(f"command line: {key}: {'.'.join(where)} is a value, not a section of the {what}")
            node = child
    return data
