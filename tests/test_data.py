import json
import logging

import pytest
from datasets import Dataset

from dapo_trl.run.data import (
    DAPO_PROMPT_TEMPLATE,
    DATASET_FORMATS,
    boxed_answer,
    count_duplicate_prompts,
    detect_format,
    gsm8k_answer,
    load_math_dataset,
)
from dapo_trl.trainer.dataset_checks import prompt_text


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def _dapo_row(i):
    problem = f"What is {i} squared?"
    return {
        "data_source": "math_dapo",
        "prompt": [{"role": "user", "content": DAPO_PROMPT_TEMPLATE.format(problem=problem)}],
        "ability": "MATH",
        "reward_model": {"ground_truth": str(i * i), "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": f"id-{i}"},
    }


@pytest.fixture
def dapo_file(tmp_path):
    # 3 distinct prompts, each repeated 4 times and interleaved, like the published file's repeats
    rows = [_dapo_row(i) for _ in range(4) for i in (3, 5, 7)]
    return _write_jsonl(tmp_path / "dapo.jsonl", rows)


def test_dapo_math_dedupes_and_logs(dapo_file, caplog):
    with caplog.at_level(logging.INFO, logger="dapo_trl.run.data"):
        ds = load_math_dataset(dapo_file)
    assert ds.column_names == ["prompt", "answer"]
    assert ds["answer"] == ["9", "25", "49"]  # first occurrences, in order
    # the prompt already carries DAPO's template: not wrapped twice
    assert ds["prompt"][0] == DAPO_PROMPT_TEMPLATE.format(problem="What is 3 squared?")
    assert ds["prompt"][0].count("Solve the following math problem") == 1
    assert "Dropped 9 duplicate prompts of 12 rows (3 unique)" in caplog.text


def test_dapo_math_keeps_duplicates_when_asked(dapo_file):
    ds = load_math_dataset(dapo_file, dedupe=False)
    assert len(ds) == 12
    assert count_duplicate_prompts(ds) == 9


def test_dapo_math_conversational(dapo_file):
    ds = load_math_dataset(dapo_file, conversational=True, system_prompt="Think.")
    messages = ds["prompt"][1]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"] == "Think."
    assert "What is 5 squared?" in messages[1]["content"]


def test_dapo_math_parquet(tmp_path):
    path = tmp_path / "dapo.parquet"
    Dataset.from_list([_dapo_row(i) for i in (2, 2, 4)]).to_parquet(str(path))
    ds = load_math_dataset(str(path))
    assert ds["answer"] == ["4", "16"]


def test_gsm8k_answers_after_hashes(tmp_path):
    rows = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A car costs 1200 per month for 1 month.", "answer": "It costs 1,200.\n#### 1,200"},
        {"question": "No final answer here.", "answer": "It is unclear"},
    ]
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    ds = load_math_dataset(path, dataset_format="gsm8k")
    assert ds["answer"] == ["7", "1200"]  # asked for GSM8K: the row without #### is dropped
    assert ds["prompt"][0] == DAPO_PROMPT_TEMPLATE.format(problem=rows[0]["question"])
    # detected, the mix is refused rather than silently dropping the plain answer
    with pytest.raises(ValueError, match=r"2 answers are GSM8K solutions .* and 1 are plain answers"):
        load_math_dataset(path)
    assert load_math_dataset(_write_jsonl(tmp_path / "all.jsonl", rows[:2]))["answer"] == ["7", "1200"]


def test_question_answer_file_with_plain_answers_keeps_every_row(tmp_path, caplog):
    """A local question/answer file whose answers are plain values is not GSM8K: no row may be dropped."""
    rows = [{"question": f"What is {i}+{i}?", "answer": str(2 * i)} for i in range(5)]
    path = _write_jsonl(tmp_path / "qa.jsonl", rows)
    with caplog.at_level(logging.INFO, logger="dapo_trl.run.data"):
        ds = load_math_dataset(path)
    assert ds["answer"] == [str(2 * i) for i in range(5)]
    assert ds["prompt"][1] == DAPO_PROMPT_TEMPLATE.format(problem="What is 1+1?")  # the template, as documented
    assert "format 'question'" in caplog.text
    raw = load_math_dataset(path, dataset_format="question", apply_template=False)
    assert raw["prompt"][1] == "What is 1+1?"


def test_no_usable_rows_names_the_flags_to_pass(tmp_path):
    rows = [{"question": "q?", "answer": "no hashes"}]
    with pytest.raises(ValueError) as error:
        load_math_dataset(_write_jsonl(tmp_path / "x.jsonl", rows), dataset_format="gsm8k")
    message = str(error.value)
    assert "--dataset_format" in message and "--answer_column" in message and "'question'" in message
    assert "[]" not in message and "the data has no other" in message


def test_loader_docstring_lists_every_format_and_its_template():
    doc = load_math_dataset.__doc__
    for name in DATASET_FORMATS[1:]:
        assert f'`"{name}"`' in doc, name
    assert "template" in doc


