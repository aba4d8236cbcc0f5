"""`.github/klaud.yml`: defaults, and every unreadable file a PolicyError naming the file."""

from __future__ import annotations

import pytest

from bot.core.policy import Policy, PolicyError, parse_policy

# Past Python's limit on turning a string of digits into an int (ValueError in PyYAML).
LONG_NUMBER = "1" * 5000


def test_no_file_or_an_empty_one_means_the_defaults() -> None:
    assert parse_policy(None) == parse_policy("") == parse_policy("# only a comment\n") == Policy()
    assert parse_policy("cooldown_hours: 6\n").cooldown_hours == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cooldown_hours: [\n", r"not valid YAML at line 2$"),
        (f"cooldown_hours: {LONG_NUMBER}\n", r"not valid YAML"),  # escaped as ValueError
        ("x: " + "[" * 600 + "]" * 600 + "\n", r"not valid YAML"),  # escaped as RecursionError
        ("- a list\n", r"expected a mapping"),
        ("cooldown_hours: soon\n", r"cooldown_hours: "),
    ],
)
def test_an_unreadable_policy_is_a_policy_error_naming_the_file(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=r"^\.github/klaud\.yml: ") as raised:
        parse_policy(text)
    assert raised.match(message)
