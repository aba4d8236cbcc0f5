"""Per-repository policy: `.github/klaud.yml` on the default branch (DESIGN §3.6).

A pydantic model, so a bad key or value is reported with its name and the last good policy
stays in force.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic.config import JsonDict

from bot.core.catalog import glob_pattern
from bot.core.yamltext import UNREADABLE_YAML, where

POLICY_PATH = ".github/klaud.yml"

# What Klaud can send a candidate workflow.
InputKey = Literal["candidate", "family", "base", "wave"]

# What `family_files` patterns may name (bot.core.catalog fills them in per family).
FAMILY_FILE_PLACEHOLDERS = ("key", "model-prefix", "precision", "framework", "hardware")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# A character class holding a placeholder: `[a-{precision}]` is a valid glob for one
# family's values and a reversed range for another's.
_PLACEHOLDER_IN_CLASS = re.compile(r"\[[^\]]*\{[^{}]*\}")
# Editors learn from the schema what the validator below refuses.
_AT_LEAST_ONE: JsonDict = {"minItems": 1}
# Bounds on what the file may list: every path of every push and pull request is tried
# against each glob, and the overlap index holds each family's `family_files` expanded;
# 2,000 globs took 23 s of the event loop for one pull request. Far above real use.
MAX_GLOBS = 64
MAX_WORKFLOWS = 16
Text = Annotated[str, StringConstraints(min_length=1, max_length=256)]


# The validation context of a policy stored by an earlier version of Klaud as the last good
# one (`parse_policy(..., stored=True)`): the rules added since (each checks it) do not apply,
# so the policy stays in force as it was read, while its file is reported invalid.
STORED = "stored"


def _a_whole_number(value: object, info: ValidationInfo) -> object:
    # pydantic would read `true` as 1, "24" as 24 and 5.0 as 5: in a file a person wrote,
    # each is a mistake to report, not a value to guess (YAML already types `24` a number).
    if (isinstance(value, bool) or not isinstance(value, int)) and not _as_stored(info):
        shown = "true or false" if isinstance(value, bool) else repr(value)
        raise ValueError(f"expected a whole number, not {shown}")
    return value


def _a_truth_value(value: object, info: ValidationInfo) -> object:
    # pydantic would read "off" as False and 1 as True; YAML's own true/false/yes/no are bools.
    if not isinstance(value, bool) and not _as_stored(info):
        raise ValueError(f"expected true or false, not {value!r}")
    return value


def _as_stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get(STORED))


WholeNumber = Annotated[int, BeforeValidator(_a_whole_number)]
Switch = Annotated[bool, BeforeValidator(_a_truth_value)]


def _every_input() -> dict[InputKey, str]:
    return {"candidate": "candidate", "family": "family", "base": "base", "wave": "wave"}


class Policy(BaseModel):
    """Per-repository policy, `.github/klaud.yml` on the default branch (DESIGN §3.6)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cooldown_hours: WholeNumber = Field(default=24, ge=1, le=168)
    wave_every_minutes: WholeNumber = Field(default=120, ge=10, le=10080)
    max_candidates_per_wave: WholeNumber = Field(default=5, ge=1, le=256)
    max_in_flight: WholeNumber = Field(default=10, ge=1, le=1024)
    idle_days: WholeNumber = Field(default=7, ge=1, le=365)
    candidate_workflow: Text = "klaud-candidate.yml"
    outcome_workflows: tuple[Text, ...] = Field(
        default=("klaud-candidate.yml", "klaud-plan.yml"), max_length=MAX_WORKFLOWS, json_schema_extra=_AT_LEAST_ONE
    )
    config_globs: tuple[Text, ...] = Field(
        default=("configs/*-master.yaml",), max_length=MAX_GLOBS, json_schema_extra=_AT_LEAST_ONE
    )
    runners_file: Text = "configs/runners.yaml"
    family_files: tuple[Text, ...] = Field(default=(), max_length=MAX_GLOBS)
    capacity_rule: Literal["all", "any"] = "all"
    claim_ttl_hours: WholeNumber = Field(default=12, ge=1, le=168)
    enabled: Switch = True
    # Klaud's value -> the candidate workflow input that receives it; a value left out is
    # not sent (a workflow with one input: `{candidate: candidate}`).
    candidate_inputs: dict[InputKey, Text] = Field(
        default_factory=_every_input, min_length=1, json_schema_extra={"default": {str(key): name for key, name in _every_input().items()}}
    )
    dashboard: Switch = True

    @field_validator("candidate_inputs")
    @classmethod
    def _one_value_per_input(cls, inputs: dict[InputKey, str], info: ValidationInfo) -> dict[InputKey, str]:
        # Sent as one mapping of inputs, the second value would overwrite the first in silence.
        if _as_stored(info):
            return inputs
        seen: dict[str, str] = {}
        for value, name in inputs.items():
            if name in seen:
                raise ValueError(f"{seen[name]} and {value} both go to input {name!r}: an input takes one value")
            seen[name] = value
        return inputs

    @field_validator("outcome_workflows", "config_globs")
    @classmethod
    def _not_empty(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("must name at least one entry")
        return value

    @field_validator("family_files")
    @classmethod
    def _known_placeholders(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        # An unknown one ({model}, {gpu}) would stay in the glob as text and match no file.
        for pattern in patterns:
            for name in _PLACEHOLDER.findall(pattern):
                if name not in FAMILY_FILE_PLACEHOLDERS:
                    known = ", ".join("{" + known + "}" for known in FAMILY_FILE_PLACEHOLDERS)
                    raise ValueError(f"{pattern!r}: unknown placeholder {{{name}}} (known: {known})")
            if _PLACEHOLDER_IN_CLASS.search(pattern):
                raise ValueError(f"{pattern!r}: a placeholder inside [...] is not allowed")
            _check_glob(pattern, _PLACEHOLDER.sub("x", pattern))
        return patterns

    @field_validator("config_globs")
    @classmethod
    def _valid_globs(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            _check_glob(pattern, pattern)
        return patterns


def _check_glob(pattern: str, glob: str) -> None:
    """Refuse `pattern` (as `glob`, its placeholders filled in) unless Klaud can match it: a
    glob such as `[z-a]` raised at every push and reconcile instead, no policy error said."""
    try:
        re.compile(glob_pattern(glob))
    except (re.error, ValueError) as exc:
        raise ValueError(f"{pattern!r}: not a valid glob ({exc})") from None


def policy_schema() -> dict[str, object]:
    """The policy file's JSON Schema, for editors and `klaud config schema`."""
    schema = Policy.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": POLICY_PATH}


class PolicyError(ValueError):
    """`.github/klaud.yml` is unreadable or invalid; the message says where and why."""


def _repeated_key(node: yaml.Node | None, path: str = "") -> str | None:
    """Which key the file sets twice in one mapping, if any: YAML keeps the last in silence,
    and which of the two a person meant is theirs to say."""
    if not isinstance(node, yaml.MappingNode):
        return None
    seen: dict[object, int] = {}
    for key, value in node.value:
        if isinstance(key, yaml.ScalarNode):
            line = key.start_mark.line + 1
            if key.value in seen:
                return f"{path}{key.value} is set twice (lines {seen[key.value]} and {line})"
            seen[key.value] = line
            if (nested := _repeated_key(value, f"{path}{key.value}.")) is not None:
                return nested
    return None


def parse_policy(text: str | None, *, stored: bool = False) -> Policy:
    """Parse the policy file's text; None or an empty file means all defaults. `stored`: the
    last good policy an earlier version of Klaud kept, read without the rules added since."""
    if text is None or not text.strip():
        return Policy()
    try:
        data = yaml.safe_load(text)
        repeated = None if stored else _repeated_key(yaml.compose(text, Loader=yaml.SafeLoader))
    except UNREADABLE_YAML as exc:
        raise PolicyError(f"{POLICY_PATH}: not valid YAML{where(exc)}") from None
    if repeated is not None:
        raise PolicyError(f"{POLICY_PATH}: {repeated}")
    if data is None:
        return Policy()
    if not isinstance(data, dict):
        raise PolicyError(f"{POLICY_PATH}: expected a mapping at the top level")
    try:
        return Policy.model_validate({str(k): v for k, v in data.items()}, context={STORED: stored})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '?'}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise PolicyError(f"{POLICY_PATH}: {problems}") from None
