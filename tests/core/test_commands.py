"""`/klaud` command parsing, permissions, targets, markers and replies (bot/commands.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import bot.core.commands as commands_module
from bot.core.commands import (
    CLIPPED,
    COMMENT_LIMIT,
    MAX_COMMANDS_PER_COMMENT,
    MAX_TEXT,
    VERBS,
    Command,
    StatusView,
    answered_comments,
    clip,
    code_span,
    compose_reply,
    effective_permission,
    help_text,
    opens_a_comment,
    parse_commands,
    permission_allows,
    render_help,
    render_hold,
    render_refusal,
    render_resume,
    render_retry,
    render_status,
    render_unhold,
    reply_marker,
    resolve_command,
    resolve_target,
)
from bot.core.domain import (
    Attempt,
    Blocked,
    Decision,
    Family,
    Hold,
    Overlap,
    candidate_id,
)

FAMILY_ID = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"
OTHER_ID = "configs/amd-master.yaml:llama70b-fp8-mi300x-vllm"
AT = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def family(family_id: str = FAMILY_ID, image: str = "lmsysorg/sglang:v0.5.5") -> Family:
    path, key = family_id.split(":")
    return Family(
        id=family_id,
        path=path,
        key=key,
        image=image,
        runner="b200",
        clusters=("b200-nscale",),
        model_prefix="dsr1",
        precision="fp4",
        framework="sglang",
        line_start=10,
        line_end=30,
        image_changed_at=datetime(2026, 10, 1, tzinfo=UTC),
    )


def attempt(run_id: int, outcome: str | None = "failed", **changes: object) -> Attempt:
    values: dict[str, object] = {
        "candidate": family().candidate,
        "family": FAMILY_ID,
        "run_id": run_id,
        "run_attempt": 1,
        "base": "a" * 40,
        "completed_at": AT,
        "verified": outcome is not None,
        "outcome": outcome,
        "phase": "targeted",
        "pull_request": None,
        "reason_code": None,
        "error": None if outcome is not None else "artifact-expired",
    }
    values.update(changes)
    return Attempt(**values)  # type: ignore[arg-type]


FAMILIES = {FAMILY_ID: family(), OTHER_ID: family(OTHER_ID, "rocm/vllm:1")}


# ---------------------------------------------------------------------------- parsing


def test_parses_verb_case_insensitively_with_leading_whitespace() -> None:
    commands = parse_commands("  /klaud RETRY")
    assert commands == [Command(verb="retry", target=None, text="", line=1)]


def test_several_commands_per_comment_keep_order_and_line_numbers() -> None:
    body = "Thanks!\n/klaud status\nsome words\n/klaud hold\n"
    assert [(c.verb, c.line) for c in parse_commands(body)] == [("status", 2), ("hold", 4)]


def test_command_must_start_the_line() -> None:
    assert parse_commands("please /klaud retry") == []
    assert parse_commands("`/klaud retry`") == []


@pytest.mark.parametrize("body", ["/klaudfoo", "/klaudretry", "/klaud:retry", "/klaud-status"])
def test_word_glued_to_klaud_is_not_a_command(body: str) -> None:
    assert parse_commands(body) == []


@pytest.mark.parametrize(
    ("opening", "closing"),
    [("```", "```"), ("~~~", "~~~"), ("````", "`````"), ("```python", "```")],
)
def test_fenced_code_is_ignored(opening: str, closing: str) -> None:
    body = f"{opening}\n/klaud retry\n{closing}\n/klaud status"
    assert [c.verb for c in parse_commands(body)] == ["status"]


def test_fence_closes_only_with_same_character_and_enough_length() -> None:
    body = "~~~~\n/klaud retry\n```\n~~~\n/klaud hold\n~~~~\n/klaud help"
    assert [c.verb for c in parse_commands(body)] == ["help"]


def test_fences_and_commands_follow_commonmarks_three_spaces_of_indentation() -> None:
    # Up to three spaces a line is still what it would be at column 0: a closing fence, a
    # command; at four, a fence line is code (the block stays open).
    assert [c.verb for c in parse_commands("```\n/klaud retry\n   ```\n   /klaud status")] == ["status"]
    assert parse_commands("```\n/klaud retry\n    ```\n/klaud status") == []


def test_a_backtick_in_the_info_string_opens_a_tilde_fence_only() -> None:
    # CommonMark: a backtick fence's info string cannot hold a backtick (the line is inline
    # code then), a tilde fence's can.
    assert [c.verb for c in parse_commands("~~~ a`b\n/klaud retry\n~~~\n/klaud status")] == ["status"]
    assert [c.verb for c in parse_commands("``` a`b\n/klaud retry")] == ["retry"]


def test_unclosed_fence_runs_to_the_end() -> None:
    assert parse_commands("```\n/klaud retry") == []


def test_indented_code_block_is_ignored() -> None:
    body = "Example:\n\n    /klaud retry\n\t/klaud hold\n\n/klaud status"
    assert [c.verb for c in parse_commands(body)] == ["status"]


def test_indented_line_continuing_a_paragraph_is_a_command() -> None:
    # CommonMark: an indented line cannot interrupt a paragraph, so it is plain text.
    body = "I think we should\n     /klaud retry"
    assert [c.verb for c in parse_commands(body)] == ["retry"]


def test_quoted_lines_are_ignored() -> None:
    body = "> /klaud retry\n>/klaud hold\n   > /klaud unhold\n\n/klaud status"
    assert [c.verb for c in parse_commands(body)] == ["status"]


@pytest.mark.parametrize("body", [
    "> I asked for\n/klaud retry",
    "> I asked for\nthis, then\n/klaud retry",  # the continuation goes on
    "> I asked for\n    /klaud retry",  # an indented line cannot interrupt a paragraph
    "> > nested\n/klaud retry",
    ">- a list item in the quote\n/klaud retry",
    "> ```\n> code\n> ```\n> and then text\n/klaud retry",  # text after the quoted fence
])
def test_a_line_continuing_a_quoted_paragraph_is_quoted(body: str) -> None:
    # CommonMark's lazy continuation: GitHub shows the line inside the quote.
    assert parse_commands(body) == []


@pytest.mark.parametrize("body", [
    "> I asked for\n\n/klaud retry",  # a blank line ends the quote
    ">\n/klaud retry",  # a blank quote line holds no paragraph
    "> # A heading\n/klaud retry",
    "> ---\n/klaud retry",
    "> quote\n# Heading\n/klaud retry",  # a heading interrupts the quoted paragraph
    "> quote\n- item\n/klaud retry",  # so does a list item
    "> quote\n```\n/klaud hold\n```\n/klaud retry",  # and a fence
    "> ```\n> shown code\n/klaud retry",  # a line without `>` ends the quote and its fence
    "> ~~~\n> code\n> ~~~\n/klaud retry",  # a closed fence in the quote holds no paragraph
])
def test_a_line_after_a_quote_that_holds_no_open_paragraph_is_a_command(body: str) -> None:
    assert [c.verb for c in parse_commands(body)] == ["retry"]


def test_family_target_and_reason() -> None:
    [command] = parse_commands(f"/klaud hold {FAMILY_ID} new weights coming")
    assert command.target == FAMILY_ID
    assert command.text == "new weights coming"


def test_candidate_target() -> None:
    candidate = family().candidate
    [command] = parse_commands(f"/klaud retry {candidate}")
    assert (command.verb, command.target, command.text) == ("retry", candidate, "")


def test_words_that_are_not_ids_are_text() -> None:
    [command] = parse_commands("/klaud hold waiting for new weights")
    assert command.target is None
    assert command.text == "waiting for new weights"


def test_unknown_verb_is_kept_as_typed_and_flagged() -> None:
    [command] = parse_commands("/klaud Frobnicate now")
    assert command.unknown
    assert command.verb == "Frobnicate"
    assert command.spec is None


def test_bare_klaud_is_an_unknown_empty_verb() -> None:
    [command] = parse_commands("/klaud")
    assert command.unknown and command.verb == ""


def test_windows_line_endings() -> None:
    assert [c.verb for c in parse_commands("hi\r\n/klaud status\r\n")] == ["status"]


# ------------------------------------------------------------------------- permission

WRITE_VERBS = ["retry", "hold", "unhold"]
OPEN_VERBS = ["status", "help"]


@pytest.mark.parametrize("permission", ["admin", "maintain", "write", "WRITE"])
@pytest.mark.parametrize("verb", WRITE_VERBS + OPEN_VERBS)
def test_writers_may_run_everything(verb: str, permission: str) -> None:
    assert permission_allows(verb, permission)


@pytest.mark.parametrize("permission", ["triage", "read", "none", None, "bogus"])
def test_readers_may_not_change_state(permission: str | None) -> None:
    for verb in WRITE_VERBS:
        assert not permission_allows(verb, permission)
    for verb in OPEN_VERBS:
        assert permission_allows(verb, permission)


def test_unknown_verbs_are_answered_for_anyone() -> None:
    assert permission_allows("frobnicate", None)


@pytest.mark.parametrize(
    ("permission", "role_name", "expected"),
    [
        ("write", "maintain", "maintain"),
        ("read", "triage", "triage"),
        ("admin", "admin", "admin"),
        ("write", "custom-release-role", "write"),
        (None, None, None),
        ("none", None, "none"),
    ],
)
def test_effective_permission_takes_the_stronger(
    permission: str | None, role_name: str | None, expected: str | None
) -> None:
    assert effective_permission(permission, role_name) == expected


def test_maintainer_seen_only_through_role_name_may_retry() -> None:
    assert permission_allows("retry", effective_permission("write", "maintain"))
    assert not permission_allows("retry", effective_permission("read", "triage"))


def test_every_verb_is_declared_once_with_help() -> None:
    assert list(VERBS) == ["retry", "hold", "unhold", "resume", "status", "help"]
    for verb in VERBS.values():
        assert verb.help and verb.usage.startswith(f"/klaud {verb.name}")


# ----------------------------------------------------------------------------- target


def test_no_target_on_klaud_pr_uses_its_family() -> None:
    resolved = resolve_target(None, families=FAMILIES, default_family=FAMILY_ID)
    assert (resolved.family, resolved.error) == (FAMILY_ID, None)


def test_no_target_elsewhere_asks_for_one() -> None:
    resolved = resolve_target(None, families=FAMILIES, default_family=None)
    assert resolved.family is None
    assert resolved.error == "this is not a Klaud pull request: name a family"


def test_family_target_overrides_default() -> None:
    resolved = resolve_target(OTHER_ID, families=FAMILIES, default_family=FAMILY_ID)
    assert resolved.family == OTHER_ID


def test_unknown_family() -> None:
    resolved = resolve_target("configs/x-master.yaml:gone", families=FAMILIES, default_family=None)
    assert resolved.family is None
    assert resolved.error == "unknown family `configs/x-master.yaml:gone`"


def test_default_family_that_vanished_is_unknown() -> None:
    resolved = resolve_target(None, families={}, default_family=FAMILY_ID)
    assert resolved.error == f"unknown family `{FAMILY_ID}`"


def test_current_candidate_resolves_to_its_family() -> None:
    resolved = resolve_target(FAMILIES[OTHER_ID].candidate, families=FAMILIES, default_family=None)
    assert resolved.family == OTHER_ID


def test_candidate_of_an_older_image_is_refused() -> None:
    old = candidate_id(FAMILY_ID, "lmsysorg/sglang:v0.4.0")
    resolved = resolve_target(old, families=FAMILIES, default_family=None)
    assert resolved.family is None
    assert resolved.error is not None
    assert resolved.error.startswith(
        f"candidate `{old}` is not the current candidate of any family"
    )
    assert FAMILIES[FAMILY_ID].candidate in resolved.error


def test_candidate_of_no_family_is_refused() -> None:
    stray = candidate_id("configs/x-master.yaml:nope", "img:1")
    resolved = resolve_target(stray, families=FAMILIES, default_family=None)
    assert resolved.error == f"candidate `{stray}` is not the current candidate of any family"


def test_garbage_target_is_not_an_id() -> None:
    resolved = resolve_target("please", families=FAMILIES, default_family=FAMILY_ID)
    assert resolved.error == "`please` is not a family, family key or candidate id"


def test_mistyped_target_of_retry_is_refused_not_defaulted() -> None:
    [command] = parse_commands("/klaud retry configs/nvidia.yaml:typo")
    resolved = resolve_command(command, families=FAMILIES, default_family=FAMILY_ID)
    assert resolved.family is None
    assert resolved.error is not None
    assert resolved.error.startswith("unknown family `configs/nvidia.yaml:typo`")


def test_a_family_id_is_a_target_wherever_config_globs_reach() -> None:
    # `configs/<name>-master.yaml:<key>` only, a hold on another path's family held the
    # Klaud PR's own family, with the id taken for the reason.
    extra = family("extra/more-master.yaml:qwen-fp8-h200-vllm")
    [command] = parse_commands(f"/klaud hold {extra.id} new weights")
    assert (command.target, command.text) == (extra.id, "new weights")
    resolved = resolve_command(command, families={**FAMILIES, extra.id: extra}, default_family=FAMILY_ID)
    assert resolved.family == extra.id
    [nested] = parse_commands("/klaud status configs/sub/x-master.yml:k")
    assert nested.target == "configs/sub/x-master.yml:k"


def test_a_family_key_alone_names_its_family_when_unique() -> None:
    key = FAMILIES[OTHER_ID].key
    assert resolve_target(key, families=FAMILIES, default_family=None).family == OTHER_ID


def test_a_key_in_two_master_configs_must_be_named_in_full() -> None:
    twin = family(OTHER_ID.replace("amd-master", "nvidia-master"))
    resolved = resolve_target(twin.key, families={**FAMILIES, twin.id: twin}, default_family=None)
    assert resolved.family is None and resolved.error is not None
    assert "several master configs" in resolved.error and twin.id in resolved.error


def test_an_unknown_target_is_answered_with_the_three_closest_keys() -> None:
    keys = ["dsr1-fp8-h200-trt", "dsr1-fp8-h200-sglang", "dsr1-fp4-b200-trt", "gptoss-fp4-b200-vllm", "llama70b"]
    families = {f.id: f for f in (family(f"configs/nvidia-master.yaml:{k}") for k in keys)}
    resolved = resolve_target("dsr1-fp8-h200-trtllm", families=families, default_family=None)
    assert resolved.error is not None
    suggested = resolved.error.split("did you mean ", 1)[1]
    assert suggested.count("`") == 6 and "`dsr1-fp8-h200-trt`" in suggested.split(",")[0]
    assert "llama70b" not in suggested
    unknown_id = resolve_target("configs/nvidia-master.yaml:dsr1-fp8-h200-trtt", families=families, default_family=None)
    assert unknown_id.error is not None and "did you mean `dsr1-fp8-h200-trt`" in unknown_id.error


def test_a_fragment_of_family_keys_gets_the_keys_holding_it() -> None:
    # What this catches: DESIGN §4 answers an unknown target with the closest keys; a
    # fragment such as a GPU name is below difflib's cutoff for every key and got none.
    keys = ["dsr1-fp8-h200-trt", "dsr1-fp8-h200-sglang", "dsr1-fp4-b200-trt", "gptoss-fp4-b200-vllm", "llama70b"]
    families = {f.id: f for f in (family(f"configs/nvidia-master.yaml:{k}") for k in keys)}
    fragment = resolve_target("h200", families=families, default_family=None).error
    assert fragment is not None and "did you mean `dsr1-fp8-h200-sglang`, `dsr1-fp8-h200-trt`?" in fragment
    b200 = resolve_target("B200", families=families, default_family=None).error
    assert b200 is not None and b200.count("`") == 2 + 4  # the target and the two b200 keys


def test_hold_reason_without_target_uses_the_pr_family() -> None:
    [command] = parse_commands("/klaud hold waiting for new weights")
    resolved = resolve_command(command, families=FAMILIES, default_family=FAMILY_ID)
    assert resolved.family == FAMILY_ID


# ---------------------------------------------------------------------------- markers


def test_reply_marker_is_exact() -> None:
    assert reply_marker(1234) == "<!-- klaud-command:1234 -->"


def test_answered_comments_are_found_by_marker_and_mentions_do_not_count() -> None:
    bodies = [
        f"{reply_marker(7)}\nStatus of …",
        "a human comment mentioning klaud-command:8",
        f"{reply_marker(9)}\nHeld …",
    ]
    assert answered_comments(bodies) == {7, 9}
    assert answered_comments([]) == set()


def test_one_reply_answers_every_command_of_a_comment_after_its_marker() -> None:
    hold = Hold(FAMILY_ID, "alice", "new weights", AT)
    commands = parse_commands(f"/klaud hold {FAMILY_ID} new weights\n/klaud help")
    reply = compose_reply(5, [(commands[0], render_hold(hold)), (commands[1], render_help())])
    lines = reply.splitlines()
    assert lines[0] == "<!-- klaud-command:5 -->" and reply.count("klaud-command") == 1
    assert f"**`/klaud hold {FAMILY_ID} new weights`**" in reply and "**`/klaud help`**" in reply
    assert reply.index("Held") < reply.index("Klaud commands:")
    single = compose_reply(5, [(commands[1], render_help())])
    assert single.splitlines()[0] == "<!-- klaud-command:5 -->" and "**`/klaud help`**" not in single


def test_a_reply_fits_githubs_comment_limit_with_its_marker_first() -> None:
    # 5,000 `/klaud help` lines fit in a legal comment; their answers made a 4.4 MB reply.
    commands = parse_commands("\n".join(["/klaud help"] * 5000))
    reply = compose_reply(5, [(c, render_help()) for c in commands])
    assert len(reply.encode()) <= COMMENT_LIMIT and reply.startswith(reply_marker(5)) and reply.endswith(CLIPPED)
    short = compose_reply(5, [(commands[0], render_help())], not_run=4999)
    assert short.endswith(f"4999 more `/klaud` commands were not run: at most {MAX_COMMANDS_PER_COMMENT} are run per comment.")


def test_free_text_after_a_command_is_cut_to_a_few_hundred_characters() -> None:
    [command] = parse_commands(f"/klaud hold {FAMILY_ID} " + "because " * 5000)
    assert command.target == FAMILY_ID and len(command.text) == MAX_TEXT and command.text.endswith("…")


def test_resume_while_a_canary_runs_says_so() -> None:
    reply = render_resume(False, "3 runs failed", running="c" * 33)
    assert reply == f"A canary is already running (candidate `{'c' * 33}`): when its run produces an outcome, dispatch resumes."


def test_help_lists_every_verb_and_who_may_use_it() -> None:
    text = help_text()
    for verb in VERBS.values():
        assert f"`{verb.usage}`" in text
    assert text.count("needs write access") == 4


def test_help_for_unknown_verb_names_it() -> None:
    reply = render_help(unknown_verb="frob")
    assert "`frob` is not a Klaud command" in reply
    assert "`/klaud retry [target]`" in reply
    assert "needs a verb" in render_help(unknown_verb="")


def test_refusal_echoes_the_command_and_reason() -> None:
    [command] = parse_commands("/klaud hold nope please")
    reply = render_refusal(command, "you need write access")
    assert "`/klaud hold nope please`" in reply
    assert "you need write access" in reply


def test_retry_reply_says_what_was_cleared_and_when_the_next_wave_runs() -> None:
    reply = render_retry(
        FAMILY_ID,
        "abc",
        True,
        "last attempt failed",
        datetime(2026, 11, 30, 10, 0, tzinfo=UTC),
    )
    assert "Cleared the cooldown of candidate `abc`" in reply
    assert "last attempt failed" in reply
    assert "2026-11-30 10:00 UTC" in reply


def test_retry_reply_when_nothing_was_cooling_down() -> None:
    reply = render_retry(FAMILY_ID, "abc", False, "no verified attempt", None)
    assert "nothing to clear" in reply
    assert "not known" in reply


def test_hold_reply_says_who_and_why_without_mentioning() -> None:
    reply = render_hold(Hold(FAMILY_ID, "alice", "ask @bob first", AT))
    assert "**alice**" in reply and "@alice" not in reply
    assert "`ask @bob first`" in reply
    assert f"/klaud unhold {FAMILY_ID}" in reply


def test_hold_without_reason() -> None:
    assert "no reason given" in render_hold(Hold(FAMILY_ID, "alice", "", AT))


def test_unhold_reply() -> None:
    reply = render_unhold(FAMILY_ID, Hold(FAMILY_ID, "alice", "wait", AT), "bob")
    assert "Released" in reply and "**bob**" in reply and "**alice**" in reply
    assert "was not held" in render_unhold(FAMILY_ID, None, "bob")


def test_user_text_cannot_break_out_of_code_span() -> None:
    assert code_span("a `b` c") == "``a `b` c``"
    assert code_span("`x`") == "`` `x` ``"
    assert code_span("two\nlines") == "`two lines`"


def _status_view(**changes: object) -> StatusView:
    fam = family()
    values: dict[str, object] = {
        "family": fam,
        "staleness": fam.image_changed_at,
        "attempts": [attempt(2, "readiness-blocked", pull_request=4012), attempt(1, None)],
        "cooldown_reason": "cooling down: last attempt readiness-blocked",
        "cooldown_until": datetime(2026, 12, 1, 8, 0, tzinfo=UTC),
        "overlaps": [Overlap(4013, "image", "PR #4013 changes this family's image line")],
        "hold": None,
        "next_decision": Decision(
            FAMILY_ID, fam.candidate, "cooldown", "cooling down until 2026-12-01"
        ),
        "next_wave_at": datetime(2026, 11, 30, 10, 0, tzinfo=UTC),
        "repo": "acme/bench",
    }
    values.update(changes)
    return StatusView(**values)  # type: ignore[arg-type]


def test_status_shows_everything_about_the_family() -> None:
    reply = render_status(_status_view())
    fam = family()
    assert f"`{fam.candidate}`" in reply
    assert f"`{fam.image}`" in reply
    assert "2026-10-01 00:00 UTC" in reply  # staleness
    assert "cooling down: last attempt readiness-blocked (until 2026-12-01 08:00 UTC)" in reply
    assert "PR #4013 changes this family's image line" in reply
    assert "**cooldown**" in reply and "2026-11-30 10:00 UTC" in reply
    assert "https://github.com/acme/bench/actions/runs/2/attempts/1" in reply
    assert "[#4012](https://github.com/acme/bench/pull/4012)" in reply
    assert "unverified (artifact-expired)" in reply
    assert "| Hold | none |" in reply


def test_status_shows_hold_and_no_attempts() -> None:
    reply = render_status(
        _status_view(
            attempts=[], hold=Hold(FAMILY_ID, "alice", "weights", AT), overlaps=[], staleness=None
        ),
    )
    assert "No attempts yet." in reply
    assert "**alice**" in reply and "`weights`" in reply
    assert "| Image changed | unknown |" in reply
    assert "| Overlapping PRs | none |" in reply


def test_status_caps_the_attempts_shown() -> None:
    many = [attempt(n) for n in range(30, 0, -1)]
    reply = render_status(_status_view(attempts=many))
    assert "runs/30/attempts/1" in reply
    assert "runs/10/attempts/1" not in reply
    assert "10 older attempts not shown." in reply


def resolve(body: str, default_family: str | None):
    [command] = parse_commands(body)
    return resolve_command(command, families=FAMILIES, default_family=default_family)


def test_a_family_key_alone_after_the_verb_names_its_family() -> None:
    # DESIGN §4 "Commands": the target may be a family key alone when it is unique
    # (`/klaud retry dsr1-fp8-h200-trt`), on an issue as on any PR.
    key = FAMILIES[OTHER_ID].key
    assert resolve(f"/klaud retry {key}", None).family == OTHER_ID
    assert resolve(f"/klaud status {key}", FAMILY_ID).family == OTHER_ID
    held = resolve(f"/klaud hold {key} new weights", FAMILY_ID)
    assert (held.family, held.text) == (OTHER_ID, "new weights")


def test_a_command_without_target_on_a_klaud_pr_acts_on_its_family() -> None:
    # DESIGN §4 "Commands": on a Klaud PR the target defaults to that PR's family.
    for body in ("/klaud retry", "/klaud unhold", "/klaud status", "/klaud hold"):
        assert resolve(body, FAMILY_ID).family == FAMILY_ID, body
    assert resolve("/klaud retry", None).error == "this is not a Klaud pull request: name a family"


def test_a_mistyped_key_is_refused_not_defaulted_to_the_pull_requests_family() -> None:
    typo = resolve("/klaud retry llama70b-fp8-mi300x-vlm", FAMILY_ID)
    assert typo.family is None and typo.error is not None
    assert "did you mean `llama70b-fp8-mi300x-vllm`" in typo.error


def test_resume_when_dispatch_is_not_paused_arms_nothing() -> None:
    reply = render_resume(False, None)
    assert reply == "Dispatch is not paused: nothing to resume."


def test_status_shows_a_paused_repository() -> None:
    # DESIGN §4 "Failures before an outcome": the pause shows on `/klaud status`.
    blocked = Blocked("dispatch-paused", "dispatch paused: 3 of the 4 finished runs of wave 7 failed", AT)
    reply = render_status(_status_view(blocked=blocked))
    assert "| Dispatch | **blocked** since 2026-11-30 08:00 UTC: dispatch paused: 3 of the 4" in reply
    assert "| Dispatch |" not in render_status(_status_view())


def test_a_clipped_reply_is_exactly_githubs_65536_limit() -> None:
    # GitHub refuses (422) a comment body over 65,536 characters; a clipped reply uses it all
    # but the end of the line it was cut in.
    commands = parse_commands("\n".join(["/klaud help"] * 5000))
    reply = compose_reply(5, [(c, render_help()) for c in commands])
    assert 65_536 - 400 < len(reply.encode()) <= 65_536


def test_a_reply_of_exactly_the_limit_is_not_clipped() -> None:
    assert clip("x" * 10, 10, "…") == "x" * 10
    assert clip("x" * 11, 10, "…") == "x" * 7 + "…"  # "…" is 3 UTF-8 bytes


def test_status_shows_an_attempts_reason_code() -> None:
    failed = attempt(3, "failed", phase="baseline", reason_code="baseline-provenance-unverified")
    reply = render_status(_status_view(attempts=[failed]))
    assert "| failed |" not in reply  # outcome is bold
    row = next(line for line in reply.splitlines() if "runs/3/attempts/1" in line)
    assert "| baseline | baseline-provenance-unverified |" in row


def test_code_span_outlasts_any_run_of_backticks_in_the_text() -> None:
    # Hold reasons are user text shown in code spans: no run of backticks may close it early.
    assert code_span("a ``` b ` c") == "````a ``` b ` c````"
    assert code_span("`x") == "`` `x ``"
    assert code_span("x`") == "`` x` ``"


@pytest.mark.parametrize("body", [
    "<!--\n/klaud hold a\n-->\n/klaud status",
    "Some text\n<!-- a note\n/klaud hold a\n-->\n/klaud status",
    "<!-- one line --> \n/klaud status",
    "- ```\n  /klaud hold a\n  ```\n\n/klaud status",
    "1. ~~~\n   /klaud hold a\n   ~~~\n\n/klaud status",
    "text\u2028/klaud hold a\n/klaud status",
    "text\x0c/klaud hold a\n/klaud status",
    "/\u212alaud hold a\n/klaud status",
])
def test_what_github_hides_or_shows_as_code_or_mid_line_is_not_a_command(body: str) -> None:
    # What this catches: a command inside a multi-line HTML comment (GitHub shows nothing),
    # in a fence opened on a list item, or after a character str.splitlines breaks at but
    # Markdown does not, was run; so was one spelled with the Kelvin sign.
    assert [c.verb for c in parse_commands(body)] == ["status"]


def test_a_line_after_an_html_comment_closed_on_its_own_line_is_a_command() -> None:
    assert [c.verb for c in parse_commands("<!--\nnote\n-->\n/klaud hold a\r\n/klaud status")] == ["hold", "status"]


@pytest.mark.parametrize(("body", "verbs"), [
    # a nested item's fence closes at its content column (4): the line after is text
    ("- step\n  - ```sh\n    make\n    ```\n/klaud status\n", ["status"]),
    ("10. ```sh\n    make\n    ```\n/klaud status\n", ["status"]),
    # `<!-->` is a whole HTML comment: its own line holds `-->`
    ("<!-->\n/klaud status\n", ["status"]),
    # a fence at column 0 is outside the item: it opens a new block, which hides the command
    ("- ```\n  foo\n```\n/klaud status\n```\n", []),
])
def test_a_fence_opened_in_a_list_item_lasts_as_long_as_the_item(body: str, verbs: list[str]) -> None:
    # What this catches: such a fence closed only at an indent of 0-3 columns, whatever the
    # item's content column: in a nested item it never closed (later commands were lost),
    # and a column-0 fence outside the item was taken for its end.
    assert [c.verb for c in parse_commands(body)] == verbs


@pytest.mark.parametrize("body", [
    "Thanks! <!-- for later:\n/klaud hold a\n-->\n/klaud status",
    "Looks good <!--\n/klaud retry\n--> to me\n\n/klaud status",
])
def test_a_command_inside_an_html_comment_opened_mid_line_is_not_a_command(body: str) -> None:
    # CommonMark's inline raw HTML lets a comment opened after text span the
    # paragraph's next lines (spec "Raw HTML", `foo <!-- this is a --\ncomment -->`);
    # GitHub shows none of it, and README says HTML comments are ignored. Only a comment
    # opening a line (HTML block 2) was followed, so the hidden command ran.
    assert [c.verb for c in parse_commands(body)] == ["status"]


@pytest.mark.parametrize("gap", ["\u00a0", "\u2003"])
def test_a_family_key_then_a_reason_after_a_unicode_space_holds_that_family_not_the_prs(gap: str) -> None:
    # `_parse_command_line` splits target from text with str.split() (any Unicode
    # space), but `resolve_command` splits a key from its reason at " " only: `/klaud hold
    # KEY<NBSP>reason` (macOS Option-Space, pasted text) on a Klaud PR held the PR's own
    # family, with "KEY<NBSP>reason" as the reason.
    key = FAMILIES[OTHER_ID].key
    [command] = parse_commands(f"/klaud hold {key}{gap}new weights")
    resolved = resolve_command(command, families=FAMILIES, default_family=FAMILY_ID)
    assert resolved.family == OTHER_ID


@pytest.mark.parametrize("body", [
    "a <!-- never closed in this paragraph\n/klaud hold a\n\n-->",  # the paragraph ends first: text
    "see `<!--` here\n/klaud hold a\n-->",  # in a code span: no comment
    "a <!-- x -->\n/klaud hold a",  # closed on its own line
])
def test_an_html_comment_opener_that_opens_no_comment_hides_nothing(body: str) -> None:
    assert [c.verb for c in parse_commands(body)] == ["hold"]


@pytest.mark.parametrize("body", [
    # The line closing one mid-paragraph comment opens another: GitHub hides line 4 too.
    "Thanks <!-- one\nx\n--> and <!-- two\n/klaud hold a\n-->\n/klaud status",
    # A mid-paragraph comment opened on a line that continues an earlier hidden span.
    "ok <!--\n--> <!--\n/klaud retry\n-->\n/klaud status",
])
def test_a_comment_opened_on_the_line_that_closes_another_hides_its_lines_too(body: str) -> None:
    assert [c.verb for c in parse_commands(body)] == ["status"]


def test_an_escaped_backtick_opens_no_code_span() -> None:
    # CommonMark: `\`` is a literal backtick; taken for a span's start, it hid `<!--` after it.
    assert opens_a_comment("see \\`<!-- x `")


def test_a_comment_that_starts_before_a_backtick_wins_over_the_code_span() -> None:
    # Whichever starts first wins (CommonMark): this comment is closed on its own line.
    assert not opens_a_comment("note <!-- a ` --> b `")
    assert [c.verb for c in parse_commands("note <!-- a ` --> b `\n/klaud retry fam\n-->")] == ["retry"]


def test_a_paragraph_of_unclosed_comment_openers_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each `a <!--` line scanned the rest of the paragraph for its `-->`: 20,000 such lines
    # (a 120 KB comment) held the event loop for minutes.
    scans: list[int] = []
    scan = commands_module._comment_end
    monkeypatch.setattr(commands_module, "_comment_end", lambda lines, number: (scans.append(number), scan(lines, number))[1])
    found = parse_commands("\n".join(["a <!--"] * 2000) + "\n/klaud status")
    assert [c.verb for c in found] == ["status"]  # closed nowhere, the openers are text
    assert scans == [1]


def test_a_backslash_before_a_closing_backtick_does_not_keep_the_span_open() -> None:
    # Backslash escapes do not work in a code span: `foo\` is one, and the `<!--` after it
    # opens a comment GitHub hides up to `-->`.
    assert parse_commands("x `foo\\` <!-- y `\n/klaud status\n-->") == []


@pytest.mark.parametrize("body", [
    "\\<!-- x\n/klaud status\n-->",  # an escaped `<` opens no comment
    "a <!--\n===\n/klaud status\n-->",  # a setext underline ends the paragraph (a heading)
    "a <!--\n-\n/klaud status\n-->",  # so does `-`
    "# a <!--\n/klaud status\n-->",  # an ATX heading is one line: its `<!--` is text
])
def test_a_command_github_shows_after_a_comment_opener_that_opens_none_runs(body: str) -> None:
    assert [c.verb for c in parse_commands(body)] == ["status"]


def test_an_indented_line_after_a_heading_is_code() -> None:
    # CommonMark: a heading holds no paragraph, so the indented line is an indented code block.
    assert parse_commands("# Title\n    /klaud status") == []
