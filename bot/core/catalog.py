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

import bisect
import functools
import glob
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import yaml

from bot.core.domain import Family
from bot.core.yamltext import UNREADABLE_YAML, where

# libyaml parses a 10,000-line master config about ten times faster than pure Python.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_RUNNER_NUMBER_RE = re.compile(r"_\d+$")
_FAMILY_KEY_RE = re.compile(r"^[^\s:]+$")
# A family key is part of a record's key in the store: printable (PostgreSQL refuses U+0000)
# and short enough for its index (a 4 KB key overflowed PostgreSQL's btree rows, and failed
# the whole catalog's write there while SQLite took it). The real configs' longest is 64.
MAX_FAMILY_KEY = 200
CLUSTER_PREFIX = "cluster:"


class CatalogError(ValueError):
    """A master config or runners.yaml cannot be read; the message says where and why."""


# ---------------------------------------------------------------------------
# runners.yaml
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Targets:
    """Where one runner label runs.

    `clusters`: the cluster ids it targets, sorted and distinct. `unresolved`: the runner
    names listed under the label that name no declared cluster, in file order. `problem`:
    what is wrong with the label itself (unknown, lists no runner, or `cluster:X` with an
    undeclared X), as "runner `<label>` ..." for a configuration error.
    """

    clusters: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()
    problem: str | None = None


class Runners(Mapping[str, tuple[str, ...]]):
    """What runners.yaml says about clusters (DESIGN §4 "Clusters").

    `declared`: the cluster ids it declares (its `clusters:` keys, or the `cluster:<id>` keys
    of its `hardware:` mapping). `labels`: the runner names listed under each `labels` key,
    as written. As a mapping, each `labels` key -> the declared clusters its runner names
    resolve to; `targets` is the whole rule for any runner label of a family.
    """

    __slots__ = ("_lengths", "_longest", "_targets", "declared", "labels")

    def __init__(
        self, declared: Iterable[str] = (), labels: Mapping[str, Iterable[str]] | None = None
    ) -> None:
        self.declared = frozenset(declared)
        self.labels: Mapping[str, tuple[str, ...]] = {
            label: tuple(names) for label, names in (labels or {}).items()
        }
        # The lengths of the declared ids: only a prefix of one of them can be a cluster.
        self._lengths = frozenset(len(cluster) for cluster in self.declared)
        self._longest = max(self._lengths, default=-1)
        self._targets = {label: self._resolve(names) for label, names in self.labels.items()}

    def cluster_of(self, name: str) -> str | None:
        """The declared cluster a runner name belongs to, or None when there is none.

        The cluster whose id is the name without its trailing `_<digits>`, else the longest
        declared id the name starts with followed by `-`.
        """
        exact = _RUNNER_NUMBER_RE.sub("", name)
        if exact in self.declared:
            return exact
        # Each prefix that a `-` follows, longest first (`h100-dgxc-slurm_07` picks `h100-dgxc`
        # over a declared `h100`), looked up: testing the name against every declared id made
        # a runners.yaml of N clusters and N runner names quadratic (found by a hostile-input
        # review).
        at = name.rfind("-", 0, self._longest + 1)
        while at >= 0:
            if at in self._lengths and name[:at] in self.declared:
                return name[:at]
            at = name.rfind("-", 0, at)
        return None

    def _resolve(self, names: tuple[str, ...]) -> Targets:
        found = {name: self.cluster_of(name) for name in names}
        return Targets(
            clusters=tuple(sorted({c for c in found.values() if c is not None})),
            unresolved=tuple(name for name, cluster in found.items() if cluster is None),
        )

    def targets(self, runner: str) -> Targets:
        """Where a family's runner label runs: `cluster:X` targets X; a `labels` key its
        runner names' clusters; any other declared cluster id itself."""
        if runner.startswith(CLUSTER_PREFIX):
            cluster = runner[len(CLUSTER_PREFIX) :]
            if not cluster:
                return Targets(problem=_runner_problem(runner, "names no cluster"))
            if cluster not in self.declared:
                # Kept as the target (the feed may know it), and as unresolved: the family's
                # decisions name the configuration error, as for a label's unknown runner.
                return Targets(
                    (cluster,),
                    unresolved=(runner,),
                    problem=_runner_problem(runner, f"names cluster {cluster}, which runners.yaml does not declare"),
                )
            return Targets((cluster,))
        targets = self._targets.get(runner)
        if targets is not None:
            if not targets.clusters and not targets.unresolved:
                return replace(targets, problem=_runner_problem(runner, "is a label that lists no runner in runners.yaml"))
            return targets
        if runner in self.declared:
            return Targets((runner,))
        return Targets(
            problem=_runner_problem(runner, "is not cluster:<id>, a declared cluster or a label in runners.yaml")
        )

    @property
    def problems(self) -> tuple[str, ...]:
        """One configuration error per runner name under a label that resolves to no cluster.

        `cluster:<id>` keys of `labels` are left out: a runner `cluster:X` targets X whatever
        they list.
        """
        return tuple(
            f"runner {name} (label {label}) resolves to no declared cluster"
            for label, targets in self._targets.items()
            if not label.startswith(CLUSTER_PREFIX)
            for name in targets.unresolved
        )

    def document(self) -> dict[str, Any]:
        """JSON form, for the store: `from_document` reads it back."""
        return {
            "declared": sorted(self.declared),
            "labels": {label: list(names) for label, names in self.labels.items()},
        }

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> Runners | None:
        """A stored `document()`; None for anything else (nothing stored, or the
        label -> cluster ids mapping an older version stored, which cannot be resolved)."""
        declared, labels = document.get("declared"), document.get("labels")
        if not isinstance(declared, list) or not isinstance(labels, dict):
            return None
        return cls(declared, labels)

    def __getitem__(self, label: str) -> tuple[str, ...]:
        return self._targets[label].clusters

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Runners):
            return self.declared == other.declared and self.labels == other.labels
        return super().__eq__(other)

    def __repr__(self) -> str:
        return f"Runners(declared={sorted(self.declared)!r}, labels={dict(self.labels)!r})"


