"""Write the bundled demo scenario, `scenarios/demo.json`.

    python -m bot.sandbox.make_demo            # rewrite the bundled file
    python -m bot.sandbox.make_demo --check    # exit 1 if the committed file is stale

The repository `acme/bench` is small but shaped like the real InferenceX one: master
configs in the same format, a runners.yaml, Klaud's workflows, and open pull requests and
finished candidate runs of every kind the planner must tell apart. Candidate ids come from
`bot.core.domain.candidate_id`, so artifacts and branch names match the families exactly.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any

from bot.core.domain import candidate_id
from bot.sandbox.scenario import BUNDLED_SCENARIO, parse_scenario

NOW = "2026-11-30T08:00:00Z"
REPO = "acme/bench"
NVIDIA = "configs/nvidia-master.yaml"
AMD = "configs/amd-master.yaml"


@dataclass(frozen=True)
class Fam:
    path: str
    key: str
    image: str
    model: str
    prefix: str
    runner: str
    precision: str
    framework: str
    shape: str = "single"  # single | multinode | agentic
    note: str | None = None  # a YAML comment inside the block, as real configs have

    @property
    def id(self) -> str:
        return f"{self.path}:{self.key}"

    @property
    def candidate(self) -> str:
        return candidate_id(self.id, self.image)


SGL = "lmsysorg/sglang:v0.5.16-cu130"
SGL_ROCM = "lmsysorg/sglang:v0.5.12-rocm700-mi35x"
VLLM = "vllm/vllm-openai:v0.25.0"
TRT = "nvcr.io#nvidia/tensorrt-llm/release:1.3.0rc14"
DYNAMO_TRT = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.8.1.post1"
ATOM = "rocm/atom:rocm7.2.3_ubuntu24.04_py3.12_pytorch_release_2.10.0_atom20260511"
VLLM_ROCM = "rocm/vllm:rocm7.2.1_vllm_0.24.1_20260801"

FAMILIES = [
    Fam(NVIDIA, "dsr1-fp4-b200-sglang", SGL, "nvidia/DeepSeek-R1-0528-FP4-V2", "dsr1", "b200", "fp4", "sglang"),
    Fam(NVIDIA, "dsr1-fp4-b200-sglang-mtp", SGL, "nvidia/DeepSeek-R1-0528-FP4-V2", "dsr1", "b200", "fp4", "sglang",
        note="# MTP variant: same image, speculative decoding on"),
    Fam(NVIDIA, "dsr1-fp8-b200-vllm", VLLM, "deepseek-ai/DeepSeek-R1-0528", "dsr1", "b200", "fp8", "vllm"),
    Fam(NVIDIA, "dsr1-fp8-h200-sglang", "lmsysorg/sglang:v0.5.16-cu129", "deepseek-ai/DeepSeek-R1-0528", "dsr1", "h200", "fp8", "sglang"),
    Fam(NVIDIA, "dsr1-fp8-h200-trt", TRT, "deepseek-ai/DeepSeek-R1-0528", "dsr1", "h200", "fp8", "trt"),
    Fam(NVIDIA, "dsr1-fp4-b300-sglang", SGL, "nvidia/DeepSeek-R1-0528-FP4-V2", "dsr1", "b300", "fp4", "sglang"),
    Fam(NVIDIA, "dsr1-fp4-gb200-dynamo-trt", DYNAMO_TRT, "deepseek-r1-fp4", "dsr1", "cluster:gb200-nv", "fp4", "dynamo-trt", shape="multinode"),
    Fam(NVIDIA, "gptoss-fp4-b200-vllm", VLLM, "openai/gpt-oss-120b", "gptoss", "cluster:b200-dgxc", "fp4", "vllm"),
    Fam(NVIDIA, "gptoss-fp4-h100-vllm", VLLM, "openai/gpt-oss-120b", "gptoss", "h100", "fp4", "vllm"),
    Fam(NVIDIA, "qwen3.5-fp8-b200-sglang", SGL, "Qwen/Qwen3.5-397B-A17B-FP8", "qwen3.5", "cluster:b200-dgxc", "fp8", "sglang"),
    Fam(NVIDIA, "qwen3.5-fp8-h200-vllm", VLLM, "Qwen/Qwen3.5-397B-A17B-FP8", "qwen3.5", "h200", "fp8", "vllm"),
    Fam(NVIDIA, "kimik2.5-fp4-b300-vllm", VLLM, "nvidia/Kimi-K2.5-NVFP4", "kimik2.5", "b300", "fp4", "vllm"),
    Fam(NVIDIA, "kimik2.5-fp4-gb200-dynamo-trt", DYNAMO_TRT, "nvidia/Kimi-K2.5-NVFP4", "kimik2.5", "cluster:gb200-nv", "fp4", "dynamo-trt", shape="multinode"),
    Fam(NVIDIA, "dsv4-fp4-b200-vllm", VLLM, "deepseek-ai/DeepSeek-V4-Pro", "dsv4", "cluster:b200-dgxc", "fp4", "vllm"),
    Fam(NVIDIA, "dsv4-fp4-b200-sglang-agentic", "lmsysorg/sglang:dev-nightly-0820", "deepseek-ai/DeepSeek-V4-Pro", "dsv4", "cluster:b200-dgxc", "fp4", "sglang", shape="agentic"),
    Fam(NVIDIA, "glm5-fp8-h200-sglang", "lmsysorg/sglang:v0.5.16-cu129", "zai-org/GLM-5-FP8", "glm5", "h200", "fp8", "sglang"),
    Fam(NVIDIA, "llama3.3-fp8-h100-vllm", VLLM, "nvidia/Llama-3.3-70B-Instruct-FP8", "llama3.3", "h100", "fp8", "vllm"),
    Fam(NVIDIA, "minimaxm2.5-fp8-b200-vllm", VLLM, "MiniMaxAI/MiniMax-M2.5", "minimaxm2.5", "b200", "fp8", "vllm"),
    Fam(AMD, "dsr1-fp4-mi355x-atom", ATOM, "amd/DeepSeek-R1-0528-MXFP4-Preview", "dsr1", "mi355x", "fp4", "atom"),
    Fam(AMD, "dsr1-fp8-mi355x-sglang", SGL_ROCM, "deepseek-ai/DeepSeek-R1-0528", "dsr1", "mi355x", "fp8", "sglang"),
    Fam(AMD, "dsr1-fp8-mi355x-sglang-mtp", SGL_ROCM, "deepseek-ai/DeepSeek-R1-0528", "dsr1", "mi355x", "fp8", "sglang"),
    Fam(AMD, "dsr1-fp8-mi300x-sglang", "lmsysorg/sglang:v0.5.12-rocm700-mi30x", "deepseek-ai/DeepSeek-R1-0528", "dsr1", "mi300x", "fp8", "sglang"),
    Fam(AMD, "dsr1-fp8-mi325x-sglang", "lmsysorg/sglang:v0.5.12-rocm700-mi30x", "deepseek-ai/DeepSeek-R1-0528", "dsr1", "mi325x", "fp8", "sglang"),
    Fam(AMD, "dsr1-fp8-mi355x-sglang-disagg", SGL_ROCM, "deepseek-ai/DeepSeek-R1-0528", "dsr1", "mi355x-disagg", "fp8", "sglang-disagg", shape="multinode"),
    Fam(AMD, "gptoss-fp4-mi355x-vllm", VLLM_ROCM, "openai/gpt-oss-120b", "gptoss", "cluster:mi355x-amds", "fp4", "vllm"),
    Fam(AMD, "gptoss-fp4-mi300x-vllm", VLLM_ROCM, "openai/gpt-oss-120b", "gptoss", "mi300x", "fp4", "vllm"),
    Fam(AMD, "qwen3.5-fp8-mi355x-atom", ATOM, "Qwen/Qwen3.5-397B-A17B-FP8", "qwen3.5", "mi355x", "fp8", "atom",
        note="# WIP framework (no customers yet)"),
    Fam(AMD, "qwen3.5-fp8-mi325x-sglang", "lmsysorg/sglang:v0.5.12-rocm700-mi30x", "Qwen/Qwen3.5-397B-A17B-FP8", "qwen3.5", "cluster:mi325x-amds", "fp8", "sglang"),
    Fam(AMD, "kimik2.5-fp4-mi355x-vllm", VLLM_ROCM, "amd/Kimi-K2.5-MXFP4", "kimik2.5", "cluster:mi355x-amds", "fp4", "vllm"),
    Fam(AMD, "glm5-fp8-mi355x-sglang", SGL_ROCM, "zai-org/GLM-5-FP8", "glm5", "mi355x", "fp8", "sglang"),
]
BY_KEY = {f.key: f for f in FAMILIES}


def render_family(f: Fam) -> str:
    head = [
        f"{f.key}:",
        f"  image: {f.image}",
        f"  model: {f.model}",
        f"  model-prefix: {f.prefix}",
        f"  runner: {f.runner}",
        f"  precision: {f.precision}",
    ]
    if f.note:
        head.append(f"  {f.note}")
    head.append(f"  framework: {f.framework}")
    if f.shape == "multinode":
        body = [
            '  router: { name: dynamo-router, version: "0.8.1.post1" }',
            "  kv-p2p-transfer: nixl",
            "  multinode: true",
            "  disagg: true",
            "  scenarios:",
            "    fixed-seq-len:",
            "    - isl: 8192",
            "      osl: 1024",
            "      search-space:",
            '      - spec-decoding: "mtp"',
            "        conc-list: [64, 128]",
            "        prefill:",
            "          num-worker: 2",
            "          tp: 4",
            "          ep: 4",
            "          dp-attn: true",
            "        decode:",
            "          num-worker: 1",
            "          tp: 8",
            "          ep: 8",
            "          dp-attn: true",
        ]
    elif f.shape == "agentic":
        body = [
            "  multinode: false",
            "  scenarios:",
            "    agentic-coding:",
            "    - dram-utilization: 0.80",
            "      search-space:",
            "      - { tp: 8, kv-offloading: none, spec-decoding: mtp, conc-list: [1, 2, 4, 8] }",
            "      - { tp: 8, kv-offloading: dram, kv-offload-backend: { name: hicache }, spec-decoding: mtp, conc-list: [16, 32] }",
        ]
    else:
        body = [
            "  multinode: false",
            "  scenarios:",
            "    fixed-seq-len:",
            "    - isl: 8192",
            "      osl: 1024",
            "      search-space:",
            "      - { tp: 4, ep: 1, conc-start: 4, conc-end: 64 }",
            "      - { tp: 8, ep: 8, dp-attn: true, conc-start: 64, conc-end: 256 }",
            "    - isl: 1024",
            "      osl: 1024",
            "      search-space:",
            "      - { tp: 8, conc-start: 4, conc-end: 128 }",
        ]
    return "\n".join(head + body) + "\n"


def render_master(path: str) -> str:
    blocks = [render_family(f) for f in FAMILIES if f.path == path]
    return "\n".join(blocks)


def replace_in_block(text: str, key: str, old: str, new: str) -> str:
    """Change one line inside a family's block only (the same text may occur elsewhere)."""
    start = text.index(f"\n{key}:\n") + 1 if not text.startswith(f"{key}:\n") else 0
    end = text.find("\n\n", start)
    end = len(text) if end == -1 else end
    block = text[start:end]
    if old not in block:
        raise ValueError(f"{old!r} not in the block of {key}")
    return text[:start] + block.replace(old, new, 1) + text[end:]


