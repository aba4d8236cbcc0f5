"""`klaud doctor`: is a repository ready for Klaud? (DESIGN §3.1)

Each check turns what was read of the installation and the repository into one line a
person can act on: what is wrong and how to fix it. The reading is done elsewhere
(`bot.services.doctor`); these rules are pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from bot.core.catalog import CLUSTER_PREFIX, config_problems, runner_of_problem
from bot.core.domain import CapacityReading, Family
from bot.core.setup import SetupError, workflow_path

# What Klaud asks for in app.yaml (tests/core/test_doctor.py keeps the two equal).
REQUIRED_PERMISSIONS: Mapping[str, str] = {
    "metadata": "read",
    "contents": "write",
    "pull_requests": "read",
    "issues": "write",
    "actions": "write",
    "checks": "write",
}
REQUIRED_EVENTS = frozenset(
    {"pull_request", "push", "workflow_run", "issue_comment", "issues", "check_run", "check_suite", "repository_dispatch",
     "repository"}
)
_LEVELS = {"none": 0, "read": 1, "write": 2, "admin": 3}
_RUN_NAME_RE = re.compile(r"^run-name:(?P<title>.*)$", re.MULTILINE)
_EXPRESSION_RE = re.compile(r"\$\{\{(?P<expression>.*?)\}\}")


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    ok: bool
    detail: str
    hint: str = ""  # how to fix it, when it failed

    def document(self) -> dict[str, object]:
        return {"check": self.name, "ok": self.ok, "detail": self.detail, "hint": self.hint}

    def line(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        fix = f" (fix: {self.hint})" if self.hint and not self.ok else ""
        return f"{mark}  {self.name}: {self.detail}{fix}"


def permission_check(granted: Mapping[str, str]) -> Check:
    missing = [
        f"{name}: {level}" for name, level in REQUIRED_PERMISSIONS.items()
        if _LEVELS.get(granted.get(name, "none"), 0) < _LEVELS[level]
    ]
    if missing:
        return Check(
            "permissions", False, "the installation lacks " + ", ".join(missing),
            "grant them in the App's settings (Permissions), then accept them on the installation",
        )
    return Check("permissions", True, "every permission Klaud needs is granted")


def events_check(subscribed: Iterable[str]) -> Check:
    missing = sorted(REQUIRED_EVENTS - set(subscribed))
    if missing:
        return Check(
            "events", False, "the App is not subscribed to " + ", ".join(missing),
            "tick them under 'Subscribe to events' in the App's settings",
        )
    return Check("events", True, "subscribed to every event Klaud reads")


def workflow_checks(workflow: str, text: str | None, errors: Sequence[SetupError], candidate_input: str | None) -> list[Check]:
    """The candidate workflow: present, dispatchable, the inputs Klaud sends, a run-name."""
    path = workflow_path(workflow)
    if errors:
        return [
            Check("candidate workflow", False, error.detail, _workflow_hint(error.code)) for error in errors
        ]
    checks = [Check("candidate workflow", True, f"{path} takes Klaud's dispatches")]
    if candidate_input is not None and not _run_name_reads(text or "", candidate_input):
        checks.append(
            Check(
                "run-name", False, f"{path} does not name its runs with the candidate id",
                f"add `run-name: Klaud Cold candidate ${{{{ inputs.{candidate_input} }}}}` (see deploy/klaud-candidate.yml)",
            )
        )
    else:
        checks.append(Check("run-name", True, "runs are titled with the candidate id"))
    return checks


def _run_name_reads(workflow: str, candidate_input: str) -> bool:
    """Whether an expression of the workflow's run-name reads the input, in either of the
    forms GitHub gives dispatch inputs: `inputs.X` or `github.event.inputs.X`."""
    run_name = _RUN_NAME_RE.search(workflow)
    if run_name is None:
        return False
    reads = re.compile(rf"(?<![\w.-])(?:github\.event\.)?inputs\.{re.escape(candidate_input)}(?![\w-])")
    return any(reads.search(found["expression"]) for found in _EXPRESSION_RE.finditer(run_name["title"]))


def _workflow_hint(code: str) -> str:
    return {
        "candidate-workflow-missing": "add the workflow (deploy/klaud-candidate.yml is a start) or set candidate_workflow",
        "candidate-workflow-invalid": "fix the workflow's YAML",
        "candidate-workflow-not-dispatchable": "add `workflow_dispatch:` to its `on:` triggers",
        "candidate-workflow-inputs": "declare the inputs, or map Klaud's values with candidate_inputs in .github/klaud.yml",
        "candidate-workflow-input-types": "declare these inputs `type: string`, or leave them out of candidate_inputs",
    }.get(code, "see the workflow")


def policy_check(policy_error: str | None) -> Check:
    if policy_error is not None:
        return Check("policy", False, policy_error, "fix .github/klaud.yml on the default branch")
    return Check("policy", True, ".github/klaud.yml is valid (or absent: all defaults)")


def config_checks(config_errors: Mapping[str, str], runners_file: str, families: int) -> list[Check]:
    """Master configs and runners.yaml parse; every runner resolves to a declared cluster.
    One line per problem: a runners file may leave many runners unresolved, and a master
    config lists each family whose runner label resolves to no declared cluster."""
    problems = config_problems(config_errors)
    configs = [
        Check("master configs", False, detail, "fix the YAML on the default branch")
        for path, detail in problems
        if not _is_runner_problem(path, detail, runners_file)
    ]
    runners = [
        Check("runners", False, detail, _runner_hint(detail, runners_file))
        for path, detail in problems
        if _is_runner_problem(path, detail, runners_file)
    ]
    return [
        *(configs or [Check("master configs", True, f"{families} families parsed")]),
        *(runners or [Check("runners", True, "every runner resolves to a declared cluster")]),
    ]


def _is_runner_problem(path: str, problem: str, runners_file: str) -> bool:
    return path == runners_file or runner_of_problem(problem) is not None


def _runner_hint(problem: str, runners_file: str) -> str:
    runner = runner_of_problem(problem) or ""
    if runner.startswith(CLUSTER_PREFIX) and runner != CLUSTER_PREFIX:
        # `cluster:X` names its cluster outright: only the declaration is missing.
        cluster = runner.removeprefix(CLUSTER_PREFIX)
        return (f"declare {cluster} in {runners_file} (a `clusters:` key, or `{runner}` under `hardware:`),"
                " or fix the runner's name")
    return f"declare the cluster in {runners_file} or fix the runner's name"


# The fix for each way the feed cannot be used (`bot.core.capacity`'s codes); the rest are
# answers that are not a feed document.
_FEED_HINTS = {
    "capacity-feed-not-configured": "set KLAUD_CAPACITY_URL and KLAUD_CAPACITY_TOKEN to the cluster status feed",
    "capacity-token-invalid": "KLAUD_CAPACITY_TOKEN holds a character no request can carry: set it again",
    "http-401": "the feed refused KLAUD_CAPACITY_TOKEN: set the feed's current token",
    "http-403": "the feed refused KLAUD_CAPACITY_TOKEN: set a token the feed accepts",
    "http-404": "nothing at KLAUD_CAPACITY_URL: check the URL",
    "network-error": "the feed at KLAUD_CAPACITY_URL did not answer from this host: check the URL and the network",
    "feed-unavailable": "the feed says its data is unavailable: check the cluster status service",
    "stale-feed": "the feed's generatedAt is over two minutes from this host's clock: check the job that writes"
                  " the feed, and this host's clock",
    "stale-retrieval": "reading the feed took too long, or this host's clock moved: read it again",
}
_NOT_A_FEED_HINT = ("KLAUD_CAPACITY_URL answers with something other than a cluster status feed: check the URL"
                    " (the feed's own, not a page about it)")
_FEED_FAILING_HINT = "the feed's server is failing or busy: check the cluster status service, then read it again"


def _feed_hint(error: str) -> str:
    status = error.removeprefix("http-")
    if status in ("408", "429") or (status.isdigit() and 500 <= int(status) <= 599):
        return _FEED_FAILING_HINT
    return _FEED_HINTS.get(error, _NOT_A_FEED_HINT)


def capacity_check(reading: CapacityReading, families: Iterable[Family]) -> Check:
    if reading.error is not None:
        return Check("capacity feed", False, f"the feed cannot be used ({reading.error})", _feed_hint(reading.error))
    wanted = sorted({cluster for family in families for cluster in family.clusters})
    unknown = [cluster for cluster in wanted if cluster not in reading.known]
    if unknown:
        return Check(
            "capacity feed", False, "the feed does not report " + ", ".join(unknown),
            "make the feed report these cluster ids, or fix their names in runners.yaml",
        )
    invalid = [cluster for cluster in wanted if cluster in reading.invalid]
    if invalid:
        return Check(
            "capacity feed", False, "the feed's entry is invalid for " + ", ".join(invalid),
            "fix the cluster status service: each cluster needs stale, status, observedAt, receivedAt and"
            " whole, non-negative node counts that add up to totalNodes",
        )
    return Check("capacity feed", True, f"reports all {len(wanted)} clusters the families target")
