"""docs/API.md is generated from the public docstrings and must be regenerated when they change."""

import importlib.util
from pathlib import Path

import pytest

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