RUNNERS = """\
# Runner labels used by the master configs. Each entry is one self-hosted runner of a
# cluster declared under `hardware:`: its name without the trailing _<n>.
labels:
  b200:
    - b200-nb_0
    - b200-nb_1
    - b200-cw_00
    - b200-cw_01
  h100:
    - h100-cw_00
    - h100-cw_01
  h200:
    - h200-nb_0
    - h200-nb_1
  b300:
    - b300-nv_01
    - b300-nv_02
    - b300-nv_03
  mi300x:
    - mi300x-amds_00
    - mi300x-amds_01
  mi325x:
    - mi325x-tw_00
    - mi325x-tw_01
  mi355x:
    - mi355x-amds_00
    - mi355x-amds_01
    - mi355x-amds_02
    - mi355x-amds_03
  mi355x-disagg:
    - mi355x-amds_06
    - mi355x-amds_07

hardware:
  cluster:b200-nb:
    gpus-per-node: 8
  cluster:b200-cw:
    gpus-per-node: 8
  cluster:h100-cw:
    gpus-per-node: 8
  cluster:h200-nb:
    gpus-per-node: 8
  cluster:b300-nv:
    gpus-per-node: 8
  cluster:mi300x-amds:
    gpus-per-node: 8
  cluster:mi325x-tw:
    gpus-per-node: 8
  cluster:b200-dgxc:
    available-cpu-dram-mib: 3_095_781
    gpus-per-node: 8
  cluster:gb200-nv:
    available-cpu-dram-mib: 860_160
    gpus-per-node: 4
  cluster:mi325x-amds:
    available-cpu-dram-mib: 3_091_589
    gpus-per-node: 8
  cluster:mi355x-amds:
    available-cpu-dram-mib: 3_095_781
    gpus-per-node: 8
"""

