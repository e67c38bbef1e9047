"""
`rule="dapo"`: the DAPO paper's reward rule, tested against its description (see `dapo_trl.verifier.dapo_rule`): only
the last 300 characters are read, the last `Answer:` line in them counts, both sides are normalised, and the
normalised strings must be identical. Also that the reward function, `score_completion` and the evaluation CLI accept
the rule by name, and that the default stays `rule="equivalence"`.
"""

import pytest

from dapo_trl import MathVerifierReward, score_completion
from dapo_trl.verifier import dapo_rule


def dapo(completion, gold):
    return score_completion(completion, gold, rule="dapo")


def test_only_the_last_300_characters_are_read():
    line = "Answer: 5\n"
    assert dapo(line + "." * (300 - len(line)), "5") is True  # the whole line is inside the window
    assert dapo(line + "." * (301 - len(line)), "5") is False  # the window starts at "nswer: 5"
    assert dapo("Answer: 5\n" + "step. " * 60, "5") is False  # the answer line is further back
    assert score_completion("Answer: 5\n" + "step. " * 60, "5") is True  # the default rule reads it


def test_the_last_answer_line_counts():
    assert dapo("Answer: 4\nWait, recheck.\nAnswer: 5", "5") is True
    assert dapo("Answer: 5\nWait, recheck.\nAnswer: 4", "5") is False
    assert dapo("answer : 5", "5") is True  # case and spaces around the colon do not matter
    assert dapo("The answer is 5", "5") is False  # no "Answer:" line, so no answer
    assert dapo(r"So the result is $\boxed{5}$.", "5") is False  # a boxed answer without the line scores as wrong
    assert score_completion(r"So the result is $\boxed{5}$.", "5") is True


@pytest.mark.parametrize(
    "line, gold",
    [
        ("Answer: $5$", "5"),  # dollar signs go
        ("Answer: x = 5", "5"),  # what follows the last "=" counts
        ("Answer: 5 dollars", "5"),  # listed unit words and all spaces go
        ("Answer: 1,000", "1000"),  # a number of digits and commas loses its commas
        (r"Answer: \text{(B)}", "(B)"),  # \text{} is unwrapped
        (r"Answer: \boxed{5}", "5"),
        (r"Answer: \frac12", r"\frac{1}{2}"),  # shorthand \fracab is expanded
        (r"Answer: \sqrt2", r"\sqrt{2}"),
        (r"Answer: 10^\circ", "10"),
        (r"Answer: \$4.50", "4.50"),
        ("Answer: a 5", "5"),  # "a " goes
    ],
)
def test_normalisation_makes_these_match(line, gold):
    assert dapo("Some reasoning.\n" + line, gold) is True


@pytest.mark.parametrize(
    "line, gold",
    [
        ("Answer: 1/2", r"\frac{1}{2}"),  # an exact string match, no mathematics
        ("Answer: 0.5", r"\frac{1}{2}"),
        ("Answer: 5.0", "5"),
        ("Answer: 2, 3", "3, 2"),
        (r"Answer: 2\sqrt{2}", r"\sqrt{8}"),
        ("Answer: 6", "5"),
    ],
)
def test_an_exact_match_is_required(line, gold):
    assert dapo("Some reasoning.\n" + line, gold) is False
    assert dapo_rule.normalize(line.split(": ", 1)[1]) != dapo_rule.normalize(gold)


def test_normalisation_steps_in_order():
    # Everything before the last "=" goes first, then spaces, then the first $...$ span is kept.
    assert dapo_rule.normalize("x = $3$ and $4$") == "3"
    assert dapo_rule.normalize(r"\text{five}") == "five"
    assert dapo_rule.normalize("12 cm") == "12"  # "cm" and the space are deleted
    assert dapo_rule.extract("no answer line here") == dapo_rule.INVALID


def test_worked_solution_gold_is_read_from_its_box():
    assert dapo("Answer: 7", r"Add them: $3 + 4 = \boxed{7}$.") is True


def test_reward_function_takes_the_rule_by_name():
    completions = ["Reasoning.\nAnswer: 1/2", r"So $\boxed{\frac{1}{2}}$", "Answer: \\frac12"]
    golds = [r"\frac{1}{2}"] * 3
    assert MathVerifierReward(rule="dapo")(completions, answer=golds) == [-1.0, -1.0, 1.0]
    assert MathVerifierReward()(completions, answer=golds) == [1.0, 1.0, 1.0]
    assert MathVerifierReward(rule="dapo")(["Answer: 3"], answer=[None]) == [None]  # unusable gold: skipped
    logged = {}
    MathVerifierReward(rule="dapo")(["Answer: $3$"], answer=["3"], log_extra=lambda c, v: logged.setdefault(c, v))
    assert logged == {"extracted_answer": ["3"]}


@pytest.mark.parametrize("rule", ["paper", "DAPO", None, ""])
def test_unknown_rule_is_refused_by_name(rule):
    with pytest.raises(ValueError, match="`rule` must be one of"):
        MathVerifierReward(rule=rule)
    with pytest.raises(ValueError, match="`rule` must be one of"):
        score_completion("Answer: 3", "3", rule=rule)


@pytest.mark.parametrize(
    "flags, checks",
    [
        ([], [("Answer: 1/2", r"\frac{1}{2}", True), ("The total is $5$.", "5", False)]),
        (
            ["--reward_rule", "dapo"],
            [("Answer: 1/2", r"\frac{1}{2}", False), ("Answer: \\frac12", r"\frac{1}{2}", True)],
        ),
        (["--extraction", "lenient"], [("The total is $5$.", "5", True), ("Answer: 6", "5", False)]),
    ],
)
def test_evaluation_cli_flags(monkeypatch, tmp_path, flags, checks):
    from dapo_trl.run import data, evaluation

    monkeypatch.chdir(tmp_path)  # the CLI checks that the model folder and the data file exist
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "d").write_text('{"prompt": "p", "answer": "1"}\n')
    seen = {}
    monkeypatch.setattr(data, "load_math_dataset", lambda *a, **k: "dataset")
    monkeypatch.setattr(evaluation, "evaluate", lambda model, dataset, **kwargs: seen.update(kwargs) or {"k": 1})
    evaluation.main(["--model", "m", "--dataset", "d", *flags])
    for completion, gold, expected in checks:
        assert seen["scorer"](completion, gold) is expected
    if "dapo" in flags:
        assert seen["answer_extractor"]("Answer: $7$") == "7" and seen["answer_extractor"]("7") is None


def test_evaluation_cli_refuses_an_unknown_rule(capsys):
    from dapo_trl.run import evaluation

    with pytest.raises(SystemExit):
        evaluation.main(["--model", "m", "--dataset", "d", "--reward_rule", "paper"])
    assert "--reward_rule" in capsys.readouterr().err
