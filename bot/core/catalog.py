"""Families parsed from the master configs and the runner labels of `runners.yaml`.

Pure: callers hand in file text and push times; nothing here reads files or the network.
A family is one top-level key of a master config (DESIGN §4 "Families"); its clusters come
from its runner label (DESIGN §4 "Clusters").

Block spans: `line_start` is the 1-based line of `key:`; `line_end` is the last line before
the next top-level key (or the end of the file) that is neither blank nor only a comment.
Comments and blank lines between two blocks usually introduce the next family, so they
belong to neither.

Blocks that cannot be a family (no string `image` or `runner`, not a mapping, a key that
cannot be part of a family id, a merge key) are skipped and reported in
`MasterConfig.problems`; one bad block never hides the others.
"""

from __future__ import annotations

import functools
import glob
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import yaml

from bot.core.domain import Family

# libyaml parses a 10,000-line master config about ten times faster than pure Python.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_RUNNER_NUMBER_RE = re.compile(r"_\d+$")
_FAMILY_KEY_RE = re.compile(r"^[^\s:]+$")
CLUSTER_PREFIX = "cluster:"
class CatalogError(ValueError):
    """A master config or runners.yaml cannot be read; the message says where and why."""


# ---------------------------------------------------------------------------
# runners.yaml
# ---------------------------------------------------------------------------


def parse_runners(text: str) -> dict[str, tuple[str, ...]]:
    """runners.yaml `labels:` as label -> sorted distinct cluster ids.

    A runner name's trailing `_<digits>` is its machine number: `h100-dgxc-slurm_16` runs on
    cluster `h100-dgxc-slurm`.
    """
    data = _load_yaml("runners.yaml", text)
    if not isinstance(data, dict) or not isinstance(data.get("labels"), dict):
        raise CatalogError("runners.yaml: expected a mapping with a `labels:` mapping")
    runners: dict[str, tuple[str, ...]] = {}
    for label, names in data["labels"].items():
        if names is None:
            names = []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CatalogError(f"runners.yaml: labels.{label} must be a list of runner names")
        runners[str(label)] = tuple(sorted({_RUNNER_NUMBER_RE.sub("", n) for n in names}))
    return runners