def parse_runners(text: str) -> Runners:
    """runners.yaml: the cluster ids it declares and the runner names of each label.

    Declared ids are the keys of a top-level `clusters:` mapping (newer layout) or else the
    `cluster:<id>` keys of `hardware:` (older layout); a file that declares no cluster is a
    CatalogError, so the last good runners stay in use. `labels:` maps a label to a list of
    runner names (`h100-dgxc-slurm_16`); see `Runners.targets` for the rule.
    """
    data = _load_yaml("runners.yaml", text)
    if not isinstance(data, dict):
        raise CatalogError("runners.yaml: expected a mapping with `labels:` and the clusters it declares")
    labels = data.get("labels")
    if labels is None:
        labels = {}
    if not isinstance(labels, dict):
        raise CatalogError("runners.yaml: `labels:` must be a mapping of runner labels")
    names_of: dict[str, list[str]] = {}
    for label, names in labels.items():
        if names is None:
            names = []
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CatalogError(f"runners.yaml: labels.{label} must be a list of runner names")
        names_of[str(label)] = names
    return Runners(_declared_clusters(data), names_of)


def _declared_clusters(data: dict[Any, Any]) -> list[str]:
    if "clusters" in data:
        clusters = data["clusters"]
        if not isinstance(clusters, dict):
            raise CatalogError("runners.yaml: `clusters:` must be a mapping of cluster ids")
        declared = [str(key).removeprefix(CLUSTER_PREFIX) for key in clusters]
    elif isinstance(data.get("hardware"), dict):
        declared = [
            key[len(CLUSTER_PREFIX) :]
            for key in data["hardware"]
            if isinstance(key, str) and key.startswith(CLUSTER_PREFIX)
        ]
    else:
        declared = []
    if not any(declared):
        raise CatalogError(
            "runners.yaml: declares no cluster: expected a top-level `clusters:` mapping "
            "or `cluster:<id>` keys under `hardware:`"
        )
    if not all(declared):
        raise CatalogError("runners.yaml: a declared cluster id is empty")
    return declared


_NO_RUNNERS = Runners()


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


