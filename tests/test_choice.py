"""Multiple-choice extraction, the reward (with TRL's think_format_reward), the row format and the shipped data set."""

import doctest
import importlib.util
import json
import pickle
import time
from pathlib import Path

import pytest
from trl.rewards import think_format_reward

from dapo_trl.rewards import choice
from dapo_trl.rewards.choice import (
    MultipleChoiceReward,
    extract_choice,
    format_choice_prompt,
    gold_choice,
    load_choice_dataset,
    option_map,
)

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = ["fever", "cough", "rash", "gout", "acne"]


def test_doctests():
    assert doctest.testmod(choice).failed == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Answer: B", "B"),
        ("Answer: (B)", "B"),
        ("Answer: B)", "B"),
        ("Answer: **B**", "B"),
        ("**Answer:** B", "B"),
        ("**Answer: B**", "B"),
        ("Answer: b", "B"),
        ("answer: (b)", "B"),
        ("The answer is (C).", "C"),
        ("So the correct answer is D.", "D"),
        ("Final answer: D. gout", "D"),
        ("Answer: (B) cough", "B"),
        ("Answer: B - cough", "B"),
        ("Answer:\n\n(E)", "E"),
        (r"Therefore $\boxed{C}$", "C"),
        (r"\boxed{\text{(A)}}", "A"),
        ("Let me think.\n(B)", "B"),
        ("Let me think.\nB)", "B"),
        ("Let me think.\n**B**", "B"),
        ("B", "B"),
        ("Answer: cough", "B"),
        ("Answer: **Gout.**", "D"),
        ("It is one of these.\nrash", "C"),
        ("<think>Answer: A</think>\nAnswer: B", "B"),
        ("<think>\nIt treats a cough.\n</think>\nB", "B"),
        ("Answer: A\nWait, that is wrong. Answer: C", "C"),
        (r"\boxed{A} ... on reflection, Answer: E", "E"),
    ],
)
def test_committed_answers_are_read(text, expected):
    assert extract_choice(text, OPTIONS) == expected


@pytest.mark.parametrize(
    "text",
    [
        "A patient with a cough should rest.",  # prose: "A" is an article, not a letter
        "I am not sure.",
        "<think>It is B) cough, so Answer: B",  # still reasoning: cut off before answering
        "Answer: A or B",  # hedged
        "Answer: F",  # no such letter
        "Answer: migraine",  # not an option
        "",
        "Answer: B fever",  # a letter and a different option's text with nothing to separate them
    ],
)
def test_no_committed_answer(text):
    assert extract_choice(text, OPTIONS) is None


@pytest.mark.parametrize(
    "text",
    ["Answer: " * 40_000, "the answer is " * 20_000, "(" * 200_000, "\\boxed{" * 30_000, " " * 200_000 + "x"],
    ids=["anchors", "phrases", "parens", "open-boxes", "spaces"],
)
def test_hostile_completions_are_read_in_bounded_time(text):
    start = time.perf_counter()
    assert extract_choice(text * 2, OPTIONS) is None  # also longer than the 200,000 characters read
    assert time.perf_counter() - start < 5


def test_letters_beyond_the_options_are_no_answer():
    assert extract_choice("Answer: E", OPTIONS[:4]) is None
    assert extract_choice("Answer: E") == "E"  # without options, every letter of A-E counts
    assert extract_choice("Answer: cough") is None  # and option texts cannot be read


def test_option_text_must_name_one_option():
    assert extract_choice("Answer: flu", ["flu", "Flu."]) is None


def test_non_string_completion_is_no_answer():
    assert extract_choice(None, OPTIONS) is None


def test_gold_answers():
    assert gold_choice("B", OPTIONS) == "B"
    assert gold_choice("(d)", OPTIONS) == "D"
    assert gold_choice("rash", OPTIONS) == "C"
    assert gold_choice("E", OPTIONS[:4]) is None
    assert gold_choice("migraine", OPTIONS) is None
    assert gold_choice(3, OPTIONS) is None


def test_options_as_dict_and_bad_options():
    assert option_map({"(b)": "cough", "A": "fever"}) == {"A": "fever", "B": "cough"}
    assert extract_choice("Answer: cough", {"A": "fever", "B": "cough"}) == "B"
    with pytest.raises(ValueError, match="2 to 5 options"):
        option_map(["only one"])
    with pytest.raises(ValueError, match="2 to 5 options"):
        option_map(OPTIONS + ["flu"])
    with pytest.raises(ValueError, match="not one of the letters"):
        option_map({"F": "x", "A": "y"})
    with pytest.raises(ValueError, match="list of option texts"):
        option_map("fever")


def test_prompt_format():
    text = format_choice_prompt("What does Dovux treat?", ["acne", "gout"], instruction="Answer with a letter.")
    assert text == "Answer with a letter.\n\nWhat does Dovux treat?\nA) acne\nB) gout\n"


