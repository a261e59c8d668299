"""The one error type of the data layer: bad input, reported before any training starts."""
from __future__ import annotations


class StreamDataError(ValueError):
    """A domain's data cannot be used; the message names the domain and, where known, file and line.

    `domain`, `file` and `line` are kept as attributes so that tests and callers can check them
    without parsing the message.
    """

    def __init__(self, domain: str, message: str, file: str | None = None, line: int | None = None):
        self.domain = domain
        self.file = file
        self.line = line
        where = ""
        if file is not None:
            where = f" ({file}" + (f", line {line}" if line is not None else "") + ")"
        super().__init__(f"domain '{domain}'{where}: {message}")