def read_master(path: str, text: str, runners: Runners | None) -> MasterConfig:
    """Parse a master config; raises CatalogError (with file and line) for unparseable YAML.

    `runners` None: runners.yaml could not be read (its own error says why), so only
    `cluster:<id>` runners have clusters and runner labels are not reported.
    """
    root = _compose(path, text)
    if root is None:
        return MasterConfig(path, (), ())
    if not isinstance(root, yaml.MappingNode):
        raise CatalogError(f"{path}: expected a mapping of families at the top level")
    lines = text.split("\n")
    pairs = [(key, value) for key, value in root.value]
    problems: list[str] = []
    families: dict[str, Family] = {}
    blocks = _Blocks(NODE_BUDGET_FLOOR + NODE_BUDGET_PER_CHARACTER * len(text))
    try:
        for index, (key_node, value_node) in enumerate(pairs):
            start = key_node.start_mark.line + 1
            next_start = pairs[index + 1][0].start_mark.line + 1 if index + 1 < len(pairs) else None
            end = _block_end(lines, start, next_start)
            try:
                family = _family(path, key_node, value_node, start, end, runners, problems, blocks)
            except _OverBudget:
                raise CatalogError(
                    f"{path}:{start}: its blocks build over {blocks.budget} YAML nodes by this line "
                    "(aliases and merge keys repeat nodes): the file is not read"
                ) from None
            if family is None:
                continue
            if family.key in families:
                earlier = families.pop(family.key).line_start
                problems.append(
                    f"{path}:{start}: `{family.key}` repeats the key of line {earlier}; "
                    "the later block wins, as in YAML"
                )
            families[family.key] = family
    finally:
        blocks.dispose()
    return MasterConfig(path, tuple(families.values()), tuple(problems))


def _load_yaml(name: str, text: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)
    except UNREADABLE_YAML as exc:
        raise CatalogError(f"{name}: not valid YAML{where(exc)}") from None


def _compose(path: str, text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_Loader)
    except UNREADABLE_YAML as exc:
        raise CatalogError(f"{path}: not valid YAML{where(exc)}") from None


# How many YAML nodes the blocks of one master config may build: a floor, and then as many
# per character of the file. The real configs build one node per 15 characters; a file of
# dense flow lists ([1,1,1,...]) one per 2.
NODE_BUDGET_FLOOR = 100_000
NODE_BUDGET_PER_CHARACTER = 2


class _OverBudget(Exception):
    """The blocks of a file built more nodes than its budget."""


