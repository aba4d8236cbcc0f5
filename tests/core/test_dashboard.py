"""The dashboard issue's body, its marker and its boxes (bot/core/dashboard.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import zlib
from datetime import UTC, datetime, timedelta

import pytest

from bot.core.dashboard import (
    BODY_LIMIT,
    BOXES_SHOWN,
    DashboardView,
    parse_marker,
    render_dashboard,
    ticked,
)
from bot.core.domain import Blocked, Decision, Hold, RetryApproval, Wave
from bot.core.events import EditedIssue
from tests.builders import family

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
A = family("alpha", image_changed_at=NOW - timedelta(days=40))
B = family("beta", image_changed_at=None)
C = family("gamma", image_changed_at=NOW - timedelta(days=3))


def wave() -> Wave:
    return Wave("acme/bench", NOW, "b" * 40, 7, (
        Decision(A.id, A.candidate, "selected", "free"),
        Decision(B.id, B.candidate, "cooldown", "cooling down until 2026-12-01 06:00 UTC: last attempt failed (run 3)",
                 until=NOW + timedelta(hours=22)),
        Decision(C.id, C.candidate, "held", "held by alice"),
    ))


def view(**changes: object) -> DashboardView:
    values: dict[str, object] = {
        "repo": "acme/bench", "wave": wave(), "blocked": None,
        "cooling": [(B, wave().decisions[1].reason, wave().decisions[1].until)],
        "holds": [Hold(C.id, "alice", "new weights", NOW)], "retries": [RetryApproval(A.candidate, "bob", NOW)],
        "families": [A, B, C], "config_errors": {}, "now": NOW,
    }
    values.update(changes)
    return DashboardView(**values)  # type: ignore[arg-type]


def test_the_body_has_every_section_and_boxes_for_retry_and_unhold() -> None:
    body = render_dashboard(view(config_errors={"configs/runners.yaml": "runner x_0 names no cluster"}))
    assert "## Last wave: 7 at 2026-11-30 08:00 UTC" in body and "1 cooldown, 1 held, 1 selected." in body
    assert f"- `{A.id}` (candidate `{A.candidate}`)" in body
    assert f"- [ ] retry `{B.id}`: cooling down until" in body
    assert f"- [ ] unhold `{C.id}`: by **alice**" in body
    stalest = body.index("## Stalest images")
    assert body.index(B.id, stalest) < body.index(A.id, stalest) < body.index(C.id, stalest)  # unknown first
    assert "| 40 days |" in body and "runner x_0 names no cluster" in body


def test_a_pause_comes_first() -> None:
    body = render_dashboard(view(blocked=Blocked("dispatch-paused", "dispatch paused: 3 of 3 runs failed", NOW)))
    assert body.index("## ⚠️ Dispatch paused since 2026-11-30 08:00 UTC") < body.index("## Last wave")


def test_the_marker_remembers_holds_and_retries() -> None:
    remembered = parse_marker(render_dashboard(view()))
    assert remembered is not None
    assert remembered.holds == (Hold(C.id, "alice", "new weights", NOW),)
    assert remembered.retries == (RetryApproval(A.candidate, "bob", NOW),)
    assert parse_marker("no marker here") is None
    assert parse_marker("<!-- klaud-dashboard:v1:bm90IGpzb24= -->") is None  # not JSON: unread, not raised


def test_a_hold_reason_holding_a_marker_does_not_replace_the_dashboards_own() -> None:
    # What this catches (review H): a hold's reason is a writer's free text, shown above the
    # marker, and the first marker of the body was read: `/klaud hold gamma <!-- klaud-
    # dashboard:v1:… -->` made a rebuild from an empty store restore what it said instead.
    fake = marker_of({"holds": [], "retries": []})
    holds = [Hold(A.id, "alice", "new weights", NOW), Hold(C.id, "bob", f"see {fake}", NOW)]
    body = render_dashboard(view(holds=holds))
    assert body.index(fake) < body.rindex("<!-- klaud-dashboard:")
    remembered = parse_marker(body)
    assert remembered is not None
    assert remembered.holds == tuple(holds) and remembered.retries == (RetryApproval(A.candidate, "bob", NOW),)


def test_a_body_too_long_for_github_keeps_its_marker() -> None:
    many = [family(f"fam-{i:04d}-{'x' * 60}") for i in range(2000)]
    body = render_dashboard(view(cooling=[(f, "cooling down", None) for f in many]))
    assert len(body) <= BODY_LIMIT and parse_marker(body) is not None


def test_hundreds_of_holds_fit_the_body_and_all_come_back_from_the_marker() -> None:
    # 400 holds once made a 145,000-character marker: GitHub refused every later update.
    many = [family(f"fam-{i:04d}-fp8-h100-vllm") for i in range(400)]
    holds = [Hold(f.id, f"user{i}", f"waiting for driver {i} on the cluster " * 7, NOW) for i, f in enumerate(many)]
    body = render_dashboard(view(holds=holds, families=many))
    remembered = parse_marker(body)
    assert len(body) <= BODY_LIMIT and remembered is not None
    assert [h.family for h in remembered.holds] == [f.id for f in many]


def test_a_marker_over_its_budget_drops_reasons_then_the_oldest_entries() -> None:
    long_reasons = [Hold(f"configs/x-master.yaml:f{i}", "alice", os.urandom(600).hex(), NOW) for i in range(60)]
    body = render_dashboard(view(holds=long_reasons))
    remembered = parse_marker(body)
    assert len(body) <= BODY_LIMIT and remembered is not None
    assert [h.family for h in remembered.holds] == [h.family for h in long_reasons]  # every hold kept
    assert {h.reason for h in remembered.holds} == {""}  # restored as "no reason given"
    many = [Hold(f"configs/x-master.yaml:{os.urandom(40).hex()}", "alice", "", NOW + timedelta(seconds=i))
            for i in range(1000)]
    remembered = parse_marker(render_dashboard(view(holds=many)))
    assert remembered is not None and 0 < len(remembered.holds) < 1000
    assert max(h.at for h in remembered.holds) == many[-1].at  # the newest are kept


def test_the_marker_is_base64_json_v1_and_deflated_v2_only_when_v1_would_not_fit() -> None:
    small = render_dashboard(view(holds=[Hold(C.id, "alice", "new weights", NOW)]))
    found = re.search(r"<!-- klaud-dashboard:v1:([A-Za-z0-9_=-]+) -->", small)
    assert found is not None, "DESIGN §4's format, readable without Klaud"
    assert json.loads(base64.urlsafe_b64decode(found[1]))["holds"][0]["reason"] == "new weights"
    many = [Hold(f"configs/x-master.yaml:k{i}", "alice", "driver bug " * 20, NOW) for i in range(200)]
    large = render_dashboard(view(holds=many))
    assert "klaud-dashboard:v2:" in large and "klaud-dashboard:v1:" not in large
    remembered = parse_marker(large)
    assert remembered is not None and len(remembered.holds) == 200 and remembered.holds[0].reason


def test_markers_of_the_first_format_still_read_and_a_deflate_bomb_does_not() -> None:
    plain = {"holds": [{"family": C.id, "by": "alice", "reason": "new weights", "at": "2026-11-30T08:00:00Z"}],
             "retries": []}
    v1 = base64.urlsafe_b64encode(json.dumps(plain).encode()).decode()
    remembered = parse_marker(f"<!-- klaud-dashboard:v1:{v1} -->")
    assert remembered is not None and remembered.holds == (Hold(C.id, "alice", "new weights", NOW),)
    bomb = base64.urlsafe_b64encode(zlib.compress(b" " * (64 * 1024 * 1024), 9)).decode()
    assert parse_marker(f"<!-- klaud-dashboard:v2:{bomb} -->") is None


def test_ticked_finds_only_the_boxes_a_person_ticked_now() -> None:
    before = render_dashboard(view())
    after = before.replace(f"- [ ] retry `{B.id}`", f"- [x] retry `{B.id}`")
    assert ticked(before, after) == [("retry", B.id)]
    assert ticked(after, after) == []
    both = after.replace(f"- [ ] unhold `{C.id}`", f"- [X] unhold `{C.id}`")
    assert ticked(before, both) == [("retry", B.id), ("unhold", C.id)]


@pytest.mark.parametrize("key", ["tick`y", "double``tick", "ends-with`"])
def test_the_box_of_a_family_whose_key_has_backticks_reads_back_the_family_it_was_rendered_for(key: str) -> None:
    # What this catches: such a key renders in a longer backtick fence (and, ending with a
    # backtick, padded with spaces), and the box reader took single-backtick spans only.
    ticky = family(key)
    before = render_dashboard(view(cooling=[(ticky, "cooling down", None)], holds=[Hold(ticky.id, "alice", "r", NOW)]))
    after = before.replace("- [ ] retry", "- [x] retry").replace("- [ ] unhold", "- [x] unhold")
    assert ticked(before, after) == [("retry", ticky.id), ("unhold", ticky.id)]


def test_a_body_of_blank_lines_is_scanned_at_once_and_indented_boxes_still_count() -> None:
    # Anyone who may edit the issue can send this; it is read before permissions are asked.
    blank = "\n" * 200_000
    assert ticked("", blank + f"  - [x] retry `{B.id}`\n\t- [x] unhold `{C.id}`" + blank) == [
        ("retry", B.id), ("unhold", C.id),
    ]


def _gfm_cells(row: str) -> list[str]:
    """A GFM table row's cells: split on every `|` not escaped by a backslash (GFM splits on
    them inside code spans too)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def test_a_pipe_in_an_image_or_family_key_keeps_the_stalest_images_row_to_three_cells() -> None:
    piped = family("we|ird", image="registry|mirror/img:1", image_changed_at=NOW)
    body = render_dashboard(view(families=[piped], cooling=[], holds=[], retries=[]))
    [row] = [line for line in body.splitlines() if line.startswith("| ") and "we" in line]
    assert _gfm_cells(row) == [r"`configs/x-master.yaml:we\|ird`", r"`registry\|mirror/img:1`", "0 days"]


