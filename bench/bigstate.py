"""A big synthetic repository for the state and wave benchmarks.

2,000 families in the real master-config format spread over a few `configs/*-master.yaml`
files, open pull requests that each touch one to three of them, and a long history of
candidate runs whose attempts carry a realistic mix of outcomes. Everything is derived from
a seeded RNG, so two runs of a benchmark measure the same state.

The layout of a family block is fixed (BLOCK below), which lets a pull request's patch be
written directly with exact line numbers instead of diffing whole files.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from bot.core.domain import (
    Attempt,
    FileChange,
    PullRequest,
    candidate_id,
    family_hash,
    identity,
    parse_time,
)
from bot.core.overlap import is_klaud_own

NOW = parse_time("2026-11-30T08:00:00Z")
assert NOW is not None
REPO = "acme/bench"
BOT_LOGIN = "klaud-cold[bot]"
BOT_LOGINS = (BOT_LOGIN, "Klaud-Cold")
CONFIG_PATHS = (
    "configs/nvidia-master.yaml",
    "configs/amd-master.yaml",
    "configs/nvidia-multinode-master.yaml",
    "configs/amd-multinode-master.yaml",
)
# Runner label -> runner names, as runners.yaml lists them (a trailing _<n> is the machine).
RUNNERS = {
    "b200": ["b200-nscale_0", "b200-nscale_1", "b200-dgxc_0"],
    "h200": ["h200-nb_0", "h200-nb_1"],
    "h100": ["h100-cw_00", "h100-dgxc-slurm_00"],
    "gb200": ["gb200-nv_0"],
    "mi355x": ["mi355x-amds_0", "mi355x-amds_1"],
    "mi300x": ["mi300x-amd_0"],
}
BUSY_CLUSTERS = frozenset({"h100-dgxc-slurm", "mi300x-amd"})
HARDWARE = {"nvidia": ("b200", "h200", "h100", "gb200"), "amd": ("mi355x", "mi300x")}
FRAMEWORKS = {"nvidia": ("sglang", "vllm", "trt"), "amd": ("sglang", "vllm")}
IMAGES = {
    "sglang": "lmsysorg/sglang:v0.5.{n}-cu130",
    "vllm": "vllm/vllm-openai:v0.11.{n}",
    "trt": "nvcr.io#nvidia/tensorrt-llm/release:1.2.0rc{n}",
}

BLOCK = """\
{key}:
  image: {image}
  model: {model}
  model-prefix: {prefix}
  runner: {runner}
  precision: {precision}
  framework: {framework}
  multinode: false
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 1024
      search-space:
      - {{ tp: 8, conc-start: 4, conc-end: 64 }}
