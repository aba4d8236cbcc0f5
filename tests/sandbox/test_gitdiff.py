"""bot.sandbox.gitdiff must print what `git diff` prints, hunk headers included."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from bot.sandbox.gitdiff import funcname_of, split_lines, unified_diff

BASE = """\
dsr1-fp4-b200-sglang:
  image: lmsysorg/sglang:v0.5.12.post1
  model: nvidia/DeepSeek-R1-0528-FP4-V2
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
      - { tp: 4, ep: 4, conc-start: 4, conc-end: 128 }
      - { tp: 8, ep: 8, conc-start: 4, conc-end: 256 }

dsr1-fp4-b200-sglang-mtp:
  image: lmsysorg/sglang:v0.5.12.post1
  model: nvidia/DeepSeek-R1-0528-FP4-V2
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
      - { tp: 4, ep: 4, conc-start: 4, conc-end: 128, spec-decoding: mtp }

# Qwen on B300
qwen3.5-fp4-b300-sglang:
  image: lmsysorg/sglang:v0.5.14-cu130
  model: nvidia/Qwen3.5-397B-A17B-NVFP4
  model-prefix: qwen3.5
  runner: b300
  precision: fp4
  framework: sglang
  scenarios:
    fixed-seq-len:
    - isl: 8192
      osl: 1024
      search-space:
      - { tp: 4, conc-start: 4, conc-end: 64 }
"""

NEW_FAMILY = """\
dsr1-fp4-b200-sglang-new:
  image: lmsysorg/sglang:v0.5.16-cu130
  model: nvidia/DeepSeek-R1-0528-FP4-V2
  model-prefix: dsr1
  runner: b200
  precision: fp4
  framework: sglang
  scenarios:
    fixed-seq-len:
    - isl: 1024
      osl: 1024
      search-space:
      - { tp: 4, ep: 4, conc-start: 4, conc-end: 128 }