def test_each_configuration_problem_is_a_list_item_of_its_own() -> None:
    body = render_dashboard(view(config_errors={"configs/runners.yaml": "runner x_0 names no cluster\nrunner y_1 names no cluster"}))
    assert "- `configs/runners.yaml`: runner x_0 names no cluster\n- `configs/runners.yaml`: runner y_1 names no cluster" in body


def test_long_lists_show_their_first_boxes_and_point_to_the_status_page_so_nothing_after_them_is_cut() -> None:
    """At 2,000 families a full cooling list filled the body and cut off the held families."""
    many = [family(f"fam-{n:04d}") for n in range(2500)]
    cooling = [(f, "cooling down until 2026-12-01 06:00 UTC: last attempt failed (run 3)", NOW) for f in many]
    holds = [Hold(f.id, "alice", "new weights", NOW) for f in many[:150]]
    body = render_dashboard(view(cooling=cooling, holds=holds, config_errors={"configs/runners.yaml": "runner x_0 names no cluster"}))
    assert body.count("- [ ] retry ") == BOXES_SHOWN and body.count("- [ ] unhold ") == BOXES_SHOWN
    assert f"… and {2500 - BOXES_SHOWN} more families cooling down" in body and "`/repos/acme/bench?decision=cooldown`" in body
    assert "… and 50 more families held" in body
    assert "## Configuration errors" in body and "truncated" not in body
    assert len(body) < BODY_LIMIT
    assert f"- [ ] retry `{many[0].id}`" in body  # in the order of family ids, as before