KLAUD_PLAN = """\
name: Klaud Cold auto-sweep

on:
  schedule:
    - cron: "0 */2 * * *"
  workflow_dispatch:

permissions:
  contents: read
  actions: read

jobs:
  plan:
    if: github.ref == 'refs/heads/main' && github.run_attempt == 1
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with:
          fetch-depth: 0
      - run: python -m infx.klaud plan --directory "$RUNNER_TEMP/klaud"
"""

KLAUD_CANDIDATE = """\
name: Klaud Cold candidate
run-name: Klaud Cold candidate ${{ inputs.candidate }}

on:
  workflow_dispatch:
    inputs:
      candidate:
        description: Candidate id (<fam16>-<img16>)
        required: true
        type: string
      family:
        description: Family id (<path>:<key>)
        required: true
        type: string
      base:
        description: Base commit of the wave
        required: true
        type: string
      wave:
        description: Wave number
        required: false
        type: string
  workflow_call:
    inputs:
      candidate:
        required: true
        type: string

jobs:
  candidate:
    name: Klaud Cold
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: python -m infx.klaud run --candidate "${{ inputs.candidate }}"
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: klaud-candidate-${{ inputs.candidate }}
          path: ${{ runner.temp }}/candidate-diagnostics.json
          retention-days: 14
"""

