"""The status page on the admin listener (DESIGN §3.3): server-rendered HTML, no JavaScript.

Plain Jinja2 rather than aiohttp-jinja2: three handlers need no per-request template
machinery, and the benchmark renders the same templates without a request. Autoescape is on
for every template, so hold reasons, PR titles and family keys can never inject markup, and
the Content-Security-Policy forbids scripts outright as a second line of defence.

Plots are inline SVG whose geometry is computed here (rectangles, dots, lines in pixels), so
the templates only place them and the page needs no JavaScript to show them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any
from urllib.parse import quote, urlencode

from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from bot.core.commands import GITHUB_WEB
from bot.core.cooldown import human_time
from bot.services.status_view import (
    DECISION_KINDS,
    OUTCOME_KINDS,
    Counts,
    FamilyPage,
    FamilyRow,
    Freshness,
    Histogram,
    RepoPage,
    RowQuery,
    WavePoint,
)
from bot.web.backend import klaud_of

# No script may run, whatever a template let through; styles are inline in the page.
CONTENT_SECURITY_POLICY = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'self'"
PLOT_WIDTH = 760
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 34, 28  # margins around a plot's drawing area (labels above)
WIDEST_BAR = 24  # a history of a few waves is a few bars, not a wall
MOST_TICKS = 8
CACHED_ROWS = 20_000  # rendered family rows kept: ten repositories of 2,000 families
CACHED_HISTORIES = 16  # rendered wave histories kept, a few per repository

TEMPLATES = Environment(
    loader=PackageLoader("bot.web"),
    autoescape=select_autoescape(default=True),
    undefined=StrictUndefined,  # a misspelt field fails the test that renders it, not silently
    trim_blocks=True,
    lstrip_blocks=True,
)


# -- links ------------------------------------------------------------------------------


def repo_url(repo: str) -> str:
    return f"/repos/{repo}"


DOT_SEGMENTS = frozenset({".", ".."})


def family_url(repo: str, family: str) -> str:
    # Family ids hold `/` and `:`, which the route's path parameter takes as they are. A
    # `.` or `..` segment cannot be escaped on its own: browsers (WHATWG URL) and yarl
    # resolve `%2E%2E` away like `..`. Such an id escapes its slashes instead, making one
    # segment that is no dot segment; the route reads `%2F` back as `/`.
    safe = ":" if DOT_SEGMENTS.intersection(family.split("/")) else ":/"
    return f"/repos/{repo}/families/{quote(family, safe=safe)}"


def github_url(repo: str, *path: object) -> str:
    return "/".join([GITHUB_WEB, repo, *map(str, path)])


def table_link(query: RowQuery, **changes: str | None) -> str:
    """The families table's URL with `changes` applied to the current query."""
    values = {
        "sort": query.sort,
        "dir": "desc" if query.descending else "asc",
        "decision": query.decision,
        "q": query.text or None,
        **changes,
    }
    return "?" + urlencode({name: value for name, value in values.items() if value})


def sort_link(query: RowQuery, key: str) -> str:
    """Sort by `key`; on the current sort column, the other way round."""
    if key == query.sort:
        return table_link(query, dir="asc" if query.descending else "desc")
    return table_link(query, sort=key, dir=None)


def counts_text(counts: Counts) -> str:
    return ", ".join(f"{n} {kind}" for kind, n in counts)


def when(moment: datetime | None) -> str:
    return "—" if moment is None else human_time(moment)


def days(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f}"


TEMPLATES.filters.update(when=when, days=days, counts=counts_text)
TEMPLATES.globals.update(
    repo_url=repo_url,
    family_url=family_url,
    github_url=github_url,
    table_link=table_link,
    sort_link=sort_link,
    DECISION_KINDS=DECISION_KINDS,
    OUTCOME_KINDS=OUTCOME_KINDS,
)


# -- plots ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Area:
    """Every bar of one colour as one SVG path: a few elements, however many bars."""

    cls: str
    path: str


@dataclass(frozen=True, slots=True)
class Tip:
    """An invisible rectangle over a bar (a histogram bin, a wave's stacks) with its tooltip."""

    x: float
    y: float
    w: float
    h: float
    title: str


class _Painter:
    """Collects bars by colour class."""

    def __init__(self) -> None:
        self._paths: dict[str, list[str]] = {}

    def bar(self, cls: str, x: float, y: float, w: float, h: float) -> None:
        if h > 0:
            self._paths.setdefault(cls, []).append(f"M{x:.1f} {y:.1f}h{w:.1f}v{h:.1f}h{-w:.1f}z")

    def areas(self) -> tuple[Area, ...]:
        return tuple(Area(cls, "".join(parts)) for cls, parts in self._paths.items())


@dataclass(frozen=True, slots=True)
class Dot:
    x: float
    y: float
    cls: str
    title: str