def marker_of(document: object) -> str:
    return f"<!-- klaud-dashboard:v1:{base64.urlsafe_b64encode(json.dumps(document).encode()).decode()} -->"


def test_a_marker_written_by_hand_is_read_within_bounds() -> None:
    # What this catches (a hostile-input review): whoever may edit the issue writes the
    # marker. JSON nested 5,000 deep raised RecursionError out of parse_marker (the rebuild
    # of a lost store failed at every reconcile); a retry naming 6,000 characters became a
    # record's key, which PostgreSQL's index refused; a login or reason had no length.
    nested = b'{"holds": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    assert parse_marker(f"<!-- klaud-dashboard:v1:{base64.urlsafe_b64encode(nested).decode()} -->") is None
    remembered = parse_marker(marker_of({
        "holds": [{"family": C.id, "by": "m" * 5000, "reason": "r" * 5000, "at": "2026-11-30T08:00:00Z"}],
        "retries": [{"candidate": "f" * 6000, "by": "x", "at": "2026-11-30T08:00:00Z"},
                    {"candidate": A.candidate, "by": "bob", "at": "2026-11-30T08:00:00Z"}],
    }))
    assert remembered is not None
    [hold] = remembered.holds
    assert (len(hold.by), len(hold.reason)) == (64, 300)
    assert remembered.retries == (RetryApproval(A.candidate, "bob", NOW),)