RUN_SWEEP = """\
name: Run Sweep

on:
  pull_request:
    types: [labeled, synchronize]

jobs:
  sweep:
    if: contains(github.event.pull_request.labels.*.name, 'full-sweep-fail-fast')
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
      - run: python -m infx.matrix.plan --changed-only
"""

E2E = """\
name: e2e Tests

on:
  workflow_dispatch:
    inputs:
      ref:
        required: true
        type: string
      generate-cli-command:
        required: true
        type: string
      test-name:
        required: false
        type: string

jobs:
  e2e:
    runs-on: ubuntu-latest
    steps:
      - uses: actions/checkout@v4
        with:
          ref: ${{ inputs.ref }}
      - run: python -m infx.matrix ${{ inputs.generate-cli-command }}
"""

POLICY = """\
# Klaud Cold policy for this repository (read from the default branch only).
cooldown_hours: 24
wave_every_minutes: 120
max_candidates_per_wave: 5
idle_days: 7
capacity_rule: all
"""

CHANGELOG = """\
# Performance-relevant changes, newest first.
- date: 2026-11-24
  description: Bump vLLM to v0.25.0 across GPT-OSS, Kimi and DSR1 FP8 B200 families
- date: 2026-11-17
  description: Add DeepSeek-V4 agentic-coding scenario on B200 DGXC
"""

