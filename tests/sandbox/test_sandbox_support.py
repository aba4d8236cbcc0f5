"""Shared pieces for the sandbox tests: a small scenario, a client, a webhook receiver."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from bot.sandbox import Sandbox

MASTER = """\
dsr1-fp4-b200-sglang:
  image: lmsysorg/sglang:v0.5.16-cu130
  model-prefix: dsr1
  runner: b200
  precision: fp4
  framework: sglang
  scenarios:
    fixed-seq-len:
    - isl: 8192
      osl: 1024
      search-space:
      - { tp: 4, conc-start: 4, conc-end: 64 }

gptoss-fp4-h100-vllm:
  image: vllm/vllm-openai:v0.25.0
  model-prefix: gptoss
  runner: h100
  precision: fp4
  framework: vllm
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 1024
      search-space:
      - { tp: 8, conc-start: 4, conc-end: 128 }
"""
BUMPED = MASTER.replace("lmsysorg/sglang:v0.5.16-cu130", "lmsysorg/sglang:v0.5.17-cu130")
CANDIDATE_WORKFLOW = """\
name: Klaud Cold candidate
on:
  workflow_dispatch:
    inputs:
      candidate: {required: true, type: string}
      family: {required: true, type: string}
      base: {required: true, type: string}
      wave: {required: false, type: string}
"""
DIAGNOSTICS: dict[str, Any] = {"candidate-outcome": {"outcome": "capacity-deferred", "phase": "targeted",
                                     "pull-request": None, "run-ids": [], "repairs-used": 0}}

SMALL: dict[str, Any] = {
    "now": "2026-11-30T08:00:00Z",
    "capacity": {"clusters": [
        {"id": "b200-nb", "total": 8, "allocated": 2, "idle": 6},
        {"id": "h100-cw", "total": 4, "allocated": 4, "idle": 0, "stale": True},
    ]},
    "repositories": [{
        "full_name": "acme/bench",
        "installation_id": 1,
        "files": {
            "configs/nvidia-master.yaml": MASTER,
            "configs/runners.yaml": "labels:\n  b200:\n    - b200-nb_0\n",
            ".github/workflows/klaud-candidate.yml": CANDIDATE_WORKFLOW,
            ".github/workflows/run-sweep.yml": "name: Run Sweep\non: pull_request\n",
        },
        "collaborators": {"alice": "admin", "bob": "write", "carol": "read", "mo": "maintain"},
        "pulls": [{
            "number": 12, "title": "Bump SGLang", "user": "bob", "head_ref": "bump-sglang",
            "labels": ["perf"], "created_at": "2026-11-29T10:00:00Z",
            "updated_at": "2026-11-29T11:00:00Z",
            "files": [{"filename": "configs/nvidia-master.yaml", "content": BUMPED}],
        }],
        "runs": [
            {"id": 101, "workflow": "klaud-plan.yml", "event": "schedule",
             "created_at": "2026-11-30T02:00:00Z", "completed_at": "2026-11-30T06:00:00Z",
             "artifacts": [
                 {"name": "klaud-candidate-good", "files": {"candidate-diagnostics.json": DIAGNOSTICS}},
                 {"name": "klaud-candidate-old", "expired": True,
                  "files": {"candidate-diagnostics.json": DIAGNOSTICS}},
             ]},
            {"id": 102, "workflow": "klaud-candidate.yml", "conclusion": "failure",
             "created_at": "2026-11-27T02:00:00Z", "completed_at": "2026-11-27T03:00:00Z"},
        ],
    }],
}


def small_scenario(**top: Any) -> dict[str, Any]:
    scenario = copy.deepcopy(SMALL)
    scenario.update(top)
    return scenario


def repo_of(scenario: dict[str, Any]) -> dict[str, Any]:
    repository: dict[str, Any] = scenario["repositories"][0]
    return repository


@dataclass
class Hub:
    """A sandbox served on 127.0.0.1 and a client for it."""

    sandbox: Sandbox
    client: TestClient
    token: str = "token anything"

    async def api(self, method: str, path: str, **kwargs: Any) -> ClientResponse:
        headers = {"Authorization": self.token, **kwargs.pop("headers", {})}
        return await self.client.request(method, "/_sandbox/github" + path, headers=headers,
                                         allow_redirects=False, **kwargs)

    async def json(self, method: str, path: str, status: int = 200, **kwargs: Any) -> Any:
        response = await self.api(method, path, **kwargs)
        assert response.status == status, await response.text()
        return await response.json()

    async def act(self, **action: Any) -> dict[str, Any]:
        response = await self.client.post("/_sandbox/act", json=action)
        assert response.status == 200, await response.text()
        result: dict[str, Any] = await response.json()
        return result

    def state(self) -> dict[str, Any]:
        document: dict[str, Any] = self.sandbox.state_document()["repositories"]["acme/bench"]
        return document


async def serve(sandbox: Sandbox) -> AsyncIterator[Hub]:
    async with TestClient(TestServer(sandbox.create_app(), host="127.0.0.1")) as client:
        yield Hub(sandbox, client)


@dataclass
class Receiver:
    """A stand-in for the bot's /webhook: records every delivery, answers `status`."""

    url: str = ""
    status: int = 202
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((dict(request.headers), await request.read()))
        return web.json_response({"queued": True}, status=self.status)


def events(target: Receiver) -> list[tuple[str, dict[str, Any]]]:
    """What `target` received: (X-GitHub-Event, payload), in order."""
    return [(headers["X-GitHub-Event"], json.loads(body)) for headers, body in target.received]
