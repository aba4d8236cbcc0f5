"""Plain-text renderings for the terminal (`klaud plan`, `klaud demo`)."""

from __future__ import annotations

from typing import Any

from bot.core.domain import Wave


def render_wave_table(wave: Wave) -> str:
    # The reason is the last column, whole: cut, it lost the capacity part of the decision.
    rows = [("#", "family", "decision", "reason")]
    for index, decision in enumerate(wave.decisions, start=1):
        rows.append((str(index), _visible(decision.family), decision.decision, _visible(decision.reason)))
    widths = [max(len(row[col]) for row in rows) for col in range(3)]
    lines = [
        (
            f"Wave {wave.wave} of {wave.repo} at {wave.document()['at']} on base {wave.base[:12]}: "
            f"{len(wave.selected)} selected of {len(wave.decisions)} families"
        )
    ]
    for row in rows:
        lines.append("  ".join(cell.ljust(widths[col]) for col, cell in enumerate(row[:3])) + "  " + row[3])
    return "\n".join(lines)


def _visible(text: str) -> str:
    """`text` with what a terminal would act on shown as escapes (`\\x1b`, `\\x0b`): a hold's
    reason is a writer's free text, and ESC [1A ESC [2K in it erased the row above."""
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


def render_requests(by_route: dict[str, Any]) -> str:
    if not by_route:
        return "GitHub requests made by the wave: none"
    lines = ["GitHub requests made by the wave:"]
    for route, count in sorted(by_route.items()):
        lines.append(f"  {count:4d}  {route}")
    return "\n".join(lines)