def edited(first: list[tuple[str, str | None]], last: list[tuple[str, str | None]], total: int) -> EditedIssue:
    def page(edits: list[tuple[str, str | None]]) -> dict[str, object]:
        return {"totalCount": total, "nodes": [{"editedAt": at, "editor": editor(login)} for at, login in edits]}

    def editor(login: str | None) -> dict[str, str] | None:
        # "app:<slug>" an App, as GraphQL names it: a Bot, by its slug
        if login is None:
            return None
        kind, _, slug = login.rpartition(":")
        return {"__typename": "Bot" if kind == "app" else "User", "login": slug}

    return EditedIssue.model_validate({"body": "", "firstEdits": page(first), "lastEdits": page(last)})


def test_who_edited_the_dashboard_since_a_render_is_known_or_said_unknown() -> None:
    # GitHub says who edited an issue, not who ticked which box: a late box acts only when
    # every editor since the render may do what it asks (bot/services/dashboard.py).
    render = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    old, same, new = "2026-11-30T07:00:00Z", "2026-11-30T08:00:00Z", "2026-11-30T09:00:00Z"
    assert edited([(new, "bob"), (same, "carol"), (old, "al")], [(new, "bob"), (same, "carol"), (old, "al")],
                  3).editors_since(render) == ["bob", "carol"]  # within the render's second: maybe after
    # 50 edits, the newest end (whichever GitHub lists first) reaching back before the render
    newest_first = [(new, "bob"), (old, "al")]
    assert edited(newest_first, [(old, "x")], 50).editors_since(render) == ["bob"]
    assert edited([(old, "x")], list(reversed(newest_first)), 50).editors_since(render) == ["bob"]
    assert edited([(new, "bob"), (new, "eve")], [(old, "x")], 50).editors_since(render) is None  # more may hide
    assert edited([(new, None)], [(new, None)], 1).editors_since(render) is None  # a deleted account
    assert edited([], [], 0).editors_since(None) is None
    # Found by a review: a render stamped with microseconds dropped an edit made just after
    # it in the same second (GitHub's times are whole seconds); two edits of one person in
    # one second made a whole history look cut; GitHub's schema lets the history be null.
    late_render = render.replace(microsecond=400_000)
    assert edited([(same, "carol")], [(same, "carol")], 1).editors_since(late_render) == ["carol"]
    assert edited([(new, "bob"), (new, "bob")], [(new, "bob"), (new, "bob")], 2).editors_since(render) == ["bob"]
    nulls = EditedIssue.model_validate({"firstEdits": None, "lastEdits": {"totalCount": 1, "nodes": None}})
    assert nulls.editors_since(render) is None
    # GraphQL names an App by its slug: read back as its REST login (Klaud's settings'), so
    # a person whose login is an App's slug is not taken for the App.
    both = [(new, "app:klaud-cold"), (new, "klaud-cold")]
    assert edited(both, both, 2).editors_since(render) == ["klaud-cold", "klaud-cold[bot]"]
    last = EditedIssue.model_validate({"editor": {"__typename": "Bot", "login": "klaud-cold"}})
    assert last.editor is not None and (last.editor.login, last.editor.type) == ("klaud-cold[bot]", "Bot")


def test_a_retry_approved_since_the_wave_shows_without_a_box_to_tick_again() -> None:
    # What this catches: a ticked box came back unticked, the family still listed as cooling
    # down, as if the tick had done nothing, until the next wave.
    approved = RetryApproval(B.candidate, "bob", NOW + timedelta(minutes=5))
    body = render_dashboard(view(retries=[approved]))
    assert f"- retry `{B.id}`: approved by **bob** 2026-11-30 08:05 UTC; the next wave may pick it" in body
    assert f"- [ ] retry `{B.id}`" not in body
    # Approved before the wave that still found it cooling down (a later failure): a box again.
    weighed = RetryApproval(B.candidate, "bob", NOW - timedelta(minutes=5))
    assert f"- [ ] retry `{B.id}`: cooling down until" in render_dashboard(view(retries=[weighed]))