"""


def _replace(text: str, old: str, new: str, count: int = 1) -> str:
    assert old in text, old
    return text.replace(old, new, count)


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _drop_block(text: str, first: str, last_exclusive: str) -> str:
    start = text.index(first)
    end = text.index(last_exclusive)
    return text[:start] + text[end:]


CASES: dict[str, tuple[str | None, str | None]] = {
    "image bump": (BASE, _replace(BASE, "v0.5.12.post1", "v0.5.16-cu130")),
    "two image bumps in one hunk distance": (
        BASE,
        BASE.replace("v0.5.12.post1", "v0.5.16-cu130"),
    ),
    "flag change deep in a block": (BASE, _replace(BASE, "conc-end: 256", "conc-end: 512")),
    "added block between families": (
        BASE,
        _replace(BASE, "dsr1-fp4-b200-sglang-mtp:\n", NEW_FAMILY + "dsr1-fp4-b200-sglang-mtp:\n"),
    ),
    "added block at the end": (BASE, BASE + "\n" + NEW_FAMILY.rstrip("\n") + "\n"),
    "removed block": (
        BASE,
        _drop_block(BASE, "dsr1-fp4-b200-sglang-mtp:\n", "# Qwen on B300\n"),
    ),
    "change on the first line": (BASE, _replace(BASE, "dsr1-fp4-b200-sglang:", "dsr1-x:")),
    "change on the last line": (BASE, _replace(BASE, "conc-end: 64 }", "conc-end: 32 }")),
    "multiple separate hunks": (
        BASE,
        _replace(
            _replace(BASE, "multinode: false", "multinode: true"),
            "model: nvidia/Qwen3.5-397B-A17B-NVFP4",
            "model: nvidia/Qwen3.5-397B-A17B-NVFP4-V2",
        ),
    ),
    "nearby changes merge into one hunk": (
        BASE,
        _replace(_replace(BASE, "runner: b300", "runner: b300-nv"), "isl: 8192", "isl: 4096"),
    ),
    "comment-only change": (BASE, _replace(BASE, "# Qwen on B300", "# Qwen 3.5 on B300")),
    "no newline at end of new file": (BASE, BASE.rstrip("\n")),
    "no newline at end of old file": (BASE.rstrip("\n"), BASE),
    "no newline at either end, last line changed": (
        BASE.rstrip("\n"),
        _replace(BASE, "conc-end: 64 }", "conc-end: 8 }").rstrip("\n"),
    ),
    "new file": (None, BASE),
    "deleted file": (BASE, None),
    "single-line files": ("a\n", "b\n"),
    "empty to one line without newline": ("", "x"),
    "crlf lines": (BASE.replace("\n", "\r\n"), BASE.replace("\n", "\r\n").replace("b300", "b3")),
    "tabs and blank runs": (
        "top:\n\tone\n\n\n\ttwo\n\tthree\n",
        "top:\n\tone\n\n\n\n\ttwo\n\tthree\n\tfour\n",
    ),
    "funcname longer than 80 bytes": (
        "k" * 100 + ":\n" + "".join(f"  v{i}: {i}\n" for i in range(10)),
        "k" * 100 + ":\n" + "".join(f"  v{i}: {i + (i == 7)}\n" for i in range(10)),
    ),
    "funcname cut inside a multi-byte character": (
        "x" * 79 + "ééé:\n" + "".join(f"  v{i}: {i}\n" for i in range(10)),
        "x" * 79 + "ééé:\n" + "".join(f"  v{i}: {i + (i == 8)}\n" for i in range(10)),
    ),
    "funcname cut after spaces inside a multi-byte character": (
        "x" * 76 + "  中中:\n" + "".join(f"  v{i}: {i}\n" for i in range(10)),
        "x" * 76 + "  中中:\n" + "".join(f"  v{i}: {i + (i == 8)}\n" for i in range(10)),
    ),
    "moved block": (
        BASE,
        _drop_block(BASE, "# Qwen on B300\n", "qwen3.5-fp4-b300-sglang:\n").replace(
            "dsr1-fp4-b200-sglang:\n", "# Qwen on B300\ndsr1-fp4-b200-sglang:\n"
        ),
    ),
    "repeated lines slide (indent heuristic)": (
        "a:\n  x: 1\n\nb:\n  x: 1\n\nc:\n  x: 1\n",
        "a:\n  x: 1\n\nb:\n  x: 1\n\nn:\n  x: 1\n\nc:\n  x: 1\n",
    ),
}


def _git_diff(tmp_path: Path, old: str | None, new: str | None) -> str:
    """What real git prints, from the first `@@` on."""
    left, right = tmp_path / "old", tmp_path / "new"
    left.write_bytes((old or "").encode())
    right.write_bytes((new or "").encode())
    result = subprocess.run(
        ["git", "diff", "--no-index", "--no-color", "--no-ext-diff", str(left), str(right)],
        capture_output=True,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    out = result.stdout.decode("utf-8", errors="replace")
    start = out.find("\n@@")
    return "" if start < 0 else out[start + 1 :]


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@needs_git
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_git(tmp_path: Path, name: str) -> None:
    old, new = CASES[name]
    expected = _git_diff(tmp_path, old, new)
    assert expected, "each case must change something"
    assert unified_diff(old, new) == expected


@needs_git
def test_random_edits_of_a_real_config_match_git(tmp_path: Path, fixtures: Path) -> None:
    """Seeded random insertions, deletions and replacements of real master-config lines."""
    real = _lines((fixtures / "inferencex/configs/amd-master.yaml").read_text())
    rng = random.Random(20260821)
    for _ in range(40):
        start = rng.randrange(len(real) - 300)
        base = real[start : start + rng.randint(60, 300)]
        new = list(base)
        for _ in range(rng.randint(1, 8)):
            at = rng.randrange(len(new))
            roll = rng.random()
            if roll < 0.35:
                del new[at : at + rng.randint(1, 4)]
            elif roll < 0.7:
                new[at:at] = rng.sample(base, rng.randint(1, 3))
            else:
                new[at] = rng.choice(["\n", "  image: x\n", "new-key:\n", "    - { tp: 2 }\n"])
        old_text, new_text = "".join(base), "".join(new)
        assert unified_diff(old_text, new_text) == _git_diff(tmp_path, old_text, new_text)


@needs_git
def test_large_rewrite_with_many_equal_lines_matches_git(tmp_path: Path) -> None:
    """Drives the search past xdiff's cost limits, where its shortcuts decide the hunks."""
    rng = random.Random(7)
    vocabulary = [f"  line{i}: v\n" for i in range(12)] + ["\n", "key:\n"]
    old = "".join(rng.choice(vocabulary) for _ in range(1500))
    new = "".join(rng.choice(vocabulary) for _ in range(1400))
    assert unified_diff(old, new) == _git_diff(tmp_path, old, new)


