"""The verifier is a component of its own: importable without TRL or torch, with the top-level names unchanged."""

import subprocess
import sys
import textwrap

import dapo_trl
from dapo_trl import verifier


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_importing_the_verifier_imports_neither_trl_nor_torch():
    result = run(
        """
        import sys
        import dapo_trl.verifier as v
        assert v.score_completion("Answer: 3", "3") is True
        assert v.score_completion("Answer: x = 4", ["4"]) is True
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("trl", "torch", "transformers"))
        print(heavy)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_verifier_works_without_trl_installed():
    result = run(
        """
        import sys
        from importlib import metadata
        real = metadata.version
        def version(name):
            if name == "trl":
                raise metadata.PackageNotFoundError(name)
            return real(name)
        metadata.version = version
        sys.modules["trl"] = None  # any import of trl now fails
        import dapo_trl
        from dapo_trl.verifier import score_completion
        assert score_completion(r"Answer: $\\frac{1}{2}$", "0.5") is True
        assert dapo_trl.score_completion("Answer: 3", "3") is True
        try:
            dapo_trl.MathVerifierReward
        except ImportError as error:
            print("ImportError:", error)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "ImportError: dapo-trl needs trl" in result.stdout


def test_top_level_names_are_the_verifier_functions():
    for name in ("extract_answer", "verify", "verify_batch", "score_completion"):
        assert name in dapo_trl.__all__
        assert getattr(dapo_trl, name) is getattr(verifier, name)
    assert dapo_trl.MathVerifierReward.__module__ == "dapo_trl.rewards.math"