README = "# acme/bench\n\nGPU inference benchmarks. Workloads live in `configs/*-master.yaml`.\n"

BASE_FILES = {
    NVIDIA: render_master(NVIDIA),
    AMD: render_master(AMD),
    "configs/runners.yaml": RUNNERS,
    ".github/workflows/klaud-plan.yml": KLAUD_PLAN,
    ".github/workflows/klaud-candidate.yml": KLAUD_CANDIDATE,
    ".github/workflows/run-sweep.yml": RUN_SWEEP,
    ".github/workflows/e2e-tests.yml": E2E,
    ".github/klaud.yml": POLICY,
    "perf-changelog.yaml": CHANGELOG,
    "README.md": README,
}


# The image bumps of the last months, oldest first: (family key, image before, when). Every
# other family has had its image since the configs were added, a year before the demo.
BUMPS = [
    ("dsr1-fp8-h200-trt", "nvcr.io#nvidia/tensorrt-llm/release:1.2.0rc4", "2026-06-02T10:00:00Z"),
    ("gptoss-fp4-b200-vllm", "vllm/vllm-openai:v0.11.2", "2026-07-15T14:30:00Z"),
    ("dsr1-fp4-b200-sglang", "lmsysorg/sglang:v0.5.5-cu130", "2026-08-20T09:10:00Z"),
    ("dsr1-fp4-b200-sglang-mtp", "lmsysorg/sglang:v0.5.5-cu130", "2026-08-20T09:10:00Z"),
    ("kimik2.5-fp4-mi355x-vllm", "rocm/vllm:rocm7.0.0_vllm_0.10.1", "2026-09-30T16:00:00Z"),
    ("dsr1-fp8-b200-vllm", "vllm/vllm-openai:v0.24.0", "2026-11-24T11:00:00Z"),
]
CONFIGS_ADDED = "2025-11-30T08:00:00Z"


def history() -> list[dict[str, Any]]:
    """The configs' commits before the head, so a blame dates every family's image."""
    first = dict(BASE_FILES)
    for key, before, _ in BUMPS:
        f = BY_KEY[key]
        first[f.path] = replace_in_block(first[f.path], key, f.image, before)
    commits = [{"at": CONFIGS_ADDED, "message": "Add the master configs", "files": first}]
    current = {path: first[path] for path in (NVIDIA, AMD)}
    by_time: dict[str, list[tuple[str, str]]] = {}
    for key, before, at in BUMPS:
        by_time.setdefault(at, []).append((key, before))
    for at, bumps in by_time.items():
        changed = {}
        for key, before in bumps:
            f = BY_KEY[key]
            current[f.path] = replace_in_block(current[f.path], key, before, f.image)
            changed[f.path] = current[f.path]
        commits.append({"at": at, "message": "Bump " + ", ".join(key for key, _ in bumps), "files": changed})
    return commits


def bumped(key: str, old: str, new: str) -> str:
    f = BY_KEY[key]
    return replace_in_block(BASE_FILES[f.path], key, old, new)


def changelog_entry(description: str) -> str:
    lines = CHANGELOG.split("\n", 1)
    return f"{lines[0]}\n- date: 2026-11-29\n  description: {description}\n{lines[1]}"


