"""The data loader's answer column: single values unwrapped, containers never stringified, unusable rows counted."""

import json
import logging

from dapo_trl.run.data import load_math_dataset


def _write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_one_element_lists_are_unwrapped_and_containers_never_stringified(tmp_path, caplog):
    rows = [
        {"prompt": "p1", "answer": ["1"]},
        {"prompt": "p2", "answer": ["12"]},
        {"prompt": "p3", "answer": ["3", "4"]},  # several values: unusable, not "['3', '4']"
        {"prompt": "p4", "answer": []},
    ]
    path = _write_jsonl(tmp_path / "lists.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="dapo_trl.run.data"):
        ds = load_math_dataset(path, dataset_format="columns")
    assert ds["answer"] == ["1", "12"]
    assert not any("[" in answer for answer in ds["answer"])
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "Dropped 2 of 4 rows" in warning and "'answer'" in warning


def test_nested_ground_truth_lists_and_numbers(tmp_path):
    rows = [
        {"prompt": "p1", "reward_model": {"ground_truth": ["34"], "style": "rule"}},
        {"prompt": "p2", "reward_model": {"ground_truth": ["35"], "style": "rule"}},
    ]
    ds = load_math_dataset(_write_jsonl(tmp_path / "dapo.jsonl", rows), dataset_format="dapo_math")
    assert ds["answer"] == ["34", "35"]
    numbers = [{"problem": "q1", "answer": 3.0}, {"problem": "q2", "answer": 2.5}]
    ds = load_math_dataset(_write_jsonl(tmp_path / "numbers.jsonl", numbers), dataset_format="problem")
    assert ds["answer"] == ["3", "2.5"]


def test_an_all_blank_answer_column_is_named_with_the_alternatives(tmp_path):
    import pytest

    rows = [{"problem": "p1", "answer": "", "solution": r"So $\boxed{7}$."}]
    path = _write_jsonl(tmp_path / "blank.jsonl", rows)
    with pytest.raises(ValueError, match=r"answer column 'answer' holds no usable answer.*\['solution'\]"):
        load_math_dataset(path)
    assert load_math_dataset(path, dataset_format="math")["answer"] == ["7"]
