"""What reading YAML a person wrote can raise besides `yaml.YAMLError`.

PyYAML builds an integer of more than 4,300 digits with `int()`, which raises Python's
ValueError (its limit on converting long strings), and brackets nested a few hundred deep
exhaust the recursion of its constructor (RecursionError). Both are bad input, reported like
a syntax error: escaping, they failed a push's delivery and hid its other files.
"""

from __future__ import annotations

import yaml

UNREADABLE_YAML: tuple[type[Exception], ...] = (yaml.YAMLError, ValueError, RecursionError)


def where(exc: Exception) -> str:
    """' at line N' when the error knows its line, else ''."""
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}" if mark is not None else ""
