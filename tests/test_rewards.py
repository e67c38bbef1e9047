"""MathVerifierReward: TRL's reward-function contract, gold-column resolution, logging and pickling."""

import doctest
import pickle

import pytest
from trl.trainer.utils import get_callable_name

from dapo_trl.rewards import math as rewards
from dapo_trl.rewards.math import MathVerifierReward, completion_text
from dapo_trl.verifier import api


@pytest.fixture(scope="module", autouse=True)
def _stop_workers():
    yield
    api.shutdown_workers()


def conversation(text):
    return [{"role": "assistant", "content": text}]


def test_doctests():
    assert doctest.testmod(rewards).failed == 0


def test_name_is_pinned_for_trl_metrics():
    reward = MathVerifierReward(correct_reward=2.0)
    # TRL names the metric `rewards/<name>/mean` after this.
    assert get_callable_name(reward) == "math_verifier"
    assert reward.correct_reward == 2.0 and reward.incorrect_reward == -1.0


def test_picklable():
    reward = pickle.loads(pickle.dumps(MathVerifierReward(answer_column="reward_model.ground_truth", timeout_s=2.0)))
    assert reward.answer_column == "reward_model.ground_truth" and reward.timeout_s == 2.0
    assert reward(["Answer: 3"], reward_model=[{"ground_truth": "3"}]) == [1.0]


def test_conversational_and_plain_completions():
    reward = MathVerifierReward()
    completions = [
        conversation("So $x = 2$.\nAnswer: 2"),
        [{"role": "user", "content": "Answer: 2"}, {"role": "assistant", "content": "Answer: 3"}],
        "Answer: 2",
        "2 + 0 = 2, and then",
    ]
    assert reward(completions, answer=["2"] * 4) == [1.0, -1.0, 1.0, -1.0]


def test_completion_text_takes_the_last_assistant_message():
    messages = [
        {"role": "assistant", "content": "Answer: 1"},
        {"role": "tool", "content": "Answer: 9"},
        {"role": "assistant", "content": "Answer: 2"},
    ]
    assert completion_text(messages) == "Answer: 2"
    assert completion_text([{"role": "assistant", "content": [{"type": "text", "text": "Answer: 4"}]}]) == "Answer: 4"
    assert completion_text("plain") == "plain"


