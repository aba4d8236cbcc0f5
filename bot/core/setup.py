"""Is the repository set up so that a dispatch can work? (DESIGN §4 "Setup errors").

A candidate workflow that is missing on the default branch, cannot be dispatched, does not
declare the inputs the policy sends, or types one of them `choice` or `boolean` (whose
allowed values Klaud's never are) would make GitHub refuse every dispatch: each wave
would create claims only to delete them again. These checks read the workflow's text once
per change, and while one fails the repository's waves dispatch nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict

import yaml

from bot.core.yamltext import UNREADABLE_YAML

WORKFLOWS_DIR = ".github/workflows"


class _WorkflowLoader(yaml.SafeLoader):
    """Reads a workflow as GitHub does, in YAML 1.2: `on`, `off`, `yes` and `no` are words
    there (input names among them), only `true` and `false` are booleans."""


_WorkflowLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_WorkflowLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


@dataclass(frozen=True, slots=True)
class SetupError:
    code: str  # candidate-workflow-missing | -invalid | -not-dispatchable | -inputs | -input-types
    detail: str

    def document(self) -> SetupErrorDocument:
        return {"code": self.code, "detail": self.detail}


class SetupErrorDocument(TypedDict):
    """A setup error as the repository's record keeps it (both keys required when read)."""

    code: str
    detail: str


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
        document = yaml.load(text, Loader=_WorkflowLoader)
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
    triggers = document.get("on")
    if triggers == "workflow_dispatch":
        return {}
    if isinstance(triggers, list):
        return {} if "workflow_dispatch" in triggers else None
    if isinstance(triggers, dict) and "workflow_dispatch" in triggers:
        settings = triggers["workflow_dispatch"]
        return settings if isinstance(settings, dict) else {}
    return None


def _input_errors(path: str, dispatch: dict[str, Any], sent: set[str]) -> list[SetupError]:
    inputs = dispatch.get("inputs")
    # Keys as GitHub names them: `true:` and `1:` are inputs named "true" and "1" there.
    declared = {_key_name(key): spec for key, spec in inputs.items()} if isinstance(inputs, dict) else {}
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
    return errors + _type_errors(path, declared, sent)


# Input types whose values GitHub checks against a fixed list (422 "Provided value … not in
# the list of allowed values"): Klaud's values (ids, a family, a SHA, a wave number) are
# never on such a list, so every dispatch would be refused.
_LISTED_TYPES = ("choice", "boolean")


def _type_errors(path: str, declared: dict[str, Any], sent: set[str]) -> list[SetupError]:
    listed = [
        f"{name} ({spec['type']})" for name, spec in sorted(declared.items())
        if name in sent and isinstance(spec, dict) and spec.get("type") in _LISTED_TYPES
    ]
    if not listed:
        return []
    return [
        SetupError(
            "candidate-workflow-input-types",
            f"{path} types the input(s) {', '.join(listed)} that Klaud fills with its own values, "
            "which GitHub refuses for a choice or boolean input",
        )
    ]


def _key_name(key: Any) -> str:
    return str(key).lower() if isinstance(key, bool) else str(key)
