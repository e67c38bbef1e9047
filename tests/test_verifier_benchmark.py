"""`benchmarks/verifier.py`: how it reads a peer library's tests, and (with the package index) math-verify's own suite."""

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest


def load_benchmark(name: str):
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


FAKE_TESTS = """
import pytest
from tests.test_all import compare_strings

@pytest.mark.parametrize("gold,pred,expected", [("$1$", "$1$", 1), ("$2$", "$3$", 0), (f"{1}", "1", 1)])
def test_default(gold, pred, expected):
    assert compare_strings(gold, pred, match_types=["latex"]) == expected

@pytest.mark.parametrize("gold,pred,expected", [("$1$", "$1.0001$", 1)])
def test_rounded(gold, pred, expected):
    assert compare_strings(gold, pred, match_types=["latex", "expr"], precision=3) == expected

@pytest.mark.parametrize("gold,pred,expected,precision", [("a", "a", 1, 6), ("b", "b", 1, 2)])
def test_with_precision(gold, pred, expected, precision):
    assert compare_strings(gold, pred, match_types=["expr"], precision=precision) == expected

@pytest.mark.parametrize("gold,pred,strict,expected", [("$f(x)$", "$f(y)$", True, 0), ("$f(x)$", "$f(y)$", False, 1)])
def test_strict(gold, pred, strict, expected):
    assert compare_strings(gold, pred, match_types=["latex"], strict=strict) == expected
"""


def test_peer_cases_keeps_only_plain_cases_with_default_flags(tmp_path):
    verifier = load_benchmark("verifier")
    (tmp_path / "test_fake.py").write_text(textwrap.dedent(FAKE_TESTS))
    cases = verifier.peer_cases(tmp_path)
    assert [(c["kind"], c["gold"], c["label"]) for c in cases] == [
        ("default", "$1$", True),
        ("default", "$2$", False),  # the f-string case is built at run time: skipped
        ("with_precision", "a", True),  # precision 2 and 3 are not the default 6: skipped
        ("strict", "$f(x)$", False),  # strict=False is not the default: skipped
    ]
    assert cases[0]["match_types"] == ["latex"]


def test_rule_table_counts_each_direction(capsys):
    verifier = load_benchmark("verifier")
    cases = [
        {"completion": "Answer: 5", "gold": "5", "label": True},  # both rules
        {"completion": r"So $\boxed{5}$.", "gold": "5", "label": True},  # equivalence only
        {"completion": "Answer: 6", "gold": "5", "label": False},  # neither
    ]
    verifier.run_rules(cases)
    out = capsys.readouterr().out
    assert "| both score correct | 1 | 0 | 1 (33.3%) |" in out
    assert "| only equivalence scores correct | 1 | 0 | 1 (33.3%) |" in out
    assert "| only dapo scores correct | 0 | 0 | 0 (0.0%) |" in out


@pytest.mark.network
@pytest.mark.slow
def test_math_verify_own_suite_passes_with_no_false_positive(capsys):
    """The target of the peer suite: >= 0.95 with lenient extraction and no false positive in either mode (~1 min)."""
    verifier = load_benchmark("verifier")
    results = verifier.run_peer_suite(verifier.argparse.Namespace(peer_sdist=None, show_failures=False))
    out = capsys.readouterr().out
    labels_line = next(line for line in out.splitlines() if line.startswith("ALL"))
    fields = labels_line.split()
    strict_fp, lenient_acc, lenient_fp = int(fields[3]), float(fields[5]), int(fields[6])
    assert lenient_acc >= 0.95 and lenient_fp == 0 and strict_fp == 0, labels_line
    assert len(results["math-verify"]) >= 250
