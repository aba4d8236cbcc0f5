"""The status page in a real browser: Klaud on the bundled demo scenario, its pages loaded in
headless Chromium (Debian's `chromium`), checked for what a person sees, and screenshotted.

Chromium is driven over the DevTools protocol with aiohttp's WebSocket client (no extra
dependency): one browser for every page, and `innerText` is the text as rendered, so hidden
text would not count as seen. Screenshots go to a temporary folder, or to the folder named by
KLAUD_SCREENSHOTS (`KLAUD_SCREENSHOTS=docs` refreshes the README's), so a test run never
rewrites tracked files behind anyone's back.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.sandbox import load_scenario
from tests import scenarios as sc
from tests.harness import SandboxRun, sandbox_stack

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH (Debian: apt-get install chromium)")

REPO = "acme/bench"
COOLING = "configs/nvidia-master.yaml:kimik2.5-fp4-b300-vllm"  # its run 28123456704 failed
COOLING_RUN = 28123456704
WIDTH = 1400
DEVTOOLS = re.compile(r"DevTools listening on (ws://\S+)")


class Chromium:
    """One headless Chromium page over the DevTools protocol."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        number = next(self.ids)
        await self.socket.send_json({"id": number, "method": method, "params": params})
        while True:
            message = await self.socket.receive_json(timeout=30)
            if message.get("id") == number:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    async def open(self, url: str) -> None:
        self.events.clear()
        await self.call("Page.navigate", url=url)
        while not any(event.get("method") == "Page.loadEventFired" for event in self.events):
            self.events.append(await self.socket.receive_json(timeout=30))

    async def evaluate(self, expression: str) -> Any:
        answer = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return answer["result"].get("value")

    async def screenshot(self, path: Path) -> None:
        """The whole page down to the end of its content, at WIDTH pixels wide."""
        height = await self.evaluate("Math.ceil(document.body.getBoundingClientRect().bottom) + 16")
        clip = {"x": 0, "y": 0, "width": WIDTH, "height": height, "scale": 1}
        shot = await self.call("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))


@pytest.fixture
async def chromium(tmp_path) -> AsyncIterator[Chromium]:
    assert CHROMIUM is not None
    process = await asyncio.create_subprocess_exec(
        CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium'}", f"--window-size={WIDTH},1000", "--remote-debugging-port=0",
        "about:blank",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        browser_url = await asyncio.wait_for(_devtools_url(process), timeout=30)
        port = re.search(r":(\d+)/", browser_url)
        assert port is not None
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port[1]}/json/list") as response:
                [page] = [t for t in await response.json() if t["type"] == "page"]
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                browser = Chromium(socket)
                await browser.call("Page.enable")
                await browser.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=1000,
                                   deviceScaleFactor=1, mobile=False)
                yield browser
    finally:
        process.kill()
        await process.wait()


async def _devtools_url(process: asyncio.subprocess.Process) -> str:
    assert process.stderr is not None
    async for line in process.stderr:
        found = DEVTOOLS.search(line.decode(errors="replace"))
        if found:
            return found[1]
    raise AssertionError(f"Chromium exited ({await process.wait()}) without opening its DevTools port")


async def demo_with_history(run: SandboxRun) -> None:
    """The demo's timeline, then three waves two hours apart whose runs end in a mix of ways."""
    await run.sandbox.run_timeline()
    await run.settle()
    endings = itertools.cycle([
        sc.diagnostics("validated", "final-sweep", pull_request=4200, run_ids=[1]),
        sc.diagnostics("readiness-blocked"),
        sc.diagnostics("capacity-deferred"),
    ])
    for _ in range(3):
        wave = await run.klaud.waves.run(REPO, trigger="test")
        await run.settle()
        for made in [d for d in run.github()["dispatches"] if d["inputs"]["wave"] == str(wave.wave)][:3]:
            artifact = {"name": f"klaud-candidate-{made['inputs']['candidate']}", "expired": False,
                        "files": {"candidate-diagnostics.json": next(endings)}}
            await run.act({"action": "complete_run", "repo": REPO,
                           "run": {"id": made["run_id"], "conclusion": "success", "artifacts": [artifact]}})
        await run.act({"action": "advance_clock", "seconds": 2 * 3600})


def screenshots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("KLAUD_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def test_a_person_sees_every_family_the_reasons_and_the_plots(tmp_path, chromium):
    async with sandbox_stack(tmp_path, load_scenario(None)) as run:
        await demo_with_history(run)
        families = [f.id for f in run.klaud.live.repo(REPO).catalog]
        folder = screenshots(tmp_path)

        await chromium.open(f"{run.admin_url}/")
        seen = await chromium.evaluate("document.body.innerText")
        assert REPO in seen and "Next wave's decisions" in seen
        await chromium.screenshot(folder / "status-index.png")

        await chromium.open(f"{run.admin_url}/repos/{REPO}")
        seen = await chromium.evaluate("document.body.innerText")
        missing = [family for family in families if family not in seen]
        assert not missing, f"families not shown: {missing}"
        assert "held by alice since 2026-11-30 08:00 UTC: waiting for ROCm 7.3 validation" in seen
        assert "PR #4101 changes this family's image line" in seen
        plots = await chromium.evaluate(
            "[...document.querySelectorAll('svg.plot')].map(s => [s.getBoundingClientRect().width,"
            " s.querySelectorAll('path').length])"
        )
        assert len(plots) == 2 and all(width > 300 and paths > 0 for width, paths in plots), plots
        assert await chromium.evaluate("document.scripts.length") == 0  # nothing needs JavaScript
        await chromium.screenshot(folder / "status-page.png")

        await chromium.open(f"{run.admin_url}/repos/{REPO}/families/{COOLING}")
        seen = await chromium.evaluate("document.body.innerText")
        assert "cooling down until" in seen and "failed" in seen
        run_link = f"https://github.com/{REPO}/actions/runs/{COOLING_RUN}"
        assert await chromium.evaluate(f"document.querySelectorAll('a[href=\"{run_link}\"]').length") == 1
        await chromium.screenshot(folder / "status-family.png")

    for name in ("status-index.png", "status-page.png"):
        assert (folder / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
