"""Per-repository policy: `.github/klaud.yml` on the default branch (DESIGN §3.6).

A pydantic model, so a bad key or value is reported with its name and the last good policy
stays in force.
"""

from __future__ import annotations

import re
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.config import JsonDict

from bot.core.yamltext import UNREADABLE_YAML, where

POLICY_PATH = ".github/klaud.yml"

# What Klaud can send a candidate workflow.
InputKey = Literal["candidate", "family", "base", "wave"]

# What `family_files` patterns may name (bot.core.catalog fills them in per family).
FAMILY_FILE_PLACEHOLDERS = ("key", "model-prefix", "precision", "framework", "hardware")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
# Editors learn from the schema what the validator below refuses.
_AT_LEAST_ONE: JsonDict = {"minItems": 1}


def _every_input() -> dict[InputKey, str]:
    return {"candidate": "candidate", "family": "family", "base": "base", "wave": "wave"}


class Policy(BaseModel):
    """Per-repository policy, `.github/klaud.yml` on the default branch (DESIGN §3.6)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cooldown_hours: int = Field(default=24, ge=1, le=168)
    wave_every_minutes: int = Field(default=120, ge=10, le=10080)
    max_candidates_per_wave: int = Field(default=5, ge=1, le=256)
    max_in_flight: int = Field(default=10, ge=1, le=1024)
    idle_days: int = Field(default=7, ge=1, le=365)
    candidate_workflow: str = Field(default="klaud-candidate.yml", min_length=1)
    outcome_workflows: tuple[str, ...] = Field(
        default=("klaud-candidate.yml", "klaud-plan.yml"), json_schema_extra=_AT_LEAST_ONE
    )
    config_globs: tuple[str, ...] = Field(default=("configs/*-master.yaml",), json_schema_extra=_AT_LEAST_ONE)
    runners_file: str = "configs/runners.yaml"
    family_files: tuple[str, ...] = ()
    capacity_rule: Literal["all", "any"] = "all"
    claim_ttl_hours: int = Field(default=12, ge=1, le=168)
    enabled: bool = True
    # Klaud's value -> the candidate workflow input that receives it; a value left out is
    # not sent (a workflow with one input: `{candidate: candidate}`).
    candidate_inputs: dict[InputKey, str] = Field(default_factory=_every_input, min_length=1)
    dashboard: bool = True

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
        return patterns


def policy_schema() -> dict[str, object]:
    """The policy file's JSON Schema, for editors and `klaud config schema`."""
    schema = Policy.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "title": POLICY_PATH}


class PolicyError(ValueError):
    """`.github/klaud.yml` is unreadable or invalid; the message says where and why."""


def parse_policy(text: str | None) -> Policy:
    """Parse the policy file's text; None or an empty file means all defaults."""
    if text is None or not text.strip():
        return Policy()
    try:
        data = yaml.safe_load(text)
    except UNREADABLE_YAML as exc:
        raise PolicyError(f"{POLICY_PATH}: not valid YAML{where(exc)}") from None
    if data is None:
        return Policy()
    if not isinstance(data, dict):
        raise PolicyError(f"{POLICY_PATH}: expected a mapping at the top level")
    try:
        return Policy(**{str(k): v for k, v in data.items()})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '?'}: {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors()
        )
        raise PolicyError(f"{POLICY_PATH}: {problems}") from None