def clusters_for(runner: str, runners: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Clusters a runner label targets; () for a label runners.yaml does not know."""
    if runner.startswith(CLUSTER_PREFIX):
        return (runner[len(CLUSTER_PREFIX) :],)
    return runners.get(runner, ())


def hardware_of(runner: str) -> str:
    """GPU family of a runner label (domain §3.1): `cluster:mi355x-amds` -> `mi355x`."""
    return runner.removeprefix(CLUSTER_PREFIX).split("-", 1)[0]


# ---------------------------------------------------------------------------
# Master configs
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MasterConfig:
    """The families of one master config and what was wrong with the blocks left out."""

    path: str
    families: tuple[Family, ...]
    problems: tuple[str, ...]


def parse_master(path: str, text: str, runners: Mapping[str, tuple[str, ...]]) -> list[Family]:
    """Families of one master config, in file order (see `read_master` for the problems)."""
    return list(read_master(path, text, runners).families)


def read_master(path: str, text: str, runners: Mapping[str, tuple[str, ...]]) -> MasterConfig:
    """Parse a master config; raises CatalogError (with file and line) for unparseable YAML."""
    root = _compose(path, text)
    if root is None:
        return MasterConfig(path, (), ())
    if not isinstance(root, yaml.MappingNode):
        raise CatalogError(f"{path}: expected a mapping of families at the top level")
    lines = text.split("\n")
    pairs = [(key, value) for key, value in root.value]
    problems: list[str] = []
    families: dict[str, Family] = {}
    for index, (key_node, value_node) in enumerate(pairs):
        start = key_node.start_mark.line + 1
        next_start = pairs[index + 1][0].start_mark.line + 1 if index + 1 < len(pairs) else None
        end = _block_end(lines, start, next_start)
        family = _family(path, key_node, value_node, start, end, runners, problems)
        if family is None:
            continue
        if family.key in families:
            earlier = families.pop(family.key).line_start
            problems.append(
                f"{path}:{start}: `{family.key}` repeats the key of line {earlier}; "
                "the later block wins, as in YAML"
            )
        families[family.key] = family
    return MasterConfig(path, tuple(families.values()), tuple(problems))


def _load_yaml(name: str, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{name}: not valid YAML{_where(exc)}") from None


def _compose(path: str, text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise CatalogError(f"{path}: not valid YAML{_where(exc)}") from None


def _where(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}" if mark is not None else ""


def _construct(node: yaml.Node) -> Any:
    # A loader per block, so one bad block's half-built objects cannot leak into the next.
    loader = _Loader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def _block_end(lines: list[str], start: int, next_start: int | None) -> int:
    """Last line of a block: before the next key, skipping blank and comment-only lines."""
    end = (next_start - 1) if next_start is not None else len(lines)
    while end > start and _is_blank_or_comment(lines[end - 1]):
        end -= 1
    return end


def _is_blank_or_comment(line: str) -> bool:
    stripped = line.strip()
    return not stripped or stripped.startswith("#")


def _family(
    path: str,
    key_node: yaml.Node,
    value_node: yaml.Node,
    start: int,
    end: int,
    runners: Mapping[str, tuple[str, ...]],
    problems: list[str],
) -> Family | None:
    where = f"{path}:{start}"
    key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
    if key == "<<":
        problems.append(f"{where}: a merge key at the top level is not a family")
        return None
    if not isinstance(key, str) or not _FAMILY_KEY_RE.match(key):
        problems.append(f"{where}: top-level key {key!r} cannot name a family")
        return None
    try:
        block = _construct(value_node)
    except yaml.YAMLError as exc:
        problems.append(f"{where}: `{key}` cannot be read{_where(exc)}")
        return None
    if not isinstance(block, dict):
        problems.append(f"{where}: `{key}` is not a mapping")
        return None
    image, runner = block.get("image"), block.get("runner")
    if not isinstance(image, str) or not image.strip():
        problems.append(f"{where}: `{key}` has no image")
        return None
    if not isinstance(runner, str) or not runner.strip():
        problems.append(f"{where}: `{key}` has no runner")
        return None
    clusters = clusters_for(runner, runners)
    if not clusters:
        problems.append(f"{where}: `{key}` runner `{runner}` is not a label in runners.yaml")
    return Family(
        id=f"{path}:{key}",
        path=path,
        key=key,
        image=image,
        runner=runner,
        clusters=clusters,
        model_prefix=_text(block.get("model-prefix")),
        precision=_text(block.get("precision")),
        framework=_text(block.get("framework")),
        line_start=start,
        line_end=end,
    )


def _text(value: object) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    return str(value)


class Catalog:
    """Live families of one repository, by id and by file."""

    def __init__(self, families: Iterable[Family] = ()) -> None:
        self._by_id: dict[str, Family] = {}
        self._by_path: dict[str, dict[str, Family]] = {}
        for family in families:
            self._add(family)

    def _add(self, family: Family) -> None:
        self._by_id[family.id] = family
        self._by_path.setdefault(family.path, {})[family.key] = family

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, family_id: object) -> bool:
        return family_id in self._by_id

    def __iter__(self) -> Iterator[Family]:
        """Families sorted by id."""
        return iter(sorted(self._by_id.values(), key=lambda family: family.id))

    def get(self, family_id: str) -> Family | None:
        return self._by_id.get(family_id)

    def find(self, path: str, key: str) -> Family | None:
        return self._by_path.get(path, {}).get(key)

    def paths(self) -> list[str]:
        return sorted(self._by_path)

    def families_of(self, path: str) -> list[Family]:
        """Families of one file, in file order."""
        return sorted(self._by_path.get(path, {}).values(), key=lambda family: family.line_start)

    def replace_file(
        self, path: str, families: Iterable[Family], changed_at: datetime | None = None
    ) -> set[str]:
        """Make `families` the whole content of `path`; returns ids with a new or changed image.

        A family whose image is unchanged keeps its `image_changed_at`. A new or changed
        image gets `changed_at` (the push time), or keeps the time the caller put on the
        family when there is no push (a backfill from blame).
        """
        previous = self._by_path.get(path, {})
        self.remove_file(path)
        changed: set[str] = set()
        for family in families:
            if family.path != path:
                raise ValueError(f"family {family.id} does not belong to {path}")
            before = previous.get(family.key)
            if before is not None and before.image == family.image:
                family = replace(family, image_changed_at=before.image_changed_at)
            else:
                changed.add(family.id)
                if changed_at is not None:
                    family = replace(family, image_changed_at=changed_at)
            self._add(family)
        return changed

    def remove_file(self, path: str) -> list[Family]:
        """Drop every family of `path` (the file was deleted); returns what was dropped."""
        removed = list(self._by_path.pop(path, {}).values())
        for family in removed:
            del self._by_id[family.id]
        return removed


# ---------------------------------------------------------------------------
# Globs: config_globs and family_files
# ---------------------------------------------------------------------------


def family_file_patterns(family: Family, patterns: Iterable[str]) -> list[str]:
    """Policy `family_files` patterns with this family's values filled in.

    Placeholders: `{key}`, `{model-prefix}`, `{precision}`, `{framework}`, `{hardware}`.
    A pattern naming a value the family does not have (no precision, say) does not apply
    to it. Values are glob-escaped, so a `[` in a key matches itself. The results are
    globs for `glob_match`.
    """
    values = {
        "key": family.key,
        "model-prefix": family.model_prefix,
        "precision": family.precision,
        "framework": family.framework,
        "hardware": hardware_of(family.runner),
    }
    expanded: list[str] = []
    for pattern in patterns:
        result = pattern
        for name, value in values.items():
            token = "{" + name + "}"
            if token not in result:
                continue
            if value is None:
                break
            result = result.replace(token, glob.escape(value))
        else:
            expanded.append(result)
    return expanded


def glob_match(path: str, pattern: str) -> bool:
    """Path-aware glob, as in .gitignore or Actions `paths`: `*` stays within one folder.

    `**` spans folders (`configs/**/x.yaml` also matches `configs/x.yaml`), `?` is one
    character other than `/`, `[...]` a character class. So `configs/*-master.yaml` does
    not match the archives under `configs/deprecated/`.
    """
    return _glob_regex(pattern).fullmatch(path) is not None


@functools.lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    return re.compile(glob_pattern(pattern))


def glob_literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard: every match starts with it."""
    cut = len(pattern)
    for wildcard in "*?[":
        at = pattern.find(wildcard)
        if at != -1:
            cut = min(cut, at)
    return pattern[:cut]


def glob_pattern(pattern: str) -> str:
    """The regular expression (for fullmatch) of a `glob_match` glob."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif char == "*":
            out.append("[^/]*")
            i += 1
        elif char == "?":
            out.append("[^/]")
            i += 1
        elif char == "[":
            end = _class_end(pattern, i)
            if end == -1:
                out.append(re.escape(char))
                i += 1
            else:
                out.append(_char_class(pattern[i + 1 : end]))
                i = end + 1
        else:
            out.append(re.escape(char))
            i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    i = start + 1
    if i < len(pattern) and pattern[i] == "!":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    return pattern.find("]", i)


def _char_class(body: str) -> str:
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    escaped = body.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
    # A class never matches `/`, like `*` and `?`.
    return f"(?![/])[^{escaped}]" if negate else f"(?![/])[{escaped}]"


def is_master_config(path: str, config_globs: Iterable[str]) -> bool:
    return any(glob_match(path, pattern) for pattern in config_globs)