def test_math_boxed_solution(tmp_path):
    rows = [
        {"problem": "Compute 1/2.", "level": "Level 1", "solution": r"It is $\boxed{\frac{1}{2}}$."},
        {"problem": "Solve x+1=3.", "level": "Level 2", "solution": r"First \boxed{1}, no: $x=\boxed{2}$."},
    ]
    ds = load_math_dataset(_write_jsonl(tmp_path / "math.jsonl", rows))
    assert ds["answer"] == [r"\frac{1}{2}", "2"]
    assert ds["prompt"][1].startswith("Solve the following math problem step by step.")


def test_problem_answer_format_and_no_template(tmp_path):
    rows = [{"id": 60, "problem": "Find the answer.", "answer": 204, "year": 2024}]
    path = _write_jsonl(tmp_path / "aime.jsonl", rows)
    ds = load_math_dataset(path)
    assert ds["answer"] == ["204"]  # integers become strings
    assert "Find the answer." in ds["prompt"][0] and ds["prompt"][0] != "Find the answer."
    raw = load_math_dataset(path, apply_template=False)
    assert raw["prompt"] == ["Find the answer."]


def test_custom_template_with_latex_braces(tmp_path):
    path = _write_jsonl(tmp_path / "aime.jsonl", [{"problem": "Find x.", "answer": "3"}])
    ds = load_math_dataset(path, template="{problem}\nPut the answer in \\boxed{}.")
    assert ds["prompt"] == ["Find x.\nPut the answer in \\boxed{}."]
    with pytest.raises(ValueError, match="placeholder"):
        load_math_dataset(path, template="no placeholder")


def test_custom_columns_csv(tmp_path):
    path = tmp_path / "custom.csv"
    path.write_text("question_text,final\nHow many legs has a cat?,4\nAnd a bird?,2\n")
    ds = load_math_dataset(str(path), prompt_column="question_text", answer_column="final", apply_template=True)
    assert ds["answer"] == ["4", "2"]
    assert ds["prompt"][0] == DAPO_PROMPT_TEMPLATE.format(problem="How many legs has a cat?")


def test_nested_answer_column_and_keep_columns(tmp_path):
    rows = [{"q": "1+1?", "meta": {"gold": "2"}, "source": "x"}]
    path = _write_jsonl(tmp_path / "nested.jsonl", rows)
    ds = load_math_dataset(path, prompt_column="q", answer_column="meta.gold", keep_columns=["source"])
    assert ds[0] == {"prompt": "1+1?", "answer": "2", "source": "x"}


def test_save_to_disk_folder(tmp_path):
    Dataset.from_dict({"problem": ["p1", "p2"], "answer": ["1", "2"]}).save_to_disk(str(tmp_path / "saved"))
    ds = load_math_dataset(str(tmp_path / "saved"), max_samples=1)
    assert len(ds) == 1 and ds["answer"] == ["1"]


def test_split_slicing_on_local_file(dapo_file):
    ds = load_math_dataset(dapo_file, split="train[:6]")
    assert len(ds) == 3 and count_duplicate_prompts(load_math_dataset(dapo_file, split="train[:6]", dedupe=False))


def test_missing_column_error_names_the_columns(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"problem": "p", "answer": "1"}])
    with pytest.raises(ValueError, match=r"no prompt column 'question'.*\['problem', 'answer'\]"):
        load_math_dataset(path, prompt_column="question")


def test_unknown_format_and_columns_errors(tmp_path):
    path = _write_jsonl(tmp_path / "x.jsonl", [{"text": "p", "label": "1"}])
    with pytest.raises(ValueError, match="Cannot tell the format"):
        load_math_dataset(path)
    with pytest.raises(ValueError, match="Unknown dataset_format"):
        load_math_dataset(path, dataset_format="csv")
    with pytest.raises(ValueError, match="Unsupported file type"):
        bad = tmp_path / "data.txt"
        bad.write_text("hello")
        load_math_dataset(str(bad))
    with pytest.raises(FileNotFoundError):
        load_math_dataset(str(tmp_path / "missing.jsonl"))


def test_detect_format():
    assert detect_format(["prompt", "reward_model"]) == "dapo_math"
    assert detect_format(["question", "answer"]) == "gsm8k"
    assert detect_format(["problem", "solution", "answer"]) == "problem"
    assert detect_format(["problem", "solution"]) == "math"
    assert detect_format(["prompt", "answer"]) == "columns"


def test_answer_helpers():
    assert gsm8k_answer("x\n#### -3.5") == "-3.5"
    assert gsm8k_answer("no hashes") is None
    assert boxed_answer(r"\boxed{a{b}c} then \fbox{d}") == "d"
    assert boxed_answer(r"\boxed{unclosed") is None
    assert boxed_answer("nothing") is None
    assert prompt_text([{"role": "user", "content": "hi"}]) == "hi"


def test_count_duplicate_prompts_on_chat_lists():
    chat = [{"role": "user", "content": "same"}]
    ds = Dataset.from_dict({"prompt": [chat, chat, [{"role": "user", "content": "other"}]]})
    assert count_duplicate_prompts(ds) == 1
    assert count_duplicate_prompts(Dataset.from_dict({"prompt": ["a", "b"]})) == 0


