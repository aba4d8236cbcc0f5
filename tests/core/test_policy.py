"""`.github/klaud.yml`: defaults, and every unreadable file a PolicyError naming the file."""

from __future__ import annotations

import pytest

from bot.core.policy import MAX_GLOBS, Policy, PolicyError, parse_policy

# Past Python's limit on turning a string of digits into an int (ValueError in PyYAML).
LONG_NUMBER = "1" * 5000


def test_no_file_or_an_empty_one_means_the_defaults() -> None:
    assert parse_policy(None) == parse_policy("") == parse_policy("# only a comment\n") == Policy()
    assert parse_policy("cooldown_hours: 6\n").cooldown_hours == 6


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cooldown_hours: [\n", r"not valid YAML at line 2$"),
        (f"cooldown_hours: {LONG_NUMBER}\n", r"not valid YAML"),  # escaped as ValueError
        ("x: " + "[" * 600 + "]" * 600 + "\n", r"not valid YAML"),  # escaped as RecursionError
        ("- a list\n", r"expected a mapping"),
        ("cooldown_hours: soon\n", r"cooldown_hours: "),
    ],
)
def test_an_unreadable_policy_is_a_policy_error_naming_the_file(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=r"^\.github/klaud\.yml: ") as raised:
        parse_policy(text)
    assert raised.match(message)


def test_defaults_are_the_ones_design_3_6_lists() -> None:
    policy = Policy()
    assert policy.model_dump() == {
        "cooldown_hours": 24,
        "wave_every_minutes": 120,
        "max_candidates_per_wave": 5,
        "max_in_flight": 10,
        "idle_days": 7,
        "candidate_workflow": "klaud-candidate.yml",
        "outcome_workflows": ("klaud-candidate.yml", "klaud-plan.yml"),
        "config_globs": ("configs/*-master.yaml",),
        "runners_file": "configs/runners.yaml",
        "family_files": (),
        "capacity_rule": "all",
        "claim_ttl_hours": 12,
        "enabled": True,
        "candidate_inputs": {"candidate": "candidate", "family": "family", "base": "base", "wave": "wave"},
        "dashboard": True,
    }


@pytest.mark.parametrize(
    ("key", "lowest", "highest"),
    [
        ("cooldown_hours", 1, 168),  # domain §4.6: cooldown 24 h (1–168 allowed)
        ("max_candidates_per_wave", 1, 256),  # domain §1.2: MAX_CANDIDATES_PER_RUN, CLI range 1–256
    ],
)
def test_bounds_the_domain_gives(key: str, lowest: int, highest: int) -> None:
    assert getattr(parse_policy(f"{key}: {lowest}\n"), key) == lowest
    assert getattr(parse_policy(f"{key}: {highest}\n"), key) == highest
    for outside in (lowest - 1, highest + 1):
        with pytest.raises(PolicyError, match=key):
            parse_policy(f"{key}: {outside}\n")


def test_a_count_written_true_or_false_is_refused_not_read_as_one_or_zero() -> None:
    with pytest.raises(PolicyError, match="cooldown_hours.*not true or false"):
        parse_policy("cooldown_hours: true\n")
    assert parse_policy("cooldown_hours: 1\n").cooldown_hours == 1