def pulls() -> list[dict[str, Any]]:
    klaud = BY_KEY["dsr1-fp4-b300-sglang"]
    return [
        {   # a human image bump
            "number": 4101, "title": "Bump SGLang to v0.5.17 for DSR1 FP8 MI355X",
            "user": "bob", "head_ref": "bump-sglang-mi355x",
            "created_at": "2026-11-28T10:12:00Z", "updated_at": "2026-11-29T15:40:00Z",
            "files": [{"filename": AMD, "content": bumped(
                "dsr1-fp8-mi355x-sglang", SGL_ROCM, "lmsysorg/sglang:v0.5.17-rocm700-mi35x")}],
        },
        {   # a human flag change
            "number": 4102, "title": "Widen GPT-OSS H100 search space to conc 512",
            "user": "carol", "head_ref": "gptoss-h100-conc",
            "created_at": "2026-11-29T09:00:00Z", "updated_at": "2026-11-30T06:30:00Z",
            "labels": ["sweep-enabled"],
            "files": [{"filename": NVIDIA, "content": replace_in_block(
                BASE_FILES[NVIDIA], "gptoss-fp4-h100-vllm",
                "{ tp: 8, ep: 8, dp-attn: true, conc-start: 64, conc-end: 256 }",
                "{ tp: 8, ep: 8, dp-attn: true, conc-start: 64, conc-end: 512 }")}],
        },
        {   # idle for 10 days: kept in the index, overlaps nothing
            "number": 4103, "title": "Try ATOM nightly for Qwen3.5 MI355X",
            "user": "dave", "head_ref": "qwen-atom-nightly", "draft": True,
            "created_at": "2026-11-12T14:00:00Z", "updated_at": "2026-11-20T08:00:00Z",
            "files": [{"filename": AMD, "content": bumped(
                "qwen3.5-fp8-mi355x-atom", ATOM, "rocm/atom:nightly-20261119")}],
        },
        {   # shared files only: never overlaps a family
            "number": 4104, "title": "Run sweeps on labeled PRs only; changelog tidy-up",
            "user": "alice", "head_ref": "sweep-on-label",
            "created_at": "2026-11-29T18:00:00Z", "updated_at": "2026-11-29T18:05:00Z",
            "files": [
                {"filename": ".github/workflows/run-sweep.yml",
                 "content": RUN_SWEEP.replace("[labeled, synchronize]", "[labeled]")},
                {"filename": "perf-changelog.yaml",
                 "content": CHANGELOG.replace("Add DeepSeek-V4", "Add the DeepSeek-V4")},
            ],
        },
        {   # Klaud's own open candidate PR
            "number": 4105,
            "title": "[Klaud Cold] Update SGLang image for DSR1 FP4 B300 / 更新 DSR1 FP4 B300 的 SGLang 镜像",
            "user": "Klaud-Cold", "head_ref": f"klaud/auto-{klaud.candidate}", "draft": True,
            "body": "<!-- klaud-baseline -->",
            "created_at": "2026-11-30T04:10:00Z", "updated_at": "2026-11-30T05:20:00Z",
            "files": [
                {"filename": NVIDIA, "content": bumped(klaud.key, SGL, "lmsysorg/sglang:v0.5.17-cu130")},
                {"filename": "perf-changelog.yaml", "content": changelog_entry(
                    "Klaud Cold refresh of DSR1 FP4 B300 SGLang v0.5.16 to v0.5.17")},
            ],
        },
        {   # GitHub left out the patch: the bot must diff the contents itself
            "number": 4106, "title": "Kimi K2.5 MI355X: raise max conc",
            "user": "erin", "head_ref": "kimi-mi355x-conc",
            "created_at": "2026-11-29T11:00:00Z", "updated_at": "2026-11-30T07:00:00Z",
            "files": [{"filename": AMD, "patch": None, "content": replace_in_block(
                BASE_FILES[AMD], "kimik2.5-fp4-mi355x-vllm",
                "{ tp: 8, conc-start: 4, conc-end: 128 }",
                "{ tp: 8, conc-start: 4, conc-end: 256 }")}],
        },
    ]