def test_an_approved_retry_names_its_approver_without_mentioning_them() -> None:
    body = render_dashboard(view(retries=[RetryApproval(B.candidate, "bob", NOW + timedelta(minutes=5))]))
    assert "approved by" in body
    assert "@bob" not in body  # Klaud never notifies people: `**bob**`, as holds are shown


def test_a_login_read_from_a_marker_cannot_put_a_ticked_box_into_klauds_own_render() -> None:
    at = "2026-11-30T07:00:00Z"
    document = {"holds": [{"family": C.id, "by": f"x\n- [x] retry `{B.id}`", "reason": "w", "at": at}], "retries": []}
    marker = f"<!-- klaud-dashboard:v1:{base64.urlsafe_b64encode(json.dumps(document).encode()).decode()} -->"
    remembered = parse_marker(marker)
    assert remembered is not None
    body = render_dashboard(view(holds=list(remembered.holds), retries=[]))
    # Klaud renders every box unticked: a ticked one in its own render is read as a person's.
    assert ticked("", body) == []


def test_a_box_inside_a_code_block_or_html_comment_is_not_a_tick() -> None:
    body = render_dashboard(view())
    quoted = body.replace("## Held", f"```\n- [x] retry `{B.id}`\n```\n\n<!--\n- [x] unhold `{C.id}`\n-->\n\n## Held")
    # GitHub shows neither as a checkbox: nobody ticked anything.
    assert ticked(body, quoted) == []


@pytest.mark.parametrize(("reason", "shown"), [
    ("see <!-- notes", "`see <!-- notes`"),
    # A reason holding a backtick is shown in a double-backtick span.
    ("see `notes` <!-- x", "``see `notes` <!-- x``"),
])
def test_a_hold_reason_opening_an_html_comment_in_a_code_span_hides_no_later_box(reason: str, shown: str) -> None:
    # `/klaud hold alpha <!-- see notes`: the reason is shown in a code span, where GitHub
    # reads `<!--` as code, not as a comment: the boxes after it are still checkboxes.
    holds = [Hold(A.id, "alice", reason, NOW), Hold(C.id, "alice", "new weights", NOW)]
    body = render_dashboard(view(holds=holds))
    assert f"- [ ] unhold `{C.id}`" in body and shown in body
    after = body.replace(f"- [ ] unhold `{C.id}`", f"- [x] unhold `{C.id}`")
    assert ticked(body, after) == [("unhold", C.id)]


def test_a_marker_keeps_an_enterprise_managed_users_login() -> None:
    # GitHub Enterprise Managed Users' logins are `handle_shortcode` (an underscore): a hold
    # restored from the marker must still say who placed it.
    from bot.core.dashboard import parse_marker
    body = render_dashboard(view(holds=[Hold(C.id, "mona_acme", "new weights", NOW)]))
    remembered = parse_marker(body)
    assert remembered is not None
    assert [h.by for h in remembered.holds] == ["mona_acme"]


def test_a_body_cut_to_the_limit_leaves_no_hold_reason_outside_its_code_span() -> None:
    # What this catches: the cut fell inside a hold reason's code span; its backtick
    # unclosed, the rest of the reason was Markdown (an @-mention, `<!--`), which every user
    # text is kept out of. 100 boxes each of cooling and held families, reasons of 300 characters.
    many = [family(f"dsv4-fp4-gb300-dynamo-vllm-agentic-mtp-agg-{n:04d}") for n in range(200)]
    cooling = [(f, "cooling down until 2026-12-01 06:00 UTC: last attempt failed (run 3)", NOW) for f in many[:100]]

    def reason(n: int) -> str:
        words = " ".join(hashlib.sha256(f"{n}-{i}".encode()).hexdigest()[:12] for i in range(40))
        return ("@acme/admins " + words)[:300]

    holds = [Hold(f.id, "alice", reason(n), NOW) for n, f in enumerate(many[100:])]
    body = render_dashboard(view(cooling=cooling, holds=holds, retries=[]))
    assert "(truncated)" in body and len(body) <= BODY_LIMIT
    outside_code = re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", body)
    assert "@acme/admins" not in outside_code, body[body.index("(truncated)") - 300:body.index("(truncated)")]