class _Blocks:
    """Builds the blocks of one master config with one loader, within a budget of nodes.

    One loader for the file builds a node that many blocks alias once: a loader per block
    built it again for each (a 2,000-item anchored list aliased by 2,000 blocks, an 85 KB
    file, took seconds; found by a hostile-input review). A loader keeps only whole objects
    (PyYAML records a node once it is fully built), so a bad block leaks nothing half-built
    into the next. A merge key still copies its mapping into each block that merges it, so
    every node built, alias or merged copy, is counted against `budget`.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._left = budget
        self._loader = _Loader("")
        build = self._loader.construct_object

        def counted(node: yaml.Node, deep: bool = False) -> Any:
            self._left -= 1
            if self._left < 0:
                raise _OverBudget
            return build(node, deep)

        # PyYAML's constructor calls self.construct_object for every child node.
        self._loader.construct_object = counted

    def construct(self, node: yaml.Node) -> Any:
        try:
            return self._loader.construct_object(node, deep=True)
        finally:
            # A block that failed leaves its nodes marked as under construction.
            self._loader.recursive_objects = {}

    def dispose(self) -> None:
        self._loader.dispose()


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
    runners: Runners | None,
    problems: list[str],
    blocks: _Blocks,
) -> Family | None:
    at = f"{path}:{start}"
    key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
    if key == "<<":
        problems.append(f"{at}: a merge key at the top level is not a family")
        return None
    if not isinstance(key, str) or not _FAMILY_KEY_RE.match(key) or not key.isprintable() or len(key) > MAX_FAMILY_KEY:
        shown = repr(key[:60] + "…") if isinstance(key, str) and len(key) > 60 else repr(key)
        problems.append(
            f"{at}: top-level key {shown} cannot name a family "
            f"(printable, without spaces or ':', at most {MAX_FAMILY_KEY} characters)"
        )
        return None
    try:
        block = blocks.construct(value_node)
    except UNREADABLE_YAML as exc:
        problems.append(f"{at}: `{key}` cannot be read{where(exc)}")
        return None
    if not isinstance(block, dict):
        problems.append(f"{at}: `{key}` is not a mapping")
        return None
    image, runner = block.get("image"), block.get("runner")
    if not isinstance(image, str) or not image.strip():
        problems.append(f"{at}: `{key}` has no image")
        return None
    if not isinstance(runner, str) or not runner.strip():
        problems.append(f"{at}: `{key}` has no runner")
        return None
    # (Not `runners or ...`: a Runners without labels is an empty mapping, and falsy.)
    targets = (runners if runners is not None else _NO_RUNNERS).targets(runner)
    if targets.problem is not None and runners is not None:
        problems.append(f"{at}: `{key}` {targets.problem}")
    return Family(
        id=f"{path}:{key}",
        path=path,
        key=key,
        image=image,
        runner=runner,
        clusters=targets.clusters,
        model_prefix=_text(block.get("model-prefix")),
        precision=_text(block.get("precision")),
        framework=_text(block.get("framework")),
        line_start=start,
        line_end=end,
        unresolved=targets.unresolved,
        image_line=_image_line(value_node),
        child_indent=_child_indent(value_node),
        key_quoted=isinstance(key_node, yaml.ScalarNode) and key_node.style in ("'", '"'),
    )


def image_dates(families: Iterable[Family], ranges: Sequence[tuple[int, int, datetime]]) -> dict[str, datetime]:
    """When each family's `image:` line last changed, from a blame of its file.

    `ranges` are (first line, last line, commit time); a family whose image line no range
    covers (or that has none) is left out: its age stays unknown.
    """
    dates: dict[str, datetime] = {}
    ordered = sorted(ranges)
    starts = [first for first, _, _ in ordered]
    for family in families:
        if family.image_line is None:
            continue
        at = bisect.bisect_right(starts, family.image_line) - 1
        if at >= 0 and ordered[at][0] <= family.image_line <= ordered[at][1]:
            dates[family.id] = ordered[at][2]
    return dates


def _image_line(block: yaml.Node) -> int | None:
    """The 1-based line of the block's own `image:` key (its blame dates the image): the
    last one, as YAML keeps the later of a repeated key (and a block's own keys follow
    those a merge key brought in)."""
    line = None
    if isinstance(block, yaml.MappingNode):
        for key, _ in block.value:
            if isinstance(key, yaml.ScalarNode) and key.value == "image":
                line = int(key.start_mark.line) + 1
    return line


def _child_indent(block: yaml.Node) -> int:
    """The column of the block's keys (2 unless the file indents otherwise)."""
    if isinstance(block, yaml.MappingNode) and not block.flow_style and block.value:
        return int(block.value[0][0].start_mark.column)
    return 2


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

    def date_images(self, dates: Mapping[str, datetime], *, unknown_only: bool = True) -> list[Family]:
        """Give the families whose image age is unknown (`unknown_only`; else any) the dates
        found; returns them."""
        dated = []
        for family_id, when in dates.items():
            family = self._by_id.get(family_id)
            if family is not None and (family.image_changed_at is None or not unknown_only):
                family = replace(family, image_changed_at=when)
                self._add(family)
                dated.append(family)
        return dated

    def families_of(self, path: str) -> list[Family]:
        """Families of one file, in file order."""
        return sorted(self._by_path.get(path, {}).values(), key=lambda family: family.line_start)

    def replace_file(
        self, path: str, families: Iterable[Family], changed_at: datetime | None = None
    ) -> set[str]:
        """Make `families` the whole content of `path`; returns ids with a new or changed image.

        A family whose image is unchanged keeps its `image_changed_at`, and so does a key
        renamed with its image line untouched (it takes the date of the key that left the
        file with that image, as git blame dates the line). A new or changed image gets
        `changed_at` (the push time), or keeps the time the caller put on the family when
        there is no push (a backfill from blame).
        """
        previous = self._by_path.get(path, {})
        families = list(families)
        staying = {family.key for family in families}
        # By the image as Klaud knows it: `nvcr.io#x` respelled `nvcr.io/x` is the same image.
        left = {f.normalized_image: f.image_changed_at for f in previous.values() if f.key not in staying}
        self.remove_file(path)
        changed: set[str] = set()
        for family in families:
            if family.path != path:
                raise ValueError(f"family {family.id} does not belong to {path}")
            before = previous.get(family.key)
            if before is not None and before.normalized_image == family.normalized_image:
                family = replace(family, image_changed_at=before.image_changed_at)
            elif before is None and family.normalized_image in left:
                changed.add(family.id)
                family = replace(family, image_changed_at=left[family.normalized_image])
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
    """The regular expression (for fullmatch) of a `glob_match` glob.

    Raises ValueError for a glob no regular expression can express (a character class with
    a reversed range, `[z-a]`).

    A `*` followed by a part of fixed length that never matches `/` and then by another `*`
    takes the part's first occurrence, in an atomic group, as CPython's fnmatch does: the
    next `*` takes up whatever lies before a later occurrence, since neither `*` nor the part
    crosses a `/`. Without it `*a*a*a*a*a*a*a*a*a*b` tried every way of splitting a long name
    of `a`s among its stars: seconds for a 42-character path, minutes with 12 stars (found
    by a hostile-input review).
    """
    tokens = _glob_tokens(pattern)
    out: list[str] = []
    i, n = 0, len(tokens)
    while i < n:
        kind, regex = tokens[i]
        if kind != _STAR:
            out.append(regex)
            i += 1
            continue
        end = i + 1
        while end < n and tokens[end][0] == _FIXED:
            end += 1
        if end > i + 1 and end < n and tokens[end][0] == _STAR:
            out.append("(?>[^/]*?" + "".join(regex for _, regex in tokens[i + 1 : end]) + ")")
            i = end
        else:
            out.append(regex)
            i += 1
    return "".join(out)