def test_hub_ids_use_known_formats_and_configs(monkeypatch):
    calls = []
    tables = {
        "openai/gsm8k": {"question": ["q"], "answer": ["work\n#### 12"]},
        "HuggingFaceH4/aime_2024": {"problem": ["p"], "solution": ["s"], "answer": ["33"]},
        "BytedTsinghua-SIA/DAPO-Math-17k": {
            "prompt": [[{"role": "user", "content": "templated"}]] * 2,
            "reward_model": [{"ground_truth": "5", "style": "rule"}] * 2,
        },
    }

    def fake_load_dataset(name, config=None, split=None, **kwargs):
        calls.append((name, config, split))
        return Dataset.from_dict(tables[name])

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    gsm = load_math_dataset("openai/gsm8k", split="test")
    assert calls[-1] == ("openai/gsm8k", "main", "test") and gsm["answer"] == ["12"]
    aime = load_math_dataset("HuggingFaceH4/aime_2024")
    assert aime["answer"] == ["33"] and aime["prompt"][0] == DAPO_PROMPT_TEMPLATE.format(problem="p")
    dapo = load_math_dataset("BytedTsinghua-SIA/DAPO-Math-17k")
    assert len(dapo) == 1 and dapo["prompt"] == ["templated"] and dapo["answer"] == ["5"]


def _write_empty_files(folder) -> dict[str, str]:
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {
        "empty.jsonl": b"",
        "blank.jsonl": b"\n  \n",
        "empty.json": b"",
        "list.json": b"[]",
        "empty.csv": b"",
        "header.csv": b"prompt,answer\n",
        "empty.parquet": b"",
    }
    paths = {}
    for name, content in files.items():
        (folder / name).write_bytes(content)
        paths[name] = str(folder / name)
    schema = pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())})
    pq.write_table(schema, folder / "zero_rows.parquet")
    paths["zero_rows.parquet"] = str(folder / "zero_rows.parquet")
    with gzip.open(folder / "empty.jsonl.gz", "wb"):
        pass
    paths["empty.jsonl.gz"] = str(folder / "empty.jsonl.gz")
    return paths


@pytest.mark.parametrize(
    "name",
    [
        "empty.jsonl",
        "blank.jsonl",
        "empty.json",
        "list.json",
        "empty.csv",
        "header.csv",
        "empty.parquet",
        "zero_rows.parquet",
        "empty.jsonl.gz",
    ],
)
def test_a_local_file_without_rows_is_named(tmp_path, name):
    path = _write_empty_files(tmp_path)[name]
    with pytest.raises(ValueError, match=rf"{path} has no rows"):
        load_math_dataset(path)


def test_prompt_and_solution_columns_are_recognised(tmp_path, caplog):
    """TRL's math sets (`prompt` + `solution`, the solution a bare answer) and worked solutions with `\\boxed{}`."""
    rows = [
        {"prompt": "What is 3 + 4?", "solution": "7"},
        {"prompt": "Half of 1?", "solution": r"\frac{1}{2}"},
        {"prompt": "What is 2 * 5?", "solution": r"Double 5: $2 \cdot 5 = \boxed{10}$, as expected."},
        {"prompt": "What is 9 - 1?", "solution": "We subtract one from nine and write the result down."},
    ]
    path = _write_jsonl(tmp_path / "trl_math.jsonl", rows)
    for kwargs in ({}, {"answer_column": "solution"}, {"prompt_column": "prompt"}):
        with caplog.at_level(logging.WARNING):
            ds = load_math_dataset(path, **kwargs)
        assert ds["answer"] == ["7", r"\frac{1}{2}", "10"], kwargs  # a solution without a final answer is dropped
        assert ds["prompt"] == ["What is 3 + 4?", "Half of 1?", "What is 2 * 5?"]  # taken as written
        assert "Dropped 1 of 4 rows" in caplog.text
        caplog.clear()


def test_answer_column_solution_alone_picks_the_prompt_column(tmp_path):
    rows = [{"problem": "What is 3 + 4?", "id": 1, "solution": r"So it is \boxed{7}."}]
    ds = load_math_dataset(_write_jsonl(tmp_path / "p.jsonl", rows), answer_column="solution")
    assert ds["answer"] == ["7"] and "What is 3 + 4?" in ds["prompt"][0]
    rows = [{"question": "What is 3 + 4?", "solution": "7"}]
    ds = load_math_dataset(_write_jsonl(tmp_path / "q.jsonl", rows), answer_column="solution")
    assert ds["answer"] == ["7"] and ds["prompt"] == ["What is 3 + 4?"]


def test_problem_and_plain_solution_keeps_the_answers(tmp_path):
    """`problem` + `solution` reads as MATH; a bare answer in `solution` (no `\\boxed{}`) is still an answer."""
    rows = [{"problem": "What is 3 + 4?", "solution": "7"}, {"problem": "x?", "solution": r"So $x = \boxed{2}$."}]
    assert load_math_dataset(_write_jsonl(tmp_path / "m.jsonl", rows))["answer"] == ["7", "2"]


def test_solution_answer_doctests():
    import doctest

    from dapo_trl.run import data

    assert doctest.testmod(data).failed == 0