@dataclass(frozen=True, slots=True)
class Mark:
    """A label at `x`: a vertical marker line, or an x-axis tick."""

    x: float
    label: str
    row: int = 0  # marker labels close to each other go on separate lines
    anchor: str = "start"  # "end" near the right edge, so the label stays inside the plot


@dataclass(frozen=True, slots=True)
class Plot:
    height: int
    baselines: tuple[float, ...]  # y of each panel's axis
    areas: tuple[Area, ...] = ()
    tips: tuple[Tip, ...] = ()
    dots: tuple[Dot, ...] = ()
    marks: tuple[Mark, ...] = ()
    ticks: tuple[Mark, ...] = ()
    y_labels: tuple[tuple[float, str], ...] = ()
    titles: tuple[tuple[float, str], ...] = ()  # panel titles (y, text), above each panel
    width: int = PLOT_WIDTH
    left: int = LEFT
    right: int = PLOT_WIDTH - RIGHT
    top: int = TOP


def _px(value: float) -> float:
    return round(value, 1)


def _ticks(count: int, slot: float, label: Callable[[int], str]) -> tuple[Mark, ...]:
    """At most MOST_TICKS labels along `count` slots, `label(i)` naming slot i's left edge."""
    step = max(1, math.ceil(count / MOST_TICKS))
    return tuple(Mark(_px(LEFT + i * slot), label(i)) for i in range(0, count, step))


def freshness_plot(histogram: Histogram, freshness: Freshness) -> Plot:
    """Image ages as a histogram, p50 and p90 marked where they fall."""
    height = 200
    inner_w, inner_h = PLOT_WIDTH - LEFT - RIGHT, height - TOP - BOTTOM
    bins = len(histogram.counts)
    slot = inner_w / bins
    tallest = max(max(histogram.counts), 1)
    painter, tips = _Painter(), []
    for index, count in enumerate(histogram.counts):
        h = inner_h * count / tallest
        painter.bar("bar", LEFT + index * slot + 1, TOP + inner_h - h, max(slot - 2, 1), h)
        low, high = index * histogram.width, (index + 1) * histogram.width
        title = f"{low}–{high} days: {count} famil{'y' if count == 1 else 'ies'}"
        tips.append(Tip(_px(LEFT + index * slot), TOP, _px(slot), inner_h, title))
    span = bins * histogram.width
    marks = tuple(
        _marker(LEFT + inner_w * value / span, f"{name} {value:.1f} d", row)
        for row, (name, value) in enumerate((("p50", freshness.p50), ("p90", freshness.p90)))
        if value is not None
    )
    return Plot(
        height=height,
        baselines=(TOP + inner_h,),
        areas=painter.areas(),
        tips=tuple(tips),
        marks=marks,
        ticks=_ticks(bins, slot, lambda i: f"{i * histogram.width} d"),
        y_labels=((TOP + 8, str(tallest)), (TOP + inner_h, "0")),
    )


def _marker(x: float, label: str, row: int = 0) -> Mark:
    return Mark(_px(x), label, row, "end" if x > PLOT_WIDTH - RIGHT - 100 else "start")


def history_plot(points: Sequence[WavePoint]) -> Plot:
    """Per wave: the candidates it dispatched by how they ended (top), and the share of
    each decision among its families (bottom)."""
    top_h, gap, bottom_h = 110, 34, 70
    height = TOP + top_h + gap + bottom_h + BOTTOM
    slot = min((PLOT_WIDTH - LEFT - RIGHT) / max(len(points), 1), WIDEST_BAR)
    most = max((len(p.wave.selected) for p in points), default=0) or 1
    top_base, bottom_base = TOP + top_h, TOP + top_h + gap + bottom_h
    painter, tips = _Painter(), []
    for index, point in enumerate(points):
        x, w = LEFT + index * slot + 0.5, max(slot - 1, 0.5)
        _stack(painter, x, w, top_base, top_h / most, [(f"o-{kind}", n) for kind, n in point.outcomes])
        families = sum(n for _, n in point.wave.decisions) or 1
        _stack(painter, x, w, bottom_base, bottom_h / families, [(f"d-{kind}", n) for kind, n in point.wave.decisions])
        tips.append(Tip(_px(x), TOP, _px(w), bottom_base - TOP, _wave_title(point)))
    return Plot(
        height=height,
        baselines=(top_base, bottom_base),
        areas=painter.areas(),
        tips=tuple(tips),
        ticks=_ticks(len(points), slot, lambda i: f"#{points[i].wave.number}"),
        y_labels=((TOP + 8, str(most)), (top_base, "0"), (top_base + gap + 8, "100 %"), (bottom_base, "0")),
        titles=((TOP - 8, "dispatched candidates, by how their runs ended"), (top_base + gap - 8, "decisions, as shares of the wave's families")),
    )


