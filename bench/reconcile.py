"""Reconcile benchmark: one full reconcile of a real-sized repository against the sandbox GitHub.

The repository holds the real InferenceX master configs and runners.yaml of the fixtures
(208 families; KLAUD_FIXTURES, default ../shared/fixtures), 200 open pull requests (each
bumps one family's image or changes its settings, the patch computed by the sandbox the way
git does) and 300 completed candidate runs of the last three days (one
`klaud-candidate-<id>` artifact each). It measures what a new installation costs: the GitHub
requests the reconcile makes (by route; none may repeat) against the budget of issue 12

    2 + configs + PRs/100 + PRs + runs/100 + artifacts

(the repository and its head; one read per master config; the open PR pages; one file list
per PR; the run pages; one download per artifact), plus what later issues added, each once:
the installation token, the policy file, the candidate workflow, runners.yaml, the listing of
the configs folder, one GraphQL blame per master config (image ages), the claim refs, the
second outcome workflow's run page, the artifact pages (all artifacts listed once, not per
run) and the dashboard issue lookup. GraphQL requests share one URL: they are counted
apart (one per master config), not as repeats.

Last line: {"requests", "budget", "budget_issue_12", "repeated", "seconds", "families",
"pulls", "attempts"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import yaml

from bot.core.domain import candidate_id
from bot.log import configure_logging
from tests import scenarios as sc
from tests.harness import sandbox_stack

REPO = "acme/bench"
NOW = "2026-11-30T08:00:00Z"


def fixtures() -> Path:
    return Path(os.environ.get("KLAUD_FIXTURES", ROOT.parent / "shared" / "fixtures"))


def families(configs: dict[str, str]) -> list[tuple[str, str, str]]:
    """(path, key, image) of every family of the master configs."""
    found = []
    for path, text in configs.items():
        if path.endswith("-master.yaml"):
            for key, block in (yaml.safe_load(text) or {}).items():
                if isinstance(block, dict) and isinstance(block.get("image"), str):
                    found.append((path, str(key), block["image"]))
    return found


def bumped(text: str, key: str, image: str, rng: random.Random) -> str:
    """The master config with `key`'s image bumped, or one of its settings changed."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
    for index in range(start + 1, len(lines)):
        line = lines[index]
        if line and not line.startswith(" "):
            break
        if rng.random() < 0.6 and line.strip() == f"image: {image}":
            lines[index] = line.replace(image, f"{image}-bump{rng.randrange(100)}")
            return "\n".join(lines)
        if "conc-end:" in line:
            lines[index] = line.replace("conc-end:", "conc-end: 1 #", 1)
            return "\n".join(lines)
    lines[start + 1] = lines[start + 1] + "  # touched"
    return "\n".join(lines)


def scenario(pull_count: int, run_count: int, seed: int = 7) -> tuple[dict[str, Any], int, int]:
    base = sc.scenario()
    repository = base["repositories"][0]
    configs_dir = fixtures() / "inferencex" / "configs"
    for name in ("nvidia-master.yaml", "amd-master.yaml", "runners.yaml"):
        repository["files"][f"configs/{name}"] = (configs_dir / name).read_text()
    fams = families(repository["files"])
    rng = random.Random(seed)
    pulls = []
    for number in range(1, pull_count + 1):
        path, key, image = rng.choice(fams)
        pulls.append({
            "number": number, "title": f"Bump {key}", "user": rng.choice(["alice", "bob", "dave"]),
            "head_ref": f"bump-{key}-{number}", "created_at": NOW, "updated_at": NOW,
            "files": [{"filename": path, "status": "modified",
                       "content": bumped(repository["files"][path], key, image, rng)}],
        })
    runs = []
    for index in range(run_count):
        path, key, image = rng.choice(fams)
        completed = f"2026-11-{28 + index % 3:02d}T{index % 24:02d}:00:00Z"
        runs.append(sc.run(5_000 + index, candidate_id(f"{path}:{key}", image),
                           rng.choice(["failed", "capacity-deferred", "readiness-blocked", "incompatible"]),
                           completed_at=completed))
    repository["pulls"] = pulls
    repository["runs"] = runs
    artifacts = sum(len(run["artifacts"]) for run in runs)
    return base, len(fams), artifacts


async def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    if not (fixtures() / "inferencex" / "configs").is_dir():
        print(f"the real-data fixtures are not at {fixtures()} (set KLAUD_FIXTURES)")
        return {"requests": None, "budget": None, "budget_issue_12": None, "repeated": None, "seconds": None}
    built, family_count, artifacts = scenario(args.pulls, args.runs)
    configs = 2  # the two master configs of the fixtures
    issue_12 = 2 + configs + math.ceil(args.pulls / 100) + args.pulls + math.ceil(args.runs / 100) + artifacts
    added = {"token": 1, "policy, workflow, runners.yaml, configs folder": 4, "blame": configs, "claim refs": 1,
             "second outcome workflow": 1, "artifact pages": math.ceil(artifacts / 100), "dashboard issue": 1}
    budget = issue_12 + sum(added.values())
    with tempfile.TemporaryDirectory(prefix="klaud-bench-reconcile-") as tmp:
        async with sandbox_stack(Path(tmp), built, reconcile=False) as run:
            run.reset_requests()
            started = time.perf_counter()
            report = await run.klaud.reconciler.reconcile(REPO, 1)
            seconds = time.perf_counter() - started
            requests = run.requests["requests"]
    by_route = Counter(entry["route"] for entry in requests)
    blames = sum(1 for r in requests if r["path"] == "/graphql")
    keys = Counter((r["method"], r["path"], r["query"]) for r in requests if r["path"] != "/graphql")
    repeated = [key for key, count in keys.items() if count > 1] + (["graphql beyond one per config"] if blames > configs else [])
    print(f"repository: {family_count} families, {args.pulls} open PRs, {args.runs} completed runs "
          f"with {artifacts} artifacts")
    print(f"budget {budget}: issue 12's {issue_12} plus {added}")
    print(f"full reconcile: {len(requests)} GitHub requests in {seconds:.2f} s (budget {budget}); "
          f"after: {report['after']}")
    for route, count in sorted(by_route.items(), key=lambda item: -item[1]):
        print(f"  {count:5d}  {route}")
    if repeated:
        print(f"repeated requests: {repeated[:10]}")
    return {
        "requests": len(requests),
        "budget": budget,
        "budget_issue_12": issue_12,
        "repeated": len(repeated),
        "seconds": round(seconds, 2),
        "families": report["after"]["families"],
        "pulls": report["after"]["pulls"],
        "attempts": report["after"]["attempts"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pulls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    configure_logging("console", logging.WARNING)
    print(json.dumps(asyncio.run(run_benchmark(args))))


if __name__ == "__main__":
    main()
