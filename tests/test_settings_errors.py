"""Errors that point the right way: they name the settings the user gave and the fix that applies on this machine."""

import pytest

from dapo_trl import DAPOConfig

ON_CPU = {"use_cpu": True, "bf16": False}


def test_a_batch_of_partial_groups_names_the_settings_the_user_gave(tmp_path):
    """TRL derives generation_batch_size from the batch settings; its error named that size, which nobody set."""
    with pytest.raises(ValueError) as error:
        DAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=6, **ON_CPU)
    message = str(error.value)
    assert "generation_batch_size" not in message
    assert (
        "per_device_train_batch_size (6) x processes (1) x steps_per_generation (1, = gradient_accumulation_steps)"
        in (message)
    )
    assert "= 6 rows" in message and "multiple of 16" in message and "per_device_train_batch_size=16" in message
    with pytest.raises(ValueError, match=r"steps_per_generation \(2\) = 12 rows"):
        DAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=6, steps_per_generation=2, **ON_CPU)
    # a generation_batch_size the user did set is named as TRL names it
    with pytest.raises(ValueError, match=r"generation_batch_size \(24\) must be divisible by num_generations"):
        DAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, generation_batch_size=24, **ON_CPU)


def run_example_error(argv, capsys) -> str:
    """The one stderr line an example script ends with (exit code 2, no traceback)."""
    from test_train_math import train_math

    with pytest.raises(SystemExit) as stop:
        train_math.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def tiny_run(tmp_path, monkeypatch):
    """A saved tiny model (128-token context) and a file of problems in a `problem` column."""
    import json

    from dapo_trl import tiny_model_and_tokenizer

    monkeypatch.chdir(tmp_path)
    tiny_model_and_tokenizer("model", hidden_size=32)
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
    (tmp_path / "problems.jsonl").write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return ["--model_name_or_path", "model", "--dataset_name", "problems.jsonl", "--output_dir", "run"]


ON_CPU_FLAGS = ["--use_cpu", "true", "--bf16", "false", "--report_to", "none", "--max_completion_length", "8"]


@pytest.mark.integration
def test_prompts_the_template_made_too_long_say_so_and_how_to_leave_it_out(tiny_run, capsys):
    """Format 'problem' wraps each problem in DAPO's template (200+ tokens); the tiny model reads 128."""
    line = run_example_error([*tiny_run, *ON_CPU_FLAGS, "--num_generations", "4"], capsys)
    assert "8 training prompts are longer than the model's context of 128 tokens" in line
    assert "tokens of every prompt are the same text around its problem" in line and "DAPO's template" in line
    assert "--dataset_format columns --prompt_column <its column>" in line
    assert "max_prompt_length to at most 120 (the context minus max_completion_length)" in line
    assert "2048" not in line and "2,048" not in line  # a limit the context cannot hold helps nobody


def test_prompt_length_advice_never_exceeds_the_context():
    from dapo_trl.trainer.dataset_checks import prompt_length_advice

    assert "at most 30720" in prompt_length_advice(32768, 2048) and "2,048" in prompt_length_advice(32768, 2048)
    assert "2,048" not in prompt_length_advice(1024, 256) and "at most 768" in prompt_length_advice(1024, 256)
    assert prompt_length_advice(128, 512).startswith("max_completion_length (512) alone fills the 128-token context")


def test_a_missing_model_is_named_before_the_bf16_this_machine_lacks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = run_example_error(["--dataset_name", "nosuch.jsonl"], capsys)
    assert "give both --model_name_or_path and --dataset_name" in line and "bf16" not in line


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the bf16 default is refused on a CPU machine")
def test_bf16_on_a_cpu_machine_is_answered_with_the_flags_that_run_on_cpu(tiny_run, capsys):
    line = run_example_error(tiny_run, capsys)
    assert "this machine has no GPU" in line and "--use_cpu true --bf16 false" in line
    assert "configs/smoke.yaml" in line and "You need to assign use_cpu" not in line


def test_a_set_that_repeats_by_design_is_not_told_to_deduplicate(caplog):
    from dapo_trl.trainer.dataset_checks import repeated_prompts_expected, warn_duplicates

    with caplog.at_level("INFO", logger="dapo_trl"):
        with repeated_prompts_expected():
            warn_duplicates(["1+1", "1+1", "2+2"])
        assert "deduplicate" not in caplog.text and "2 unique of 3" in caplog.text
        warn_duplicates(["1+1", "1+1", "2+2"])  # real data: the advice stands
        assert "deduplicate the dataset" in caplog.text


@pytest.mark.integration
def test_the_demo_does_not_tell_the_user_to_deduplicate_its_own_problems(tmp_path, caplog):
    """`make demo`'s synthetic set repeats problems by design (configs/cpu_demo.yaml: 20,000 rows of small sums)."""
    from test_train_math import ROOT, train_math

    argv = ["--config", str(ROOT / "configs" / "smoke.yaml"), "--output_dir", str(tmp_path), "--max_steps", "1"]
    argv += ["--demo_train_size", "3000", "--demo_sft_steps", "2", "--demo_test_size", "8"]
    with caplog.at_level("INFO", logger="dapo_trl"):
        train_math.main(argv)
    assert "repeats prompts by design" in caplog.text and "deduplicate" not in caplog.text
