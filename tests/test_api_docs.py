"""docs/API.md is generated from the public docstrings and the settings' metadata, and must be regenerated when they
change."""

import dataclasses
import importlib.util
import inspect
import re
from pathlib import Path

import pytest
from trl import GRPOConfig

import dapo_trl

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gen_api_docs.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_api_docs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_api_docs_are_up_to_date(gen):
    committed = gen.OUTPUT.read_text()
    assert committed == gen.render(), "docs/API.md is out of date: run `python scripts/gen_api_docs.py`"


def test_every_public_name_and_extension_point_is_documented(gen):
    text = gen.render()
    for name in dapo_trl.__all__:
        if not name.startswith("_"):
            assert f"### `{name}`" in text, name
    for hook in (
        "filter_values",
        "select_informative_groups",
        "skip_prompt",
        "on_groups_scored",
        "plan_batch",
        "build_overlong_penalty",
        "log_dynamic_sampling",
    ):
        assert f"##### `DAPOTrainer.{hook}`" in text, hook


def test_a_changed_docstring_or_signature_makes_the_docs_stale(gen, monkeypatch):
    before = gen.render()
    monkeypatch.setattr(dapo_trl.DAPOTrainer.skip_prompt, "__doc__", "Extension point: changed.")
    assert gen.render() != before

    monkeypatch.undo()

    def verify(gold: str, predicted: str, *, timeout_s: float = 5.0) -> bool:
        """Same docstring, new default."""

    monkeypatch.setattr(dapo_trl, "verify", verify)
    assert gen.render() != before


# ---------------------------------------------------------------------------------------------------------------------
# The settings reference: DAPOConfig's settings and MathVerifierReward's arguments, read from the code
# ---------------------------------------------------------------------------------------------------------------------


def table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """The rows of the tables under `heading` (up to the next heading of its level), keyed by their first cell."""
    section = text[text.index(heading) + len(heading) :]
    section = section[: section.index("\n#### ")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if cells and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_dapo_setting_has_a_row_with_its_type_default_and_help(gen):
    rows = table_rows(gen.render(), "#### `DAPOConfig` settings")
    own = dapo_trl.DAPOConfig.__annotations__
    grpo = {f.name: f.default for f in dataclasses.fields(GRPOConfig)}
    assert set(rows) == set(own), set(rows) ^ set(own)
    for field in dataclasses.fields(dapo_trl.DAPOConfig):
        if field.name not in own:
            continue
        name, annotation, default, theirs, help_text, paper = rows[field.name]
        assert annotation.replace("\\|", "|") == f"`{own[field.name]}`", field.name
        assert default == f"`{field.default!r}`", field.name
        assert theirs == (f"`{grpo[field.name]!r}`" if field.name in grpo else "(new)"), field.name
        assert help_text.replace("&lt;", "<") == field.metadata["help"], field.name
        assert paper, field.name
    # the paper's settings name their section
    for name, section in [("epsilon_high", "§3.1"), ("num_generations", "§4.1"), ("dynamic_sampling", "§3.2")]:
        assert section in rows[name][5], name
    assert rows["overlong_buffer_len"][5].startswith("§3.4")


def test_every_math_verifier_argument_has_a_row(gen):
    rows = table_rows(gen.render(), "#### `MathVerifierReward` arguments")
    parameters = inspect.signature(dapo_trl.MathVerifierReward.__init__).parameters
    expected = {name: p.default for name, p in parameters.items() if name != "self"}
    assert set(rows) == set(expected)
    for name, default in expected.items():
        assert rows[name][2] == f"`{default!r}`", name
        assert len(rows[name][3]) > 10, name  # a description, from the docstring's Args:
    assert "§2.4" in rows["rule"][4]


def test_a_changed_default_or_help_makes_the_settings_reference_stale(gen, monkeypatch):
    before = gen.render()
    field = dapo_trl.DAPOConfig.__dataclass_fields__["dynamic_sampling_max_rounds"]
    monkeypatch.setattr(field, "default", 11)
    assert gen.render() != before
    monkeypatch.undo()
    monkeypatch.setattr(field, "metadata", {"help": "Changed."})
    assert gen.render() != before


def test_a_setting_missing_from_the_docstring_is_refused(gen):
    """A new field without a `Parameters:` entry (or without help) stops the generator instead of going unlisted."""

    @dataclasses.dataclass
    class Config(dapo_trl.DAPOConfig):
        __doc__ = dapo_trl.DAPOConfig.__doc__
        undocumented_setting: int = dataclasses.field(default=1, metadata={"help": "Somewhere."})

    with pytest.raises(ValueError, match="undocumented_setting"):
        gen.settings_table(Config)
