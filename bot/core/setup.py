"""Is the repository set up so that a dispatch can work? (DESIGN §4 "Setup errors").

A candidate workflow that is missing on the default branch, cannot be dispatched, or does
not declare the inputs the policy sends would make GitHub refuse every dispatch: each wave
would create claims only to delete them again. These checks read the workflow's text once
per change, and while one fails the repository's waves dispatch nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml

from bot.core.yamltext import UNREADABLE_YAML

WORKFLOWS_DIR = ".github/workflows"


@dataclass(frozen=True, slots=True)
class SetupError:
    code: str  # candidate-workflow-missing | -invalid | -not-dispatchable | -inputs
    detail: str

    def document(self) -> dict[str, str]:
        return {"code": self.code, "detail": self.detail}


def workflow_path(workflow: str) -> str:
    return f"{WORKFLOWS_DIR}/{workflow}"


def workflow_setup_errors(workflow: str, text: str | None, inputs: Iterable[str]) -> list[SetupError]:
    """What keeps `workflow` (its text on the default branch) from taking Klaud's dispatches.

    `inputs` names the workflow inputs Klaud sends (the values of the policy's
    `candidate_inputs`).
    """
    path = workflow_path(workflow)
    if text is None:
        return [SetupError("candidate-workflow-missing", f"{path} does not exist on the default branch")]
    try:
        document = yaml.safe_load(text)
    except UNREADABLE_YAML:
        return [SetupError("candidate-workflow-invalid", f"{path} is not valid YAML")]
    if not isinstance(document, dict):
        return [SetupError("candidate-workflow-invalid", f"{path} is not a workflow (no mapping at the top)")]
    dispatch = _workflow_dispatch(document)
    if dispatch is None:
        return [
            SetupError(
                "candidate-workflow-not-dispatchable",
                f"{path} has no workflow_dispatch trigger, so Klaud cannot start it",
            )
        ]
    return _input_errors(path, dispatch, set(inputs))


def _workflow_dispatch(document: dict[Any, Any]) -> dict[str, Any] | None:
    """The `workflow_dispatch` trigger's settings ({} when it has none), None without it."""
    # YAML 1.1 reads a bare `on:` key as the boolean true.
    triggers = document.get("on", document.get(True))
    if triggers == "workflow_dispatch":
        return {}
    if isinstance(triggers, list):
        return {} if "workflow_dispatch" in triggers else None
    if isinstance(triggers, dict) and "workflow_dispatch" in triggers:
        settings = triggers["workflow_dispatch"]
        return settings if isinstance(settings, dict) else {}
    return None


def _input_errors(path: str, dispatch: dict[str, Any], sent: set[str]) -> list[SetupError]:
    declared = dispatch.get("inputs")
    declared = declared if isinstance(declared, dict) else {}
    errors = []
    undeclared = sorted(sent - set(declared))
    if undeclared:
        errors.append(
            SetupError(
                "candidate-workflow-inputs",
                f"{path} does not declare the input(s) {', '.join(undeclared)} that Klaud sends "
                "(set candidate_inputs in .github/klaud.yml to the inputs it has)",
            )
        )
    unsent = sorted(
        name for name, spec in declared.items()
        if isinstance(spec, dict) and spec.get("required") and spec.get("default") is None and name not in sent
    )
    if unsent:
        errors.append(
            SetupError(
                "candidate-workflow-inputs",
                f"{path} requires the input(s) {', '.join(unsent)} that Klaud does not send",
            )
        )
    return errors