"""
BLOCK_LINES = BLOCK.count("\n") + 1  # the block plus the blank line after it
IMAGE_OFFSET = 1  # `image:` is the first line under the key
FLAGS_OFFSET = 13  # the search-space line: a flag change
FLAGS_BEFORE = "conc-end: 64 }"
FLAGS_AFTER = "conc-end: 128 }"

VERIFIED_OUTCOMES = (
    ("validated", 10), ("capacity-deferred", 20), ("readiness-blocked", 15), ("failed", 18),
    ("incompatible", 8), ("uncertain", 7), ("unexpected-error", 5), ("already-updated", 5),
    ("duplicate", 4), ("handoff", 4), ("retired", 4),
)
UNVERIFIED_ERRORS = ("artifact-expired", "download-failed", "invalid-json", "artifact-missing")
PHASES = ("resolve", "baseline", "targeted", "final-sweep")
AUTHORS = ("alice", "bob", "dave", "erin", "frank", "grace")

Kind = Literal["image", "flags"]


@dataclass(frozen=True, slots=True)
class SynthFamily:
    path: str
    key: str
    image: str
    line: int  # 1-based line of `key:` in its file

    @property
    def id(self) -> str:
        return f"{self.path}:{self.key}"

    @property
    def candidate(self) -> str:
        return candidate_id(self.id, self.image)


@dataclass(frozen=True, slots=True)
class SynthPull:
    number: int
    author: str
    head_ref: str
    updated_at: datetime
    touches: tuple[tuple[SynthFamily, Kind], ...]


# -- families ------------------------------------------------------------------------------


def families(count: int = 2000) -> list[SynthFamily]:
    """`count` families split evenly over CONFIG_PATHS, in file order."""
    per_file = -(-count // len(CONFIG_PATHS))
    made: list[SynthFamily] = []
    for index in range(count):
        path = CONFIG_PATHS[index // per_file]
        position = index % per_file
        vendor = "amd" if "amd" in path else "nvidia"
        hardware = HARDWARE[vendor][index % len(HARDWARE[vendor])]
        framework = FRAMEWORKS[vendor][index % len(FRAMEWORKS[vendor])]
        precision = ("fp4", "fp8")[index % 2]
        key = f"fam{index}-{precision}-{hardware}-{framework}"
        image = IMAGES[framework].format(n=index % 17)
        made.append(SynthFamily(path, key, image, 1 + position * BLOCK_LINES))
    return made


def _block(index: int, family: SynthFamily) -> str:
    _, precision, hardware, framework = family.key.split("-", 3)
    # A few families name their cluster directly instead of a runners.yaml label.
    runner = f"cluster:{RUNNERS[hardware][0].rsplit('_', 1)[0]}" if index % 10 == 0 else hardware
    return BLOCK.format(
        key=family.key, image=family.image, model=f"model-{index % 40}", prefix=f"m{index % 40}",
        runner=runner, precision=precision, framework=framework,
    )


def master_configs(fams: list[SynthFamily]) -> dict[str, str]:
    """Path -> master config text (every block followed by one blank line)."""
    blocks: dict[str, list[str]] = {path: [] for path in CONFIG_PATHS}
    for index, family in enumerate(fams):
        blocks[family.path].append(_block(index, family))
    return {path: "\n".join(parts) for path, parts in blocks.items() if parts}


def runners_yaml() -> str:
    # The newer layout: the cluster ids under `clusters:`, the runners under `labels:`.
    lines = ["clusters:", *(f"  {cluster}: {{}}" for cluster in clusters()), "labels:"]
    for label, names in RUNNERS.items():
        lines.append(f"  {label}:")
        lines.extend(f"    - {name}" for name in names)
    return "\n".join(lines) + "\n"


def clusters() -> list[str]:
    return sorted({name.rsplit("_", 1)[0] for names in RUNNERS.values() for name in names})


# -- pull requests -------------------------------------------------------------------------


def pulls(fams: list[SynthFamily], count: int, seed: int = 7, *, own_share: float = 0.02) -> list[SynthPull]:
    """`count` open PRs numbered from 1; each touches 1-3 families of one file.

    About 15 % have been idle for more than a week; `own_share` are Klaud's own PRs
    (branch `klaud/auto-<candidate>`, bot author) that change their family's image line.
    """
    rng = random.Random(seed)
    made = []
    for number in range(1, count + 1):
        made.append(random_pull(fams, number, rng, own=rng.random() < own_share))
    return made


def random_pull(fams: list[SynthFamily], number: int, rng: random.Random, *, own: bool = False) -> SynthPull:
    """One open PR; `number` and the RNG decide everything else."""
    if rng.random() < 0.15:
        updated = NOW - timedelta(days=rng.uniform(8, 90))
    else:
        updated = NOW - timedelta(hours=rng.uniform(0, 6 * 24))
    first = rng.randrange(len(fams))
    if own:
        family = fams[first]
        return SynthPull(number, BOT_LOGIN, f"klaud/auto-{family.candidate}", updated, ((family, "image"),))
    # Siblings in the same file: a PR usually bumps related families together.
    touched: dict[int, Kind] = {first: "image" if rng.random() < 0.4 else "flags"}
    for _ in range(rng.randrange(3)):
        sibling = first + rng.randrange(-6, 7)
        if 0 <= sibling < len(fams) and fams[sibling].path == fams[first].path:
            touched.setdefault(sibling, "image" if rng.random() < 0.4 else "flags")
    touches = tuple((fams[index], kind) for index, kind in sorted(touched.items()))
    return SynthPull(number, rng.choice(AUTHORS), f"update-{number}", updated, touches)


def head_sha(number: int, revision: int = 0) -> str:
    return identity(["head", number, revision])[:40]


def file_changes(pull: SynthPull) -> tuple[FileChange, ...]:
    """What Klaud derives from the PR's patches: per file, key -> image or flags."""
    keys: dict[str, dict[str, Kind]] = {}
    for family, kind in pull.touches:
        keys.setdefault(family.path, {})[family.key] = kind
    return tuple(FileChange(path, keys=found) for path, found in sorted(keys.items()))


