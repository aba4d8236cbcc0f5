"""The admin listener's edges: image ages dated ahead, family keys with dot segments, the
bearer scheme's case, `/state` beside `/plan` when disabled, and caching (each failed
before its fix)."""
from __future__ import annotations

import asyncio
import html
import re
from dataclasses import replace
from datetime import timedelta
from urllib.parse import unquote, urljoin

import yaml

from tests import scenarios as sc
from tests.harness import running_klaud, sandbox_stack
from tests.web.test_ingest import make_klaud

REPO = sc.REPO


def quoted(key: str) -> str:
    return yaml.safe_dump(key, default_style='"').strip()


async def raw_status(admin_url: str, path: str) -> int:
    """GET `path` exactly as given (no client-side normalisation)."""
    host, port = admin_url[len("http://"):].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return int(answer.split(b" ", 2)[1])


async def test_repository_page_survives_image_changes_dated_after_now(tmp_path):
    # blame's committedDate is the committer date (client-set) and pushed_at is GitHub's clock:
    # either can be later than Klaud's clock. Every family "changed in 3 h" -> ages < 0.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        state = run.klaud.live.repo(REPO)
        future = run.klaud.clock.now() + timedelta(hours=3)
        for family in list(state.catalog):
            state.catalog._add(replace(family, image_changed_at=future))
        async with run.klaud.session.get(f"{run.admin_url}/repos/acme/bench") as response:
            assert response.status == 200, await response.text()


def with_dot_segment_families() -> dict:
    """The scenario plus two families whose keys hold a `..` and a `.` path segment."""
    scenario = sc.scenario()
    block = "  image: x/y:1\n  model: m\n  model-prefix: m\n  runner: b200\n  precision: fp4\n  framework: sglang\n"
    scenario["repositories"][0]["files"]["configs/odd-master.yaml"] = "".join(
        quoted(key) + ":\n" + block for key in ("a/../b", "a/./b")
    )
    return scenario


async def family_links(run) -> list[str]:
    async with run.klaud.session.get(f"{run.admin_url}/repos/acme/bench") as response:
        body = await response.text()
    return [html.unescape(link) for link in re.findall(r'href="(/repos/acme/bench/families/[^"]+)"', body)]


async def test_every_family_link_on_the_repository_page_opens_its_family(tmp_path):
    async with sandbox_stack(tmp_path, with_dot_segment_families()) as run:
        links = await family_links(run)
        assert len(links) == 7
        for link in links:  # resolved as a browser resolves an href (RFC 3986 dot segments)
            path = urljoin(f"{run.admin_url}/repos/acme/bench", link)[len(run.admin_url):]
            assert await raw_status(run.admin_url, path) == 200, (link, path)


async def test_a_family_link_with_a_dot_segment_opens_its_family_where_escaped_dots_are_resolved(tmp_path):
    # What this catches: `..` was escaped as `%2E%2E`, which browsers (WHATWG URL) and yarl
    # resolve as a dot segment all the same: the link led to a 404.
    async with sandbox_stack(tmp_path, with_dot_segment_families()) as run:
        links = await family_links(run)
        for key in ("a/../b", "a/./b"):
            [link] = [link for link in links if unquote(link).endswith(f":{key}")]
            async with run.klaud.session.get(f"{run.admin_url}{link}") as answer:  # yarl resolves them
                assert answer.status == 200, link
                assert f'<h1><span class="path">configs/odd-master.yaml:</span>{key}</h1>' in await answer.text()
        # Every other family keeps the link it had: its id, as it reads.
        plain = {f"/repos/acme/bench/families/{family}" for family in sc.FAMILIES}
        assert plain <= set(links)


async def test_the_bearer_scheme_is_case_insensitive(tmp_path):
    # RFC 9110 §11.1: "It uses a case-insensitive token to identify the authentication scheme".
    async with running_klaud(make_klaud(tmp_path), admin_token="s3cret") as run:
        assert (await run.get_json("/api/v1/repos", {"Authorization": "bearer s3cret"}))[0] == 200


async def test_state_and_plan_agree_on_blocked_for_a_disabled_repository(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="enabled: false\n")) as run:
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/plan") as r:
            plan = await r.json()
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/state") as r:
            state = await r.json()
        assert plan["blocked"] == state["blocked"], (plan["blocked"], state["blocked"])


async def test_api_documents_with_private_data_are_not_cacheable(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        for path in ("/api/v1/repos/acme/bench/state", "/api/v1/repos/acme/bench/plan", "/api/v1/repos/acme/bench/waves",
                     "/api/v1/repos/acme/nothing/state", "/repos/acme/bench", "/metrics"):
            async with run.klaud.session.get(f"{run.admin_url}{path}") as r:
                assert r.headers.get("Cache-Control") == "no-store", path