@pytest.mark.parametrize(("text", "message"), [
    ('cooldown_hours: "24"', "cooldown_hours.*whole number, not '24'"),
    ("max_in_flight: 5.0", "max_in_flight.*whole number, not 5.0"),
    ('enabled: "yes"', "enabled.*true or false, not 'yes'"),
    ("enabled: 1", "enabled.*true or false, not 1"),
    ('dashboard: "off"', "dashboard.*true or false, not 'off'"),
])
def test_a_value_of_another_type_is_refused_not_converted(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(text + "\n")


def test_a_key_set_twice_is_refused_naming_both_lines() -> None:
    # YAML keeps the last in silence: `cooldown_hours: 24` then `cooldown_hours: 1` further down.
    with pytest.raises(PolicyError, match=r"cooldown_hours is set twice \(lines 1 and 3\)"):
        parse_policy("cooldown_hours: 24\nidle_days: 3\ncooldown_hours: 1\n")
    assert parse_policy("cooldown_hours: 24\ncooldown_hours: 1\n", stored=True).cooldown_hours == 1  # kept as stored


def test_yaml_own_truth_words_are_truth_values() -> None:
    assert parse_policy("enabled: no\ndashboard: off\n").model_dump(include={"enabled", "dashboard"}) == {
        "enabled": False, "dashboard": False}


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ("{family: target, wave: target}", "family and wave both go to input 'target'"),
        ("{candidate: ''}", "candidate_inputs.candidate"),
    ],
)
def test_candidate_inputs_that_would_lose_a_value_are_refused(inputs: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(f"candidate_inputs: {inputs}\n")


def test_family_files_with_an_unknown_placeholder_is_refused_naming_it() -> None:
    # What this catches: `{model}` kept in the glob as text, matching no file, in silence.
    with pytest.raises(PolicyError, match=r"family_files.*unknown placeholder \{model\}"):
        parse_policy("family_files: ['benchmarks/{model}/*.sh']\n")
    known = "family_files: ['benchmarks/{model-prefix}_{precision}_{framework}_{hardware}.sh', 'x/{key}.yaml']\n"
    assert len(parse_policy(known).family_files) == 2


@pytest.mark.parametrize("key", ["config_globs", "family_files"])
def test_a_glob_klaud_cannot_match_is_a_policy_error(key: str) -> None:
    # What this catches (a hostile-input review): `[z-a]` was accepted, then raised re.error
    # at every push and reconcile of the repository, with no policy error said.
    with pytest.raises(PolicyError, match=rf"{key}.*'configs/\[z-a\]\*-master.yaml': not a valid glob"):
        parse_policy(f"{key}: ['configs/[z-a]*-master.yaml']\n")
    assert parse_policy(f"{key}: ['configs/[a-z]*-master.yaml']\n")


def test_the_lists_and_names_of_the_policy_are_bounded() -> None:
    # 2,000 globs took 23 s of the event loop for one pull request's files.
    many = ", ".join(f"'configs/{n}/*.yaml'" for n in range(MAX_GLOBS + 1))
    for key in ("config_globs", "family_files"):
        with pytest.raises(PolicyError, match=key):
            parse_policy(f"{key}: [{many}]\n")
    with pytest.raises(PolicyError, match="outcome_workflows"):
        parse_policy("outcome_workflows: [" + ", ".join(f"w{n}.yml" for n in range(17)) + "]\n")
    with pytest.raises(PolicyError, match="runners_file"):
        parse_policy(f"runners_file: {'x' * 257}\n")
    assert len(parse_policy("config_globs: [" + ", ".join(f"'c/{n}/*.yaml'" for n in range(MAX_GLOBS)) + "]\n").config_globs) == MAX_GLOBS


def test_a_placeholder_inside_a_character_class_is_refused() -> None:
    # Found by a review: `[a-{precision}]` passed as `[a-x]`, and was a reversed range for a
    # family whose precision is `8`: every pull request's event raised in the overlap index.
    with pytest.raises(PolicyError, match=r"placeholder inside \[\.\.\.\] is not allowed"):
        parse_policy("family_files: ['benchmarks/[a-{precision}]*/**']\n")
    assert parse_policy("family_files: ['benchmarks/[a-z]*/{precision}/**']\n")


def test_an_input_set_twice_in_candidate_inputs_is_refused_like_a_top_level_key() -> None:
    # "a key set twice in .github/klaud.yml is refused, naming both lines": YAML keeps the
    # last `candidate:` in silence here too, and the workflow gets an input nobody meant.
    with pytest.raises(PolicyError, match="set twice"):
        parse_policy("candidate_inputs:\n  candidate: cand\n  family: fam\n  candidate: other\n")