def test_custom_reward_values():
    reward = MathVerifierReward(correct_reward=1.0, incorrect_reward=0.0)
    assert reward(["Answer: 5", "Answer: 6"], answer=["5", "5"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "columns",
    [
        {"answer": ["7"], "solution": ["Wrong: \\boxed{8}"]},  # `answer` wins over `solution`
        {"solution": ["Add them: $3 + 4 = \\boxed{7}$."]},  # a MATH worked solution
        {"reward_model": [{"ground_truth": "7", "style": "rule-lighteval/MATH_v2"}], "data_source": ["math_dapo"]},
    ],
)
def test_gold_column_auto_detection(columns):
    assert MathVerifierReward()(["Answer: 7"], **columns) == [1.0]


def test_explicit_and_dotted_answer_column():
    assert MathVerifierReward(answer_column="target")(["Answer: 7"], target=["7"], answer=["8"]) == [1.0]
    nested = [{"meta": {"gold": "7"}}]
    assert MathVerifierReward(answer_column="info.meta.gold")(["Answer: 7"], info=nested) == [1.0]


def test_missing_column_names_what_it_saw():
    with pytest.raises(ValueError, match=r"received the columns \['question', 'source'\]"):
        MathVerifierReward()(["Answer: 7"], question=["q"], source=["s"], trainer_state=None, log_extra=None)
    with pytest.raises(ValueError, match="'target'"):
        MathVerifierReward(answer_column="target")(["Answer: 7"], answer=["7"])


def test_unparseable_gold_is_skipped_with_none():
    reward = MathVerifierReward()
    gold = ["7", "a long worked solution with no final answer " * 40, "", None]
    assert reward(["Answer: 7"] * 4, answer=gold) == [1.0, None, None, None]


def test_extracted_answers_are_logged():
    logged = {}
    reward = MathVerifierReward()
    completions = [conversation("\\boxed{\\frac{1}{2}}"), conversation("I am not sure")]
    reward(completions, answer=["0.5", "0.5"], log_extra=lambda column, values: logged.setdefault(column, values))
    assert logged == {"extracted_answer": ["\\frac{1}{2}", "[no answer]"]}


def test_symbolic_rows_in_a_batch():
    reward = MathVerifierReward(num_workers=2)
    completions = ["Answer: $2\\sqrt{2}$", "Answer: $(x+1)^2$", "Answer: $1.414$", "Answer: 12"]
    gold = ["\\sqrt{8}", "x^2+2x+1", "\\sqrt{2}", "12"]
    assert reward(completions, solution=gold) == [1.0, 1.0, -1.0, 1.0]


@pytest.mark.parametrize("kwargs", [{"timeout_s": 0}, {"num_workers": 0}])
def test_invalid_arguments(kwargs):
    with pytest.raises(ValueError):
        MathVerifierReward(**kwargs)


def test_defaults_are_the_training_choices():
    reward = MathVerifierReward()
    assert reward.rule == "equivalence" and reward.extraction == "strict"
    # Strict: a number the completion never committed to earns nothing; lenient reads the final sentence.
    completion = ["Adding the two parts, the total comes to $42$."]
    assert reward(completion, answer=["42"]) == [-1.0]
    assert MathVerifierReward(extraction="lenient")(completion, answer=["42"]) == [1.0]


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"timeout_s": float("nan")}, "timeout_s"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"timeout_s": float("inf")}, "timeout_s"),
        ({"num_workers": True}, "num_workers"),
        ({"correct_reward": float("nan")}, "correct_reward"),
        ({"incorrect_reward": "low"}, "incorrect_reward"),
        ({"extraction": "loose"}, "extraction"),
        ({"rule": "paper"}, "rule"),
        ({"answer_column": ""}, "answer_column"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises((ValueError, TypeError), match=f"`{name}`"):
        MathVerifierReward(**kwargs)


@pytest.mark.parametrize(
    "completion, message",
    [
        (b"Answer: 3", r"completions\[1\] is bytes"),
        (None, r"completions\[1\] is NoneType"),
        ({"role": "assistant", "content": "Answer: 3"}, r"completions\[1\] is a single message dict"),
        (["Answer: 3", "Answer: 4"], r"completions\[1\] is a list of str"),
    ],
)
def test_completions_of_the_wrong_shape_are_named(completion, message):
    with pytest.raises(TypeError, match=message):
        MathVerifierReward()(["Answer: 3", completion], answer=["3", "3"])


def test_a_single_string_is_not_a_batch():
    with pytest.raises(TypeError, match="`completions` must be a list"):
        MathVerifierReward()("Answer: 3", answer=["3"])


def test_unusable_golds_are_counted_warned_once_and_logged(caplog):
    reward = MathVerifierReward()
    metrics = []
    golds = [["3"], ["1", "2"], "???", None, "", "3"]
    with caplog.at_level("WARNING", logger="dapo_trl.rewards.math"):
        rewards_ = reward(
            ["Answer: 3"] * 6, answer=golds, log_metric=lambda name, value: metrics.append((name, value))
        )
        reward(["Answer: 3"] * 6, answer=golds, log_metric=lambda name, value: metrics.append((name, value)))
    assert rewards_ == [1.0, None, None, None, None, 1.0]
    warnings = [r.getMessage() for r in caplog.records if "cannot be scored" in r.getMessage()]
    assert len(warnings) == 1 and "4 of 6 rows" in warnings[0] and "'answer'" in warnings[0]
    assert metrics == [("math_verifier/unusable_gold_ratio", 4 / 6)] * 2


def test_golds_that_are_no_value_or_never_close_are_unusable_not_echoed():
    golds = ["NaN", "inf", r"\begin{pmatrix}1\\2", r"\begin{pmatrix}1\\2\end{pmatrix}"]
    completions = [f"Answer: {gold}" for gold in golds]
    assert MathVerifierReward()(completions, answer=golds) == [None, None, None, 1.0]


def test_an_empty_answer_column_falls_back_to_the_solution_column():
    columns = {"answer": ["", None], "solution": [r"So $\boxed{7}$.", r"Hence $\boxed{8}$."]}
    assert MathVerifierReward()(["Answer: 7", "Answer: 9"], **columns) == [1.0, -1.0]
    # An explicit column is taken as it is, even when blank.
    assert MathVerifierReward(answer_column="answer")(["Answer: 7", "Answer: 9"], **columns) == [None, None]


def test_think_format_reward_takes_string_and_chat_completions():
    """open-r1's `format` reward on a dataset of string prompts: TRL's function indexes `completion[0]["content"]`."""
    from dapo_trl.rewards import format as format_reward

    assert doctest.testmod(format_reward).failed == 0
    strings = ["<think>\n3 + 4 = 7\n</think>\nAnswer: 7", "Answer: 7", "", "<think>no close"]
    assert format_reward.think_format_reward(strings, answer=["7"] * 4) == [1.0, 0.0, 0.0, 0.0]
    assert format_reward.think_format_reward([conversation(s) for s in strings]) == [1.0, 0.0, 0.0, 0.0]
    assert get_callable_name(format_reward.think_format_reward) == "think_format_reward"  # same metric name as TRL's
    with pytest.raises(TypeError, match="list of completions"):
        format_reward.think_format_reward("<think>x</think>")
