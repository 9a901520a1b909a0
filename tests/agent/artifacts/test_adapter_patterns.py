"""Regular expressions from adapter_config.json run with bounded work and PEFT's exact semantics.

Before the fix `rank_pattern: {"(.*.*)*x": 4}` froze the process (Python's `re` backtracking while
holding the GIL) and `{"(": 4}` raised re.error (a 500).
"""

import re

import pytest

from agent.artifacts import ArtifactError
from agent.artifacts.adapters import read_adapter_dir
from agent.artifacts.limits import MAX_LORA_RANK
from agent.artifacts.patterns import PatternMatcher
from tests.adapter_files import write_adapter
from tests.agent.artifacts.isolated import outcome

UP = "model.layers.0.mlp.up_proj"
SLOW = ".*?" * 10 + "[0-9]"  # no nesting, yet backtracks for seconds even in `regex` on a module name


def _adapter(tmp_path, **config):
    return write_adapter(tmp_path / "a", {UP: (8, 16, 32)}, **config)


@pytest.mark.parametrize("field", ["rank_pattern", "alpha_pattern"])
def test_a_repeat_inside_a_repeat_is_refused_at_once_instead_of_freezing(tmp_path, field):
    # the probe's pattern: Python's re (PEFT's engine) backtracks on it for hours, holding the GIL
    result = outcome("agent.artifacts.read_adapter_dir", _adapter(tmp_path, **{field: {"(.*.*)*x": 4}}))
    assert result.startswith("ArtifactError: "), result
    assert f"adapter_config.json: {field} pattern '(.*.*)*x' repeats inside a repeat" in result


@pytest.mark.parametrize("field", ["rank_pattern", "alpha_pattern"])
def test_a_pattern_that_takes_too_long_names_the_file_and_field(tmp_path, field):
    path = _adapter(tmp_path, **{field: {SLOW: 4}})
    result = outcome("agent.artifacts.read_adapter_dir", path)
    assert result.startswith(f"ArtifactError: {path / 'adapter_config.json'}: {field} pattern "), result
    assert "takes too long to match a module name" in result


def test_a_target_modules_pattern_that_takes_too_long_is_refused(tmp_path):
    result = outcome("agent.artifacts.read_adapter_dir", _adapter(tmp_path, target_modules=SLOW))
    assert "adapter_config.json: target_modules pattern" in result and "takes too long" in result, result


@pytest.mark.parametrize(("pattern", "why"), [
    ("((a{300}){300}){300}", "repeats inside a repeat"),
    ("a{100000}", "repeats too much"),
    ("(?:ab){200}c{200}", "repeats too much"),
])
def test_counted_repeats_beyond_what_compiles_quickly_are_refused_before_compiling(tmp_path, pattern, why):
    # `regex` expands counted repeats while compiling, and compiling has no timeout
    result = outcome("agent.artifacts.read_adapter_dir", _adapter(tmp_path, rank_pattern={pattern: 4}))
    assert result.startswith(f"ArtifactError: {tmp_path / 'a' / 'adapter_config.json'}: rank_pattern pattern"), result
    assert why in result


def test_a_pattern_that_only_the_regex_package_understands_is_refused_like_peft_would(tmp_path):
    with pytest.raises(ArtifactError, match=r"rank_pattern pattern .*p\{L\}.* is not a valid regular expression \(bad"):
        read_adapter_dir(_adapter(tmp_path, rank_pattern={r"\p{L}+_proj": 4}))


@pytest.mark.parametrize(
    ("config", "field"),
    [({"rank_pattern": {"(": 4}}, "rank_pattern"), ({"alpha_pattern": {"[a-": 4}}, "alpha_pattern"),
     ({"target_modules": "(q|v_proj"}, "target_modules")],
)
def test_an_invalid_pattern_names_the_file_and_field(tmp_path, config, field):
    with pytest.raises(ArtifactError, match=rf"adapter_config\.json: {field} pattern .* is not a valid regular expr"):
        read_adapter_dir(_adapter(tmp_path, **config))


def test_a_pattern_longer_than_the_limit_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match=r"rank_pattern pattern .* is 2,000 characters long \(at most 1024"):
        read_adapter_dir(_adapter(tmp_path, rank_pattern={"a" * 2000: 4}))


def test_all_patterns_of_one_config_share_a_time_budget():
    matcher = PatternMatcher("adapter_config.json", budget=0)
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: rank_pattern patterns take too long .* in all"):
        matcher.pattern_value("rank_pattern", {"(q|v)_proj": 4}, "model.q_proj", 8)


# --- PEFT's semantics ---------------------------------------------------------------------------

KEYS = ["layers.1.self_attn.q_proj", "q_proj", r"layers\.\d+\.mlp\.up_proj", "(q|v)_proj", "self_attn", "proj",
        "", ".*", "1.self_attn.v_proj", "mlp.*", "layers.0", r"layers\.1\.self_attn\.v_proj$", "h.0.attn.c_attn$",
        r"0\.mlp\.up_proj", "$", "ayers.0"]
MODULES = ["model.layers.1.self_attn.q_proj", "model.layers.10.self_attn.q_proj", "model.layersX1.self_attnYq_proj",
           "model.layers.0.mlp.up_proj", "up_proj", "q_proj", "model.layers.1.self_attn.v_proj", "xq_proj",
           "model.layers.0", "transformer.h.0.attn.c_attn", "transformer.hX0.attn.c_attn", "model.", "",
           "model.layersX1.self_attn.v_proj", "model.layers.0Xmlp.up_proj", "model.q_proj\n", "model.layers\n0"]