def test_fixture_patches_are_reproduced_exactly(fixtures: Path) -> None:
    checked = 0
    for path in sorted((fixtures / "inferencex/patches").glob("*.json")):
        for file in json.loads(path.read_text())["files"]:
            if file.get("base_content") is None and file.get("content") is None:
                continue
            assert unified_diff(file.get("base_content"), file.get("content")) == file["patch"], (
                f"{path.name}: {file['filename']}"
            )
            checked += 1
    assert checked >= 10


# Expectations written out by hand, so the rules hold even where git is absent.


def test_image_bump_output() -> None:
    old = "a:\n  image: x:1\n  runner: b200\n  model: m\n  precision: fp4\n"
    new = old.replace("x:1", "x:2")
    assert unified_diff(old, new) == (
        "@@ -1,5 +1,5 @@\n"
        " a:\n"
        "-  image: x:1\n"
        "+  image: x:2\n"
        "   runner: b200\n"
        "   model: m\n"
        "   precision: fp4\n"
    )


def test_hunk_header_names_the_nearest_key_above_the_hunk() -> None:
    old = "first:\n" + "".join(f"  k{i}: {i}\n" for i in range(20))
    new = old.replace("  k8: 8\n", "  k8: 9\n")
    assert unified_diff(old, new).splitlines()[0] == "@@ -7,7 +7,7 @@ first:"


def test_new_and_deleted_file_headers() -> None:
    assert unified_diff(None, "a\nb\n") == "@@ -0,0 +1,2 @@\n+a\n+b\n"
    assert unified_diff("a\n", None) == "@@ -1 +0,0 @@\n-a\n"


def test_missing_final_newline_is_marked() -> None:
    assert unified_diff("a\n", "a") == (
        "@@ -1 +1 @@\n-a\n+a\n\\ No newline at end of file\n"
    )


def test_equal_texts_give_no_patch() -> None:
    assert unified_diff(BASE, BASE) == ""
    assert unified_diff(None, "") == ""


def test_funcname_rule() -> None:
    assert funcname_of("dsr1-fp4:\n") == "dsr1-fp4:"
    assert funcname_of("_private  \n") == "_private"
    assert funcname_of("$var\n") == "$var"
    assert funcname_of("  image: x\n") is None
    assert funcname_of("# comment\n") is None
    assert funcname_of("\n") is None
    assert funcname_of("9lives:\n") is None
    assert funcname_of("k" * 100 + "\n") == "k" * 80
    assert funcname_of("k" * 79 + "é:\n") == "k" * 79
    assert funcname_of("k" * 76 + "  中中:\n") == "k" * 76 + "  "


def test_split_lines_only_breaks_on_newline() -> None:
    assert split_lines("a\r\nb\x0bc\u2028d\n") == ["a\r\n", "b\x0bc\u2028d\n"]
    assert split_lines("a\nb") == ["a\n", "b"]
    assert split_lines("") == []
