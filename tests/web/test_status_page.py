"""The status page on the admin listener (DESIGN §3.3, issue 14 item 1), against a Klaud on
the sandbox: what each page lists, its plots, sorting and filtering by query parameters,
the family page's attempts, 404s, the admin token, and escaping of text people typed."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

import pytest

from tests import scenarios as sc
from tests.harness import SandboxRun, sandbox_stack

REPO = sc.REPO
B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"  # overlapped by PR #12
H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"  # cooling down after run 301
GPTOSS = "configs/nvidia-master.yaml:gptoss-fp4-b200-vllm"  # held
HOSTILE = '<script>alert("held")</script> & <b>bold</b>'
FAMILY_LINK = re.compile(r'href="/repos/acme/bench/families/([^"]+)"')


def scenario() -> dict[str, Any]:
    return sc.scenario(pulls=[sc.image_bump(12)], runs=[sc.run(301, sc.candidate(H200), "readiness-blocked")])


async def one_wave_with_an_outcome(run: SandboxRun) -> str:
    """A wave, then one of its dispatched runs ends `validated`; answers that candidate."""
    wave = await run.klaud.waves.run(REPO, trigger="test")
    await run.settle()
    made = run.github()["dispatches"][0]
    candidate = made["inputs"]["candidate"]
    assert candidate in wave.selected
    artifact = {"name": f"klaud-candidate-{candidate}", "expired": False,
                "files": {"candidate-diagnostics.json": sc.diagnostics("validated", "final-sweep", pull_request=77, run_ids=[900])}}
    await run.act({"action": "complete_run", "repo": REPO,
                   "run": {"id": made["run_id"], "conclusion": "success", "artifacts": [artifact]}})
    return candidate


@pytest.fixture
async def run(tmp_path) -> AsyncIterator[SandboxRun]:
    async with sandbox_stack(tmp_path, scenario()) as running:
        await running.act({"action": "comment", "repo": REPO, "number": 12, "user": "alice",
                           "body": f"/klaud hold {GPTOSS} {HOSTILE}"})
        await one_wave_with_an_outcome(running)
        yield running


async def get(run: SandboxRun, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    async with run.klaud.session.get(f"{run.admin_url}{path}", headers=headers) as response:
        return response.status, await response.text(), response.headers


async def page(run: SandboxRun, path: str) -> str:
    status, body, headers = await get(run, path)
    assert status == 200, body
    assert headers["Content-Type"].startswith("text/html")
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none' forbids scripts
    return body


def listed_families(body: str) -> list[str]:
    """The families of the table, in its order (only the table links to family pages)."""
    return [unquote(link) for link in FAMILY_LINK.findall(body)]


async def test_the_index_lists_each_repository_with_its_last_wave_decisions_and_freshness(run):
    body = html.unescape(await page(run, "/"))
    assert 'href="/repos/acme/bench"' in body
    assert "#1 at 2026-11-30 08:00 UTC" in body
    plan = await run.klaud.plan_document(REPO)
    for kind, count in Counter(d["decision"] for d in plan["decisions"]).items():
        assert f">{count} {kind}</a>" in body
    assert "365.0 / 365.0 / 365.0" in body  # p50 / p90 / max: the scenario's head is a year old


async def test_the_repository_page_lists_every_family_with_its_decision_and_reason(run):
    body = await page(run, "/repos/acme/bench")
    assert sorted(listed_families(body)) == sorted(sc.FAMILIES)
    text = html.unescape(body)
    assert "PR #12 changes this family's image line" in text
    assert "last attempt readiness-blocked (run 301)" in text
    assert 'href="https://github.com/acme/bench/pull/12"' in body
    assert "validated" in text  # the dispatched run's outcome, as its family's last outcome


async def test_the_repository_page_draws_freshness_and_wave_history_as_svg(run):
    body = await page(run, "/repos/acme/bench")
    assert body.count('<svg class="plot"') == 2
    assert 'aria-label="Histogram of image age in days, with p50 and p90 marked"' in body
    assert ">p50 365.0 d<" in body and ">p90 365.0 d<" in body
    assert 'aria-label="Per wave: dispatched candidates by outcome, and decisions per kind"' in body
    assert '<path class="o-validated"' in body  # the outcome of the wave's dispatched run
    assert re.search(r"<title>Wave 1 at 2026-11-30 08:00 UTC: \d dispatched \(1 validated, \d pending\);", body)


async def test_filters_and_sorting_by_query_parameters(run):
    plan = await run.klaud.plan_document(REPO)
    cooling = await page(run, "/repos/acme/bench?decision=cooldown")
    assert H200 in listed_families(cooling)
    assert listed_families(cooling) == [d["family"] for d in plan["decisions"] if d["decision"] == "cooldown"]
    assert "<option selected>cooldown</option>" in cooling
    by_text = await page(run, "/repos/acme/bench?q=DSR1")
    assert sorted(listed_families(by_text)) == sorted(f for f in sc.FAMILIES if "dsr1" in f)
    by_name = await page(run, "/repos/acme/bench?sort=family")
    assert listed_families(by_name) == sorted(sc.FAMILIES)
    reverse = await page(run, "/repos/acme/bench?sort=family&dir=desc")
    assert listed_families(reverse) == sorted(sc.FAMILIES, reverse=True)
    # The header links keep the filter and turn the current sort column round.
    assert 'href="?sort=family&amp;dir=asc&amp;decision=cooldown"' in await page(
        run, "/repos/acme/bench?sort=family&dir=desc&decision=cooldown"
    )
    assert listed_families(await page(run, "/repos/acme/bench?decision=nonsense")) == []
    assert listed_families(await page(run, "/repos/acme/bench?sort=nonsense")) != []


async def test_the_family_page_shows_its_attempts_with_links_to_runs(run):
    body = await page(run, f"/repos/acme/bench/families/{H200}")
    text = html.unescape(body)
    assert "readiness-blocked" in text and "cooling down until" in text
    assert 'href="https://github.com/acme/bench/actions/runs/301"' in body
    assert 'aria-label="Attempts of this family over time, coloured by outcome"' in body
    overlapped = html.unescape(await page(run, f"/repos/acme/bench/families/{B200}"))
    assert "PR #12 changes this family's image line" in overlapped
    assert 'href="https://github.com/acme/bench/pull/12"' in overlapped


async def test_names_are_case_insensitive_and_unknown_ones_answer_a_friendly_404(run):
    assert listed_families(await page(run, "/repos/ACME/Bench")) != []
    assert "dsr1-fp8-h200-trt" in await page(run, f"/repos/Acme/BENCH/families/{H200}")
    for path, says in [
        ("/repos/acme/nope", "acme/nope is not an installed repository."),
        ("/repos/acme/nope/families/configs/x-master.yaml:y", "acme/nope is not an installed repository."),
        ("/repos/acme/bench/families/configs/x-master.yaml:y", "acme/bench has no family configs/x-master.yaml:y."),
    ]:
        status, body, headers = await get(run, path)
        assert (status, headers["Content-Type"].split(";")[0]) == (404, "text/html"), path
        assert says in html.unescape(body) and 'href="/"' in body


async def test_a_family_that_leaves_the_configs_while_its_page_reads_the_capacity_feed_answers_404(tmp_path):
    # What this catches: the page looked its family up before the capacity read and its
    # decision after, in a plan that no longer had it: a 500.
    gone = "configs/amd-master.yaml:llama70b-fp8-mi300x-vllm"
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        capacity = run.klaud.status.waves.capacity
        real_read, reading, release = capacity.read, asyncio.Event(), asyncio.Event()

        async def slow_read():  # the feed answering slowly (up to 15 s a try, three tries)
            reading.set()
            await release.wait()
            return await real_read()

        capacity.read = slow_read
        asked = asyncio.create_task(get(run, f"/repos/acme/bench/families/{gone}"))
        await reading.wait()
        without = sc.AMD[: sc.AMD.index("llama70b-fp8-mi300x-vllm:")]
        await run.act({"action": "push_default", "repo": REPO, "files": {"configs/amd-master.yaml": without}})
        assert gone not in [f["family"] for f in run.state()["families"]]
        release.set()
        status, body, _ = await asked
        assert status == 404, body[:300]
        assert f"acme/bench has no family {gone}." in html.unescape(body)


async def test_text_people_typed_is_escaped(run):
    for path in ("/repos/acme/bench", f"/repos/acme/bench/families/{GPTOSS}"):
        body = await page(run, path)
        assert "<script>" not in body and "<b>bold</b>" not in body, path
        assert "&lt;script&gt;alert(&#34;held&#34;)&lt;/script&gt; &amp; &lt;b&gt;bold&lt;/b&gt;" in body, path


async def test_the_admin_token_guards_the_pages(tmp_path):
    async with sandbox_stack(tmp_path, scenario(), env={"KLAUD_ADMIN_TOKEN": "t0ken"}) as run:
        for path in ("/", "/repos/acme/bench", f"/repos/acme/bench/families/{H200}"):
            assert (await get(run, path))[0] == 401, path
            assert (await get(run, path, {"Authorization": "Bearer t0ken"}))[0] == 200, path


@pytest.mark.parametrize("stored", [b"{}", b"[1]", b'{"wave": 1, "decisions": []}'])
async def test_a_stored_wave_of_the_wrong_shape_is_reported_and_passed_over(run, stored):
    # What this catches (a review): a wave document written by hand, or kept by an older
    # Klaud (`{"wave", "decisions"}` only), answered 500 on `/` for every repository, and
    # on the repository's page, its wave history and the dashboard's render.
    from structlog.testing import capture_logs

    from bot.store.engine import Statement

    await run.klaud.db.transaction([Statement("UPDATE waves SET encoding = NULL, body = ?", (stored,))])
    with capture_logs() as logs:
        assert REPO in await page(run, "/")
        assert "wave history" in (await page(run, f"/repos/{REPO}")).lower()
        status, body, _ = await get(run, f"/api/v1/repos/{REPO}/waves")
    assert status == 200 and json.loads(body) == []
    assert {(e["event"], e["kind"]) for e in logs if e["log_level"] == "warning"} == {("store.record_unreadable", "wave")}


@pytest.mark.parametrize("odd", [["selected"], {"kind": "selected"}, 7])
async def test_a_stored_wave_whose_values_are_of_another_type_is_passed_over_at_load_and_on_the_page(run, odd):
    # What this catches (a review): a wave document with every key but a decision that is
    # a list read as a wave; counting its decisions at start-up (the metrics of the last
    # wave) raised, and `klaud serve` failed at every start (with replicas, no replica
    # could take the repository), and the status page answered 500.
    from bot.store.engine import Statement

    [stored] = await run.klaud.db.fetch("SELECT number FROM waves")
    document = (await run.klaud.live.stored_wave(REPO, stored[0])).document()
    document["decisions"][0]["decision"] = odd
    await run.klaud.db.transaction([Statement("UPDATE waves SET encoding = NULL, body = ?", (json.dumps(document).encode(),))])
    await run.klaud.live.load()  # what start-up does
    assert run.klaud.live.repo(REPO) is not None
    assert REPO in await page(run, "/")