# ---------------------------------------------------------------------------------------------- reward


def conversation(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def test_reward_scores_and_logs_the_extracted_letters():
    logged = {}
    reward = MultipleChoiceReward(correct_reward=1.0, incorrect_reward=0.0)
    completions = [conversation("<think>x</think>\nAnswer: B"), conversation("Answer: rash"), "no answer"]
    scores = reward(
        completions,
        answer=["B", "cough", "A"],
        options=[OPTIONS] * 3,
        log_extra=lambda name, values: logged.update({name: values}),
    )
    assert scores == [1.0, 0.0, 0.0]
    assert logged == {"extracted_choice": ["B", "C", "[no answer]"]}


def test_reward_skips_rows_with_an_unusable_gold_answer(caplog):
    assert MultipleChoiceReward()(["Answer: A"], answer=["migraine"], options=[OPTIONS]) == [None]
    assert "migraine" in caplog.text


def test_reward_without_an_options_column_reads_letters():
    assert MultipleChoiceReward()(["Answer: (c)", "Answer: D"], answer=["C", "C"]) == [1.0, -1.0]


def test_reward_names_the_missing_column():
    with pytest.raises(ValueError, match="no column 'label'.*received \\['answer', 'options'\\]"):
        MultipleChoiceReward(answer_column="label")(["Answer: A"], answer=["A"], options=[OPTIONS])


def test_reward_is_picklable_and_named():
    reward = pickle.loads(pickle.dumps(MultipleChoiceReward(incorrect_reward=0.0)))
    assert reward.__name__ == "multiple_choice" and reward.incorrect_reward == 0.0 and reward.correct_reward == 1.0


def test_composes_with_trl_think_format_reward():
    completions = [
        conversation("<think>Dovux treats gout.</think>\nAnswer: D"),  # right, well formatted
        conversation("Answer: D"),  # right, no reasoning block
        conversation("<think>acne?</think>\nAnswer: A"),  # wrong, well formatted
    ]
    assert MultipleChoiceReward()(completions, answer=["D"] * 3, options=[OPTIONS] * 3) == [1.0, 1.0, -1.0]
    assert think_format_reward(completions) == [1.0, 0.0, 1.0]


# ---------------------------------------------------------------------------------------------- rows and data


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_load_builds_conversational_prompts(tmp_path):
    path = write_rows(
        tmp_path / "q.jsonl",
        [{"question": "What does Dovux treat?", "options": ["acne", "gout"], "answer": "gout"}],
    )
    dataset = load_choice_dataset(path, system_prompt="Be brief.")
    assert dataset[0]["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What does Dovux treat?\nA) acne\nB) gout\n"},
    ]
    plain = load_choice_dataset(path, conversational=False, instruction="Pick one.")
    assert plain[0]["prompt"] == "Pick one.\n\nWhat does Dovux treat?\nA) acne\nB) gout\n"


def test_load_rejects_bad_rows(tmp_path):
    bad_answer = write_rows(tmp_path / "a.jsonl", [{"question": "q", "options": ["x", "y"], "answer": "C"}])
    with pytest.raises(ValueError, match="row 0: answer 'C' is neither a letter of its 2 options"):
        load_choice_dataset(bad_answer)
    no_options = write_rows(tmp_path / "b.jsonl", [{"question": "q", "answer": "A"}])
    with pytest.raises(ValueError, match="missing \\['options'\\]"):
        load_choice_dataset(no_options)
    with pytest.raises(FileNotFoundError):
        load_choice_dataset(str(tmp_path / "absent.jsonl"))


def load_generator():
    spec = importlib.util.spec_from_file_location("make_pharma_mcq", ROOT / "examples" / "data" / "make_pharma_mcq.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shipped_data_is_what_the_generator_writes_and_splits_are_disjoint():
    generator = load_generator()
    for split, n in (("train", 1500), ("test", 200)):
        shipped = (ROOT / "examples" / "data" / f"pharma_mcq_{split}.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in shipped] == generator.make_rows(n, split=split)
    key = lambda r: (r["question"], tuple(r["options"]))  # noqa: E731
    train = {key(r) for r in generator.make_rows(1500, split="train")}
    assert not train & {key(r) for r in generator.make_rows(200, split="test")}


def test_shipped_rows_load_and_their_answers_are_correct():
    dataset = load_choice_dataset(str(ROOT / "examples" / "data" / "pharma_mcq_test.jsonl"))
    letters = [gold_choice(a, o) for a, o in zip(dataset["answer"], dataset["options"])]
    assert len(dataset) == 200 and set(letters) == set("ABCDE")
    for row, letter in zip(dataset, letters):
        assert option_map(row["options"])[letter] == row["explanation"]
