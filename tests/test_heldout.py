"""A run's one held-out result (dapo_trl.run.heldout): how it is sampled, paired, described, kept for a resumed run,
and which backend draws it."""

import json
from types import SimpleNamespace

import pytest
from datasets import Dataset

from dapo_trl.run.evaluation import choose_backend, evaluate
from dapo_trl.run.evaluation import main as evaluation_main
from dapo_trl.run.heldout import (
    describe_heldout,
    evaluation_engine,
    heldout_evaluation,
    load_before,
    paired_result,
    save_before,
)
from dapo_trl.run.run_record import (
    DataFormat,
    EvalSettings,
    PromptFormat,
    RunRecord,
    read_run_record,
    write_run_record,
)


def test_the_sampling_is_described_as_it_is_drawn():
    assert EvalSettings(k=1, temperature=0, top_p=0.7, max_new_tokens=8).describe() == "greedy, k=1"
    assert (
        EvalSettings(k=4, temperature=1.0, top_p=0.7, max_new_tokens=8).describe() == "temperature 1, top-p 0.7, k=4"
    )
    assert EvalSettings(k=4, temperature=0.6, top_p=1.0, max_new_tokens=8).describe() == "temperature 0.6, k=4"


def test_before_and_after_pair_only_when_sampled_alike():
    before = {"accuracy": 0.5, "n": 2, "correct": [1.0, 0.0], "sampling": "greedy, k=1"}
    after = {"accuracy": 1.0, "n": 2, "correct": [1.0, 1.0], "sampling": "greedy, k=1"}
    result = paired_result(before, after)
    assert (result["before"], result["after"], result["change"], result["n"]) == (0.5, 1.0, 0.5, 2)
    with pytest.raises(ValueError, match="sampled apart"):
        paired_result(before, {**after, "sampling": "temperature 1, k=4"})
    assert describe_heldout(result).startswith("0.500 -> 1.000  (change +0.500, paired SE 0.500; 2 problems, greedy")


def test_a_resumed_run_reports_the_before_measured_by_its_first_start(tmp_path):
    assert load_before(str(tmp_path)) is None
    save_before(str(tmp_path), {"accuracy": 0.25, "correct": [0.25]})
    assert load_before(str(tmp_path)) == {"accuracy": 0.25, "correct": [0.25]}


@pytest.mark.integration
def test_temperature_0_is_greedy_and_the_global_random_state_is_left_alone(monkeypatch):
    import torch
    from transformers.generation.utils import GenerationMixin

    from dapo_trl import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer(hidden_size=32)
    sampled = []
    generate = GenerationMixin.generate
    monkeypatch.setattr(
        GenerationMixin, "generate", lambda m, *a, **kw: sampled.append(kw["do_sample"]) or generate(m, *a, **kw)
    )
    dataset = Dataset.from_dict({"prompt": ["What is 1+1?\n", "What is 2+2?\n"], "answer": ["2", "4"]})
    record = RunRecord(PromptFormat(), EvalSettings(k=2, temperature=0, top_p=0.7, max_new_tokens=4, batch_size=2))
    torch.manual_seed(3)
    state = torch.get_rng_state()
    result = heldout_evaluation(model, tokenizer, dataset, record)
    assert sampled == [False] and torch.equal(torch.get_rng_state(), state)
    assert result["sampling"] == "greedy, k=2" and result["n"] == 2 and len(result["correct"]) == 2
    assert result["backend"] == "transformers" and result["accuracy"] == result["avg@2"]
    assert result["format_rate"] == 1 - result["no_answer_frac"]


def test_auto_picks_vllm_where_the_run_used_it_or_a_gpu_has_it():
    def pick(**facts):
        return choose_backend("auto", **{"model_is_path": True, "vllm_importable": True, "cuda": False, **facts})

    assert pick(run_used_vllm=True) == "vllm"  # vLLM's CPU build, as in the run
    assert pick(run_used_vllm=False) == "transformers"
    assert pick(run_used_vllm=False, cuda=True) == "vllm"
    assert pick(run_used_vllm=True, vllm_importable=False) == "transformers"
    assert pick(run_used_vllm=True, model_is_path=False) == "transformers"
    assert choose_backend("transformers", model_is_path=True, run_used_vllm=True, vllm_importable=True, cuda=True) == (
        "transformers"
    )


def test_the_evaluation_uses_the_runs_colocated_engine_synced_and_nothing_else():
    synced = []
    generation = SimpleNamespace(llm="engine", sync_weights=lambda: synced.append(True))

    def trainer(**args):
        values = {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False, **args}
        return SimpleNamespace(args=SimpleNamespace(**values), vllm_generation=generation)

    assert evaluation_engine(trainer()) == "engine" and synced == [True]
    assert evaluation_engine(trainer(use_vllm=False)) is None
    assert evaluation_engine(trainer(vllm_mode="server")) is None
    assert evaluation_engine(trainer(vllm_enable_sleep_mode=True)) is None
    assert synced == [True]


def test_a_run_record_of_an_earlier_version_reads_its_data_as_auto(tmp_path):
    record = RunRecord(PromptFormat(), EvalSettings(k=1, temperature=1.0, top_p=1.0, max_new_tokens=4))
    path = write_run_record(str(tmp_path), record)
    raw = json.loads(open(path).read())
    assert raw["data_format"] == {"dataset_format": "auto", "prompt_column": None, "answer_column": None}
    del raw["data_format"], raw["evaluation"]["backend"], raw["evaluation"]["vllm_dtype"]
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "dapo_run.json").write_text(json.dumps(raw))
    old = read_run_record(str(tmp_path))
    assert old.data_format == DataFormat() and old.evaluation.backend == "transformers"


@pytest.mark.integration
def test_the_evaluation_cli_reads_a_file_as_the_run_read_its_data(tmp_path, monkeypatch):
    from dapo_trl import tiny_model_and_tokenizer

    tiny_model_and_tokenizer(str(tmp_path), hidden_size=32)
    record = RunRecord(
        PromptFormat(),
        EvalSettings(k=1, temperature=0, top_p=1.0, max_new_tokens=2),
        data_format=DataFormat("columns", "question", "answer"),
    )
    write_run_record(str(tmp_path), record)
    data = tmp_path / "heldout.jsonl"
    data.write_text(json.dumps({"question": "What is 1+1?", "answer": "2"}) + "\n")
    seen = {}

    def spy(model, dataset, **kwargs):
        seen["prompts"] = dataset["prompt"]
        return evaluate(model, dataset, **kwargs)

    monkeypatch.setattr("dapo_trl.run.evaluation.evaluate", spy)
    evaluation_main(["--model", str(tmp_path), "--dataset", str(data)])
    assert seen["prompts"] == ["What is 1+1?"]  # format 'question' (auto) would wrap it in DAPO's template
    evaluation_main(["--model", str(tmp_path), "--dataset", str(data), "--dataset_format", "question"])
    assert seen["prompts"][0].startswith("Solve the following math problem")


def test_doctests():
    import doctest

    from dapo_trl.run import evaluation, heldout

    assert doctest.testmod(heldout).failed == 0 and doctest.testmod(evaluation).failed == 0
