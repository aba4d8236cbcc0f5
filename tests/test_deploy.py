"""The deployment files agree with the code: no machine here runs Docker, so what can drift
(settings names, ports, the health endpoint, what the image copies) is checked as text."""

from __future__ import annotations

import re

import yaml

from bot.settings import _ENV_FIELDS, load_settings
from tests.conftest import ROOT

DEPLOY = ROOT / "deploy"
KNOWN = set(_ENV_FIELDS) | {"KLAUD_PRIVATE_KEY_FILE"}


def env_file(name: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (DEPLOY / name).read_text().splitlines() if line and line[0] != "#")
    return {key: value for key, value in pairs}


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def test_the_image_runs_klaud_serve_as_a_user_that_is_not_root_and_checks_healthz() -> None:
    text = dockerfile()
    users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert 'ENTRYPOINT ["klaud"]' in text and 'CMD ["serve"]' in text
    healthcheck = text.split("\nHEALTHCHECK ", 1)[1].split("\nENTRYPOINT", 1)[0]
    assert "/healthz" in healthcheck and "KLAUD_PORT" in healthcheck


def test_the_image_copies_what_the_package_needs_and_the_context_keeps_secrets_out() -> None:
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", dockerfile(), re.MULTILINE)
    for sources in copied:
        for source in sources.split():
            assert (ROOT / source).exists(), f"the Dockerfile copies {source}, which is not in the repository"
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {"deploy/*.env", "deploy/*.pem", ".git"} <= set(ignored)


def test_the_image_settings_are_settings_klaud_knows_and_accepts() -> None:
    image_env = dict(re.findall(r"(KLAUD_\w+)=(\S+)", dockerfile()))
    assert set(image_env) <= KNOWN
    # The store's folder is the image's volume, absent here: the URL is compared as text.
    assert image_env.pop("KLAUD_DB") == "sqlite:////var/lib/klaud/klaud.db"
    settings = load_settings(image_env)
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)


def test_compose_runs_klaud_on_its_postgresql_with_secrets_from_files_and_loopback_ports() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    klaud, postgres = compose["services"]["klaud"], compose["services"]["postgres"]
    assert klaud["depends_on"]["postgres"]["condition"] == "service_healthy" and "healthcheck" in postgres
    assert klaud["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    assert all(port.startswith("127.0.0.1:") for port in klaud["ports"])
    assert klaud["environment"]["KLAUD_PRIVATE_KEY_FILE"] == "/run/secrets/github-app-key"
    assert set(klaud["environment"]) <= KNOWN
    assert compose["secrets"]["github-app-key"]["file"] == "github-app.pem"
    # The example env files: every name a setting, every value one Klaud accepts, and the
    # database URL pointing at the compose service with the password postgres.env sets.
    example = env_file("klaud.env.example")
    assert set(example) <= KNOWN
    load_settings({**example, **klaud["environment"], "KLAUD_PRIVATE_KEY_FILE": ""})
    password = env_file("postgres.env.example")["POSTGRES_PASSWORD"]
    user, database = postgres["environment"]["POSTGRES_USER"], postgres["environment"]["POSTGRES_DB"]
    assert example["KLAUD_DB"] == f"postgresql://{user}:{password}@postgres:5432/{database}"


# What GitHub lets an expression read in a workflow's and a job's `env` (its contexts table);
# any other context there makes it refuse the whole workflow ("Unrecognized named-value").
ENV_CONTEXTS = {"workflow": {"github", "inputs", "vars", "secrets"},
                "job": {"github", "needs", "strategy", "matrix", "vars", "secrets", "inputs"}}
_CONTEXT_RE = re.compile(r"\$\{\{(.*?)\}\}")
_NAME_RE = re.compile(r"(?<![\w.'\"-])([a-z_]+)(?=\.|\[)")


def contexts_read(values: dict[str, object]) -> set[str]:
    return {name for value in values.values() for expression in _CONTEXT_RE.findall(str(value))
            for name in _NAME_RE.findall(expression)}


def test_the_reference_candidate_workflow_reads_only_contexts_github_allows_in_its_env() -> None:
    # What this catches: `${{ runner.temp }}` in the job's env, which GitHub refuses, so every
    # dispatch of a workflow copied from this file failed.
    workflow = yaml.safe_load((DEPLOY / "klaud-candidate.yml").read_text())
    assert contexts_read(workflow.get("env") or {}) <= ENV_CONTEXTS["workflow"]
    for name, job in workflow["jobs"].items():
        assert contexts_read(job.get("env") or {}) <= ENV_CONTEXTS["job"], name
    assert contexts_read({"x": "${{ runner.temp }}/a"}) == {"runner"}


def steps_run(job: dict, failing: str | None) -> list[str]:
    """The steps of `job` GitHub runs when the step named `failing` fails (the others succeed),
    by its rules for `if:`: `success()` when absent, a skipped step's outcome `skipped`.
    Enough of GitHub's expressions for this file: `always()`, `success()`, `&&`,
    `steps.<id>.outcome` and string comparisons."""
    ran, outcomes, failed = [], {}, False
    for step in job["steps"]:
        name = step.get("name") or step.get("uses")
        condition = re.sub(r"steps\.(\w+)\.outcome", lambda m: f"outcomes.get({m[1]!r}, 'skipped')",
                           step.get("if", "success()"))
        condition = condition.replace("&&", " and ").replace("always()", "True").replace("success()", "not failed")
        runs = eval(condition, {"outcomes": outcomes, "failed": failed})  # the expressions of our own file
        outcome = "skipped" if not runs else "failure" if name == failing else "success"
        failed = failed or outcome == "failure"
        if "id" in step:
            outcomes[step["id"]] = outcome
        if runs:
            ran.append(name)
    return ran


def test_the_reference_candidate_workflow_uploads_an_outcome_exactly_when_its_session_ran() -> None:
    # What this catches: an upload `if: always()` recorded `unexpected-error` (a verified
    # outcome: a cooldown) for a run that failed before its session, so a wave whose runs all
    # failed at checkout cooled five candidates down, wave after wave, and never paused.
    [job] = yaml.safe_load((DEPLOY / "klaud-candidate.yml").read_text())["jobs"].values()
    upload, fallback = "Upload the candidate's outcome", "Record an outcome when the session left none"
    for failing in (None, "Run the candidate session"):
        assert {upload, fallback} <= set(steps_run(job, failing)), failing
    for failing in ("Name the outcome file", "actions/checkout@v4"):
        assert upload not in steps_run(job, failing) and fallback not in steps_run(job, failing), failing


def test_readme_upgrades_lists_every_migration() -> None:
    # README "Upgrades" names migrations 1-7; bot/store/migrations.py has an 8th
    # (the index of failed deliveries), which an operator reading a store's version misses.
    from bot.store.migrations import MIGRATIONS

    text = " ".join((ROOT / "README.md").read_text().split())
    listed = re.search(r"\(`bot/store/migrations.py`: (.*?)\) under a lock", text)
    assert listed is not None
    numbers = [int(n) for n in re.findall(r"(?:^|, )(\d+) ", listed.group(1))]
    assert numbers == [migration.version for migration in MIGRATIONS]
