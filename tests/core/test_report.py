"""The terminal table of `klaud plan` and `klaud demo`."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.core.domain import Decision, Wave
from bot.core.report import render_wave_table


def test_the_table_prints_each_decision_with_its_whole_reason() -> None:
    reason = ("no attempt in the last 24 h; no open PR overlaps this family; "
              "cluster mi325x-amds has capacity (3 idle of 8)")
    decision = Decision(family="configs/x-master.yaml:k", candidate="a" * 16 + "-" + "b" * 16,
                        decision="selected", reason=reason, until=None, pull_requests=(), clusters=("mi325x-amds",))
    wave = Wave(repo="acme/bench", at=datetime(2026, 11, 30, 8, tzinfo=UTC), base="c" * 40, wave=1,
                decisions=(decision,))

    header, columns, row = render_wave_table(wave).splitlines()

    assert header == "Wave 1 of acme/bench at 2026-11-30T08:00:00Z on base cccccccccccc: 1 selected of 1 families"
    assert columns.split() == ["#", "family", "decision", "reason"]
    assert row.split("  ")[:3] == ["1", "configs/x-master.yaml:k", "selected"] and row.endswith(reason)


def test_terminal_controls_in_a_hold_reason_or_a_family_print_as_escapes() -> None:
    # What this catches (review H): a hold's reason is a writer's free text, split only at
    # Markdown's line endings, so an escape sequence or a vertical tab stayed in it and
    # `klaud plan` printed them: ESC [1A ESC [2K moved up and erased the row above.
    reason = "held by bob since 2026-11-30 08:00 UTC: wait\x1b[1A\x1b[2Kfake\x0bline"
    decision = Decision(family="configs/x\x1b]0;x\x07-master.yaml:k", candidate="a" * 16 + "-" + "b" * 16,
                        decision="held", reason=reason, until=None, pull_requests=(), clusters=())
    wave = Wave(repo="acme/bench", at=datetime(2026, 11, 30, 8, tzinfo=UTC), base="c" * 40, wave=1,
                decisions=(decision,))

    table = render_wave_table(wave)

    assert table.replace("\n", "").isprintable(), repr(table)
    row = table.splitlines()[-1]
    assert row.startswith("1  configs/x\\x1b]0;x\\x07-master.yaml:k  held  ")
    assert row.endswith("wait\\x1b[1A\\x1b[2Kfake\\x0bline")