def _stack(painter: _Painter, x: float, w: float, base: float, unit: float, parts: list[tuple[str, int]]) -> None:
    """Bars of `unit` pixels per count, each on top of the one before, from `base` up."""
    y = base
    for cls, count in parts:
        y -= unit * count
        painter.bar(cls, x, y, w, unit * count)


def _wave_title(point: WavePoint) -> str:
    wave = point.wave
    blocked = f" ({wave.blocked})" if wave.blocked else ""
    outcomes = f" ({counts_text(point.outcomes)})" if point.outcomes else ""
    dispatched = f"{len(wave.selected)} dispatched{outcomes}"
    return f"Wave {wave.number} at {human_time(wave.at)}{blocked}: {dispatched}; {counts_text(wave.decisions)}"


def attempts_plot(page: FamilyPage) -> Plot:
    """The family's attempts on a time line ending now, its image change marked."""
    height = 90
    times = [row.attempt.completed_at for row in page.attempts]
    start = min([*times, page.now - timedelta(days=1)])
    span = (page.now - start).total_seconds() or 1.0
    inner_w = PLOT_WIDTH - LEFT - RIGHT

    def x_of(moment: datetime) -> float:
        return _px(LEFT + inner_w * (moment - start).total_seconds() / span)

    middle = TOP + (height - TOP - BOTTOM) / 2
    dots = tuple(
        Dot(x_of(row.attempt.completed_at), middle, f"o-{row.outcome.kind}",
            f"{human_time(row.attempt.completed_at)}: {row.outcome.text} (run {row.attempt.run_id})")
        for row in page.attempts
    )
    changed = page.family.image_changed_at
    marks = (_marker(x_of(changed), "image changed"),) if changed is not None and changed > start else ()
    return Plot(
        height=height,
        baselines=(height - BOTTOM,),
        dots=dots,
        marks=marks,
        ticks=(Mark(LEFT, human_time(start)), Mark(PLOT_WIDTH - RIGHT, human_time(page.now), anchor="end")),
    )


# -- rendering --------------------------------------------------------------------------


def render(template: str, **context: Any) -> str:
    return TEMPLATES.get_template(template).render(**context)


@lru_cache(maxsize=CACHED_ROWS)
def family_row_html(repo: str, row: FamilyRow) -> Markup:
    """One row of the families table. Rendering 2,000 rows is most of a big page's time, and
    between two loads of it few rows change (a decision, a tenth of a day of age): a row is
    rendered once per distinct content."""
    return Markup(render("_family_row.html", repo=repo, row=row))


@lru_cache(maxsize=CACHED_HISTORIES)
def history_html(points: tuple[WavePoint, ...]) -> Markup:
    """The wave history's plot and table: drawn again only when a wave or an outcome is new."""
    return Markup(render("_history.html", points=points, plot=history_plot(points)))


def render_repository(page: RepoPage) -> str:
    name = page.summary.name
    return render(
        "repo.html",
        page=page,
        # Each row is Markup already: a plain join keeps it from being escaped again.
        rows=Markup("".join(family_row_html(name, row) for row in page.rows)),
        now=page.now,
        freshness=freshness_plot(page.histogram, page.summary.freshness),
        history=history_html(page.history),
    )


def render_family(page: FamilyPage) -> str:
    return render("family.html", page=page, now=page.now, timeline=attempts_plot(page))


def html(body: str, status: int = 200) -> web.Response:
    response = web.Response(text=body, status=status, content_type="text/html")
    response.headers["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
    return response


def not_found(request: web.Request, what: str) -> web.Response:
    now = klaud_of(request).status.clock.now()
    return html(render("not_found.html", what=what, now=now), status=404)


def _repo_param(request: web.Request) -> str:
    return f"{request.match_info['owner']}/{request.match_info['repo']}"


async def overview(request: web.Request) -> web.Response:
    views = klaud_of(request).status
    return html(render("index.html", repos=await views.overview(), now=views.clock.now()))


async def repository(request: web.Request) -> web.Response:
    query = RowQuery.parse(
        request.query.get("sort"), request.query.get("dir"), request.query.get("decision"), request.query.get("q")
    )
    page = await klaud_of(request).status.repository(_repo_param(request), query)
    if page is None:
        return not_found(request, f"{_repo_param(request)} is not an installed repository.")
    return html(render_repository(page))


async def family(request: web.Request) -> web.Response:
    views = klaud_of(request).status
    repo = views.repo_name(_repo_param(request))
    if repo is None:
        return not_found(request, f"{_repo_param(request)} is not an installed repository.")
    page = await views.family(repo, request.match_info["family"])
    if page is None:
        return not_found(request, f"{repo} has no family {request.match_info['family']}.")
    return html(render_family(page))


def add_status_routes(app: web.Application) -> None:
    app.router.add_get("/", overview)
    app.router.add_get("/repos/{owner}/{repo}", repository)
    # `.+`: family ids are `<path>:<key>`, slashes included.
    app.router.add_get("/repos/{owner}/{repo}/families/{family:.+}", family)