def _peft_get_pattern_key(pattern_keys, key_to_match):
    """peft.utils.other.get_pattern_key (peft 0.21), copied as the reference for semantics."""
    for key in pattern_keys:
        if re.match(rf"(.*\.)?({key})$", key_to_match):
            return key
    return key_to_match


@pytest.mark.parametrize("module", MODULES)
def test_rank_pattern_picks_the_value_peft_picks(module):
    matcher = PatternMatcher("adapter_config.json")
    for start in range(len(KEYS)):  # every key gets to be first, so first-match order is exercised
        patterns = {k: i for i, k in enumerate(KEYS[start:] + KEYS[:start])}
        expected = patterns.get(_peft_get_pattern_key(patterns, module), -1)
        assert matcher.pattern_value("rank_pattern", patterns, module, -1) == expected, (patterns, module)


def test_rank_pattern_semantics_match_the_installed_peft():
    other = pytest.importorskip("peft.utils.other")
    matcher = PatternMatcher("adapter_config.json")
    patterns = {k: i for i, k in enumerate(KEYS)}
    for module in MODULES:
        expected = patterns.get(other.get_pattern_key(patterns.keys(), module), -1)
        assert matcher.pattern_value("rank_pattern", patterns, module, -1) == expected, module
    for pattern in [r".*\.(q|v)_proj", "q_proj", r"model\.layers\.\d\..*", ".*"]:
        for module in MODULES:
            assert matcher.targets(pattern, module) == bool(other.match_target_against_key(pattern, module))


def test_a_rank_pattern_naming_every_module_is_matched_well_within_the_budget():
    # PEFT's EVA initialisation writes one rank_pattern key per module; 126 layers x 7 projections here
    names = [f"model.layers.{i}.{p}" for i in range(126) for p in ("self_attn.q_proj", "self_attn.k_proj",
             "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
    patterns = {name: 1 + i % 64 for i, name in enumerate(reversed(names))}
    matcher = PatternMatcher("adapter_config.json")
    matcher.check_pattern_keys("rank_pattern", patterns)
    assert [matcher.pattern_value("rank_pattern", patterns, n, 0) for n in names] == [patterns[n] for n in names]


@pytest.mark.parametrize("target", [r".*\.mlp\.up_proj", r"model\.layers\.\d+\.mlp\.(up|down)_proj", "all-linear"])
def test_target_modules_as_a_pattern_that_selects_every_module_is_accepted(tmp_path, target):
    assert read_adapter_dir(_adapter(tmp_path, target_modules=target)).target_modules == target


@pytest.mark.parametrize("target", [r".*q_proj", "up_proj", r"mlp\.up_proj"])  # fullmatch: a suffix is not enough
def test_a_module_that_target_modules_does_not_select_is_refused(tmp_path, target):
    with pytest.raises(ArtifactError, match=rf"module {UP} is not selected by target_modules"):
        read_adapter_dir(_adapter(tmp_path, target_modules=target))


def test_rank_and_alpha_patterns_still_set_ranks_and_scales(tmp_path):
    modules = {"model.layers.0.self_attn.q_proj": (4, 16, 16), "model.layers.1.self_attn.q_proj": (8, 16, 16)}
    path = write_adapter(tmp_path / "a", modules, r=8, lora_alpha=16, rank_pattern={r"layers\.0\..*": 4},
                         alpha_pattern={"layers.1.self_attn.q_proj": 2})
    adapter = read_adapter_dir(path)
    assert adapter.ranks == {"model.layers.0.self_attn.q_proj": 4, "model.layers.1.self_attn.q_proj": 8}
    assert [m.scale for m in adapter.modules] == [16 / 4, 2 / 8]


# --- bounds on the numbers ----------------------------------------------------------------------


@pytest.mark.parametrize("r", [0, -1, MAX_LORA_RANK + 1, True, 2.0, "8"])
def test_r_must_be_an_integer_rank_within_bounds(tmp_path, r):
    with pytest.raises(ArtifactError, match=rf"adapter_config\.json: r must be an integer from 1 to {MAX_LORA_RANK:,}"):
        read_adapter_dir(_adapter(tmp_path, r=r))


@pytest.mark.parametrize("value", [0, 2.5, "4", MAX_LORA_RANK + 1, None])
def test_rank_pattern_values_must_be_ranks(tmp_path, value):
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: rank_pattern must map .* to integer ranks"):
        read_adapter_dir(_adapter(tmp_path, rank_pattern={"up_proj": value}))


@pytest.mark.parametrize("value", ["2", [2], None, True])
def test_alpha_pattern_values_must_be_finite_numbers(tmp_path, value):
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: alpha_pattern must map .* to finite numbers"):
        read_adapter_dir(_adapter(tmp_path, alpha_pattern={"up_proj": value}))


@pytest.mark.parametrize("targets", [[{"name": "up_proj"}], 7, None, ["up_proj"] * 5000])
def test_target_modules_must_be_names_or_one_pattern(tmp_path, targets):
    with pytest.raises(ArtifactError, match=r"adapter_config\.json: target_modules must be a list of at most"):
        read_adapter_dir(_adapter(tmp_path, target_modules=targets))


def test_a_config_written_by_hand_with_a_huge_lora_alpha_is_still_finite(tmp_path):
    assert read_adapter_dir(_adapter(tmp_path, lora_alpha=1e300)).modules[0].scale == 1e300 / 8