def diagnostics(
    outcome: str, phase: str, pull: int | None, run_ids: list[int],
    repairs: int | None, reason: str | None = None,
) -> dict[str, Any]:
    """`candidate-diagnostics.json` as the candidate workflow writes it (domain §8.5)."""
    decided: dict[str, Any] = {"outcome": outcome, "phase": phase, "pull-request": pull,
                               "run-ids": run_ids, "repairs-used": repairs}
    if reason:
        decided["reason-code"] = reason
    head = hashlib.sha1(f"{outcome}:{pull}:{run_ids}".encode()).hexdigest() if pull else None
    session = {"pull-request": pull, "head": head,
               "runs": [{"id": r, "attempt": 1, "terminal": True} for r in run_ids]}
    if outcome == "unexpected-error":
        return {"action-outcome": "failure", "execution-log": "unavailable",
                "result-present": False, "structured-output-present": False,
                "termination": "unknown", "is-error": True, "permission-denials": {},
                "denied-bash-categories": {}, "observed-session": session,
                "outcome-error": "lifecycle-unverified",
                "outcome-report": "unavailable-or-invalid", "candidate-outcome": decided}
    return {"action-outcome": "success", "execution-log": "available", "result-present": True,
            "duration_ms": 9_000_000 + 100_000 * len(run_ids), "num_turns": 140,
            "total_cost_usd": 28.4, "structured-output-present": True, "termination": "success",
            "is-error": False, "permission-denials": {"Bash": 1},
            "denied-bash-categories": {"shell-wrapper": 1}, "observed-session": session,
            "outcome-source": "verified-receipt", "outcome-report": "available",
            "candidate-outcome": decided}


def artifact(key: str, content: Any = None, **extra: Any) -> dict[str, Any]:
    name = f"klaud-candidate-{BY_KEY[key].candidate}"
    files = {"candidate-diagnostics.json": content} if content is not None else {}
    return {"name": name, "files": files, **extra}


def runs() -> list[dict[str, Any]]:
    return [
        {"id": 28123456701, "workflow": "klaud-plan.yml", "event": "schedule",
         "conclusion": "success", "created_at": "2026-11-30T02:00:12Z",
         "completed_at": "2026-11-30T06:05:40Z",
         "artifacts": [
             artifact("llama3.3-fp8-h100-vllm", diagnostics(
                 "validated", "final-sweep", 4090, [28123999001, 28123999002], 1)),
             artifact("minimaxm2.5-fp8-b200-vllm", diagnostics(
                 "capacity-deferred", "targeted", 4091, [28123999003], 0)),
             artifact("glm5-fp8-h200-sglang", diagnostics(
                 "readiness-blocked", "targeted", 4092, [28123999004], 0)),
             artifact("dsr1-fp8-b200-vllm", diagnostics(
                 "failed", "baseline", 4093, [], 0, "baseline-provenance-unverified")),
         ]},
        {"id": 28123456702, "workflow": "klaud-plan.yml", "event": "schedule",
         "conclusion": "success", "created_at": "2026-11-29T00:00:09Z",
         "completed_at": "2026-11-29T04:00:31Z",
         "artifacts": [
             artifact("dsr1-fp8-mi300x-sglang", diagnostics(
                 "failed", "targeted", 4080, [28123998001, 28123998002], 5)),
         ]},
        {"id": 28123456703, "workflow": "klaud-plan.yml", "event": "schedule",
         "conclusion": "failure", "created_at": "2026-11-29T22:00:04Z",
         "completed_at": "2026-11-30T01:10:00Z",
         "artifacts": [
             artifact("gptoss-fp4-mi300x-vllm", diagnostics(
                 "unexpected-error", "unknown", None, [28123999101], None)),
             artifact("dsr1-fp8-mi325x-sglang", diagnostics(
                 "validated", "final-sweep", 4070, [28123999102], 0), expired=True),
             {"name": f"klaud-candidate-{BY_KEY['qwen3.5-fp8-b200-sglang'].candidate}",
              "raw_zip_base64": base64.b64encode(b"PK\x03\x04 this is not a zip").decode()},
             artifact("dsv4-fp4-b200-vllm", '{"candidate-outcome": {"outcome": "valid'),
         ]},
    ]