def pull_request(pull: SynthPull, revision: int = 0) -> PullRequest:
    """The PullRequest Klaud keeps for `pull` at head `revision`."""
    own, fam16 = is_klaud_own(pull.head_ref, pull.author, True, BOT_LOGINS)
    sha = head_sha(pull.number, revision)
    return PullRequest(
        number=pull.number,
        title=f"Update {len(pull.touches)} families",
        author=pull.author,
        head_ref=pull.head_ref,
        head_sha=sha,
        base_ref="main",
        draft=False,
        labels=(),
        created_at=pull.updated_at - timedelta(days=1),
        updated_at=pull.updated_at,
        klaud_own=own,
        own_family_hash=fam16,
        changes=file_changes(pull),
        files_complete=True,
        files_sha=sha,
    )


def patches(pull: SynthPull, configs: dict[str, list[str]]) -> dict[str, str]:
    """Path -> the patch GitHub's files API would show for `pull` (`configs`: lines per file)."""
    replacements: dict[str, dict[int, str]] = {}
    for family, kind in pull.touches:
        lines = configs[family.path]
        if kind == "image":
            number = family.line + IMAGE_OFFSET
            new = lines[number - 1] + "-post1"
        else:
            number = family.line + FLAGS_OFFSET
            new = lines[number - 1].replace(FLAGS_BEFORE, FLAGS_AFTER)
        replacements.setdefault(family.path, {})[number] = new
    return {path: unified_patch(configs[path], changed) for path, changed in replacements.items()}


def unified_patch(lines: list[str], replacements: dict[int, str], context: int = 3) -> str:
    """`git diff` text, from the first `@@` on, for replacing some 1-based lines of `lines`.

    Like git: three lines of context, hunks closer than twice that merged, and the hunk
    header names the nearest line above the hunk that starts with a letter.
    """
    groups: list[list[int]] = []
    for number in sorted(replacements):
        if groups and number - groups[-1][-1] <= 2 * context:
            groups[-1].append(number)
        else:
            groups.append([number])
    out: list[str] = []
    for group in groups:
        start = max(1, group[0] - context)
        end = min(len(lines), group[-1] + context)
        length = end - start + 1
        out.append(f"@@ -{start},{length} +{start},{length} @@{_function_name(lines, start)}")
        for number in range(start, end + 1):
            if number in replacements:
                out.append("-" + lines[number - 1])
                out.append("+" + replacements[number])
            else:
                out.append(" " + lines[number - 1])
    return "\n".join(out)


def _function_name(lines: list[str], start: int) -> str:
    for number in range(start - 1, 0, -1):
        text = lines[number - 1]
        if text[:1].isalpha():
            return " " + text
    return ""


# -- attempts ------------------------------------------------------------------------------


def attempts(fams: list[SynthFamily], count: int = 100_000, seed: int = 11, *, days: float = 60, per_run: int = 5) -> Iterator[Attempt]:
    """`count` attempts from runs spread evenly over the last `days`, `per_run` per run.

    Four in five are of the family's current candidate, the rest of an older image's; nine
    in ten are verified (outcomes weighted as VERIFIED_OUTCOMES), the rest unverified with
    an artifact error code.
    """
    rng = random.Random(seed)
    outcomes = [name for name, _ in VERIFIED_OUTCOMES]
    weights = [weight for _, weight in VERIFIED_OUTCOMES]
    runs = -(-count // per_run)
    made = 0
    for run in range(runs):
        completed = NOW - timedelta(days=days) * (1 - (run + rng.random()) / runs)
        base = identity(["base", run // 12])[:40]
        for family in rng.sample(fams, min(per_run, count - made)):
            made += 1
            if rng.random() < 0.8:
                candidate = family.candidate
            else:
                candidate = f"{family_hash(family.id)}-{identity(family.image + '-old')[:16]}"
            if rng.random() < 0.9:
                outcome = rng.choices(outcomes, weights)[0]
                reason = "baseline-other" if outcome == "readiness-blocked" else None
                phase: str | None = rng.choice(PHASES)
                error = None
            else:
                outcome, reason, phase, error = None, None, None, rng.choice(UNVERIFIED_ERRORS)
            yield Attempt(
                candidate=candidate,
                family=family.id,
                run_id=1_000_000 + run,
                run_attempt=1,
                base=base,
                completed_at=completed,
                verified=outcome is not None,
                outcome=outcome,  # type: ignore[arg-type]
                phase=phase,
                pull_request=None,
                reason_code=reason,
                error=error,
            )


def outcome_mix(made: list[Attempt]) -> dict[str, int]:
    counted = Counter(a.outcome if a.verified else f"unverified:{a.error}" for a in made)
    return dict(counted.most_common())