# Kinds of glob token: `*`; one character that is never `/` (`?`, a class, a literal);
# anything else (`/`, `**`, `**/`).
_STAR, _FIXED, _OTHER = "star", "fixed", "other"


def _glob_tokens(pattern: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    i, n = 0, len(pattern)
    while i < n:
        char = pattern[i]
        if pattern.startswith("**/", i):
            tokens.append((_OTHER, "(?:.*/)?"))
            i += 3
        elif pattern.startswith("**", i):
            tokens.append((_OTHER, ".*"))
            i += 2
        elif char == "*":
            tokens.append((_STAR, "[^/]*"))
            i += 1
        elif char == "?":
            tokens.append((_FIXED, "[^/]"))
            i += 1
        elif char == "[":
            end = _class_end(pattern, i)
            if end == -1:
                tokens.append((_FIXED, re.escape(char)))
                i += 1
            else:
                tokens.append((_FIXED, _char_class(pattern, pattern[i + 1 : end])))
                i = end + 1
        else:
            tokens.append((_OTHER if char == "/" else _FIXED, re.escape(char)))
            i += 1
    return tokens


def _class_end(pattern: str, start: int) -> int:
    i = start + 1
    if i < len(pattern) and pattern[i] == "!":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    return pattern.find("]", i)


def _char_class(pattern: str, body: str) -> str:
    negate = body.startswith("!")
    if negate:
        body = body[1:]
    escaped = body.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
    # A class never matches `/`, like `*` and `?`.
    regex = f"(?![/])[^{escaped}]" if negate else f"(?![/])[{escaped}]"
    try:
        re.compile(regex)
    except re.error as error:
        shown = "[" + ("!" if negate else "") + body + "]"
        raise ValueError(f"glob {pattern!r}: its character class {shown} is not valid ({error.msg})") from None
    return regex


def is_master_config(path: str, config_globs: Iterable[str]) -> bool:
    return any(glob_match(path, pattern) for pattern in config_globs)


def config_problems(config_errors: Mapping[str, str]) -> list[tuple[str, str]]:
    """(path, problem) for every problem of a repository's configuration errors, which are
    kept as path -> problems, one a line (a runners file may name many unresolved runners)."""
    return [
        (path, problem)
        for path, problems in sorted(config_errors.items())
        for problem in problems.split("\n")
        if problem
    ]


# A family's runner problem, as stored among its master config's problems (text, one a
# line): written and read here only, so doctor need not know the wording.
_RUNNER = re.compile(r"runner `(?P<runner>[^`]*)`")


def _runner_problem(runner: str, what: str) -> str:
    return f"runner `{runner}` {what}"


def runner_of_problem(problem: str) -> str | None:
    """The runner label a configuration problem is about, or None for any other problem."""
    found = _RUNNER.search(problem)
    return found["runner"] if found else None