def timeline() -> list[dict[str, Any]]:
    atom = BY_KEY["dsr1-fp4-mi355x-atom"]
    return [
        {"action": "open_pull", "repo": REPO, "pull": {
            "number": 4107, "title": "ATOM 20261128 for DSR1 FP4 MI355X", "user": "bob",
            "head_ref": "atom-20261128-dsr1",
            "files": [{"filename": AMD, "content": bumped(
                atom.key, ATOM,
                "rocm/atom:rocm7.2.3_ubuntu24.04_py3.12_pytorch_release_2.10.0_atom20261128")}]}},
        {"action": "comment", "repo": REPO, "number": 4104, "user": "alice",
         "body": "/klaud hold configs/amd-master.yaml:gptoss-fp4-mi355x-vllm waiting for ROCm 7.3 validation"},
        {"action": "complete_run", "repo": REPO, "run": {
            "id": 28123456704, "workflow": "klaud-plan.yml", "event": "schedule",
            "conclusion": "success", "created_at": "2026-11-30T06:00:05Z",
            "artifacts": [artifact("kimik2.5-fp4-b300-vllm", diagnostics(
                "failed", "targeted", 4108, [28124000001], 5))]}},
    ]


def capacity() -> dict[str, Any]:
    def cluster(name: str, total: int, allocated: int, mixed: int, idle: int, down: int = 0,
                stale: bool = False, status: str = "operational") -> dict[str, Any]:
        return {"id": name, "status": status, "stale": stale, "total": total,
                "allocated": allocated, "mixed": mixed, "idle": idle, "down": down, "other": 0}

    return {"available": True, "clusters": [
        cluster("b200-nb", 8, 2, 0, 6),
        cluster("b200-cw", 8, 3, 1, 4),
        cluster("b200-dgxc", 16, 12, 1, 3),           # busy: 13/16 ≥ 80 %
        cluster("h100-cw", 4, 1, 0, 3),
        cluster("h200-nb", 8, 1, 0, 7, stale=True),   # stale reading
        cluster("b300-nv", 12, 4, 2, 6),
        cluster("gb200-nv", 18, 15, 0, 3),           # busy
        cluster("mi300x-amds", 9, 2, 0, 6, down=1, status="degraded"),
        cluster("mi325x-tw", 4, 4, 0, 0),            # full: no idle node
        cluster("mi325x-amds", 9, 3, 0, 6),
        cluster("mi355x-amds", 9, 3, 1, 5),
    ]}


def scenario() -> dict[str, Any]:
    return {
        "now": NOW,
        "seed": 7,
        "capacity": capacity(),
        "repositories": [{
            "full_name": REPO,
            "installation_id": 1,
            "owner_type": "Organization",
            "default_branch": "main",
            "files": BASE_FILES,
            "collaborators": {"alice": "admin", "bob": "write", "carol": "read"},
            "history": history(),
            "pulls": pulls(),
            "runs": runs(),
        }],
        "timeline": timeline(),
    }


def render() -> str:
    data = scenario()
    parse_scenario(data, "generated demo scenario")
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare with the bundled file")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = BUNDLED_SCENARIO.read_text(encoding="utf-8") if BUNDLED_SCENARIO.exists() else ""
        if current != text:
            print(f"{BUNDLED_SCENARIO} is stale; run python -m bot.sandbox.make_demo", file=sys.stderr)
            return 1
        return 0
    BUNDLED_SCENARIO.parent.mkdir(parents=True, exist_ok=True)
    BUNDLED_SCENARIO.write_text(text, encoding="utf-8")
    print(f"wrote {BUNDLED_SCENARIO}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
