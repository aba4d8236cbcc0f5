"""Small sandbox scenarios for the integration tests (our own data, not the fixtures)."""

from __future__ import annotations

import copy
from typing import Any

from bot.core.domain import candidate_id

NOW = "2026-11-30T08:00:00Z"
REPO = "acme/bench"

NVIDIA = """\
dsr1-fp4-b200-sglang:
  image: lmsysorg/sglang:v0.5.16-cu130
  model: deepseek-r1-fp4
  model-prefix: dsr1
  runner: b200
  precision: fp4
  framework: sglang
  multinode: false
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 1024
      search-space:
      - { tp: 8, conc-start: 4, conc-end: 64 }

dsr1-fp8-h200-trt:
  image: nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc4
  model: deepseek-r1-fp8
  model-prefix: dsr1
  runner: h200
  precision: fp8
  framework: trt
  multinode: false
  scenarios:
    fixed-seq-len:
    - isl: 8192
      osl: 1024
      search-space:
      - { tp: 8, conc-start: 4, conc-end: 32 }

gptoss-fp4-b200-vllm:
  image: vllm/vllm-openai:v0.11.2
  model: openai/gpt-oss-120b
  model-prefix: gptoss
  runner: cluster:b200-nscale
  precision: fp4
  framework: vllm
  multinode: false
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 8192
      search-space:
      - { tp: 1, conc-start: 4, conc-end: 128 }
"""

AMD = """\
dsr1-fp8-mi355x-sglang:
  image: lmsysorg/sglang:v0.5.5-rocm700-mi35x
  model: deepseek-r1-fp8
  model-prefix: dsr1
  runner: mi355x
  precision: fp8
  framework: sglang
  multinode: false
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 1024
      search-space:
      - { tp: 8, conc-start: 4, conc-end: 64 }

llama70b-fp8-mi300x-vllm:
  image: rocm/vllm:rocm7.0.0_vllm_0.10.1
  model: meta-llama/Llama-3.3-70B-Instruct
  model-prefix: llama70b
  runner: mi300x
  precision: fp8
  framework: vllm
  multinode: false
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 1024
      search-space:
      - { tp: 4, conc-start: 4, conc-end: 64 }
"""

RUNNERS = """\
clusters:
  b200-nscale: {}
  b200-dgxc: {}
  h200-nb: {}
  mi355x-amds: {}
  mi300x-amd: {}
labels:
  b200:
    - b200-nscale_0
    - b200-nscale_1
    - b200-dgxc_0
  h200:
    - h200-nb_0
    - h200-nb_1
  mi355x:
    - mi355x-amds_0
  mi300x:
    - mi300x-amd_0
"""

CANDIDATE_WORKFLOW = """\
name: Klaud Cold candidate
run-name: Klaud Cold candidate ${{ inputs.candidate }}
on:
  workflow_dispatch:
    inputs:
      candidate: {required: true, type: string}
      family: {required: true, type: string}
      base: {required: true, type: string}
      wave: {required: true, type: string}
jobs:
  candidate:
    runs-on: ubuntu-latest
    steps:
    - run: echo "${{ inputs.candidate }}"
"""

CLUSTERS = ["b200-nscale", "b200-dgxc", "h200-nb", "mi355x-amds", "mi300x-amd"]

FAMILIES = {
    "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang": "lmsysorg/sglang:v0.5.16-cu130",
    "configs/nvidia-master.yaml:dsr1-fp8-h200-trt": "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc4",
    "configs/nvidia-master.yaml:gptoss-fp4-b200-vllm": "vllm/vllm-openai:v0.11.2",
    "configs/amd-master.yaml:dsr1-fp8-mi355x-sglang": "lmsysorg/sglang:v0.5.5-rocm700-mi35x",
    "configs/amd-master.yaml:llama70b-fp8-mi300x-vllm": "rocm/vllm:rocm7.0.0_vllm_0.10.1",
}


def candidate(family: str) -> str:
    return candidate_id(family, FAMILIES[family])


def cluster(cluster_id: str, *, busy: bool = False) -> dict[str, Any]:
    if busy:
        return {"id": cluster_id, "status": "operational", "total": 10, "allocated": 9, "mixed": 0, "idle": 1, "down": 0, "other": 0}
    return {"id": cluster_id, "status": "operational", "total": 10, "allocated": 2, "mixed": 0, "idle": 8, "down": 0, "other": 0}


def scenario(*, busy: tuple[str, ...] = (), policy: str | None = None, pulls: list | None = None, runs: list | None = None) -> dict[str, Any]:
    files = {
        "configs/nvidia-master.yaml": NVIDIA,
        "configs/amd-master.yaml": AMD,
        "configs/runners.yaml": RUNNERS,
        ".github/workflows/klaud-candidate.yml": CANDIDATE_WORKFLOW,
        "perf-changelog.yaml": "- date: 2026-11-01\n  description: start\n",
    }
    if policy is not None:
        files[".github/klaud.yml"] = policy
    return copy.deepcopy(
        {
            "now": NOW,
            "capacity": {"clusters": [cluster(c, busy=c in busy) for c in CLUSTERS]},
            "repositories": [
                {
                    "full_name": REPO,
                    "installation_id": 1,
                    "default_branch": "main",
                    "files": files,
                    "collaborators": {"alice": "admin", "bob": "write", "carol": "read"},
                    "pulls": pulls or [],
                    "runs": runs or [],
                }
            ],
            "timeline": [],
        }
    )


def image_bump(number: int, family_key: str = "dsr1-fp4-b200-sglang", *, user: str = "bob", updated_at: str = NOW) -> dict[str, Any]:
    """A human PR that bumps one NVIDIA family's image."""
    old = FAMILIES[f"configs/nvidia-master.yaml:{family_key}"]
    return {
        "number": number,
        "title": f"Bump {family_key}",
        "user": user,
        "head_ref": f"bump-{family_key}",
        "draft": False,
        "labels": [],
        "created_at": updated_at,
        "updated_at": updated_at,
        "files": [{"filename": "configs/nvidia-master.yaml", "status": "modified", "content": NVIDIA.replace(old, old + "-post1")}],
    }


def diagnostics(outcome: str, phase: str = "targeted", **extra: Any) -> dict[str, Any]:
    body = {"outcome": outcome, "phase": phase, "pull-request": extra.pop("pull_request", None), "run-ids": extra.pop("run_ids", []), "repairs-used": 0}
    body.update(extra)
    return {"candidate-outcome": body, "action-outcome": "success"}


def run(run_id: int, cand: str, outcome: str | None, *, completed_at: str = "2026-11-30T07:00:00Z", head_sha: str = "a" * 40, expired: bool = False, files: dict | None = None) -> dict[str, Any]:
    artifact_files = files if files is not None else {"candidate-diagnostics.json": diagnostics(outcome or "failed")}
    return {
        "id": run_id,
        "workflow": "klaud-plan.yml",
        "head_sha": head_sha,
        "event": "schedule",
        "conclusion": "success",
        "created_at": completed_at,
        "completed_at": completed_at,
        "artifacts": [{"name": f"klaud-candidate-{cand}", "expired": expired, "files": artifact_files}],
    }
