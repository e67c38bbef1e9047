"""Train a causal LM to answer math problems with DAPO (arXiv 2503.14476).

Without `--config`, `--model_name_or_path` or `--dataset_name` it runs the CPU demo of `configs/cpu_demo.yaml`, its
default `--config` (any flag overrides one of its values: `--max_steps 2` is the demo for two steps): a tiny model and
tokenizer built locally (nothing is downloaded), a synthetic arithmetic task in the DAPO answer format, a short
supervised warm-up until sampled accuracy is mixed, then the full DAPO recipe. Everything else comes from a YAML
(`--config`) or the command line: every `ScriptArguments`, `DAPOConfig` and `ModelConfig` field is a flag.

Launch:
```
accelerate launch examples/train_math.py                                              # CPU demo (its default config)
accelerate launch examples/train_math.py --config configs/cpu_demo.yaml               # the same, named
accelerate launch examples/train_math.py --config configs/smoke.yaml                  # seconds, for a quick check
# the batch a recipe trains on 64 processes, without loading anything
python examples/train_math.py --config configs/dapo_qwen2.5_32b.yaml --print_plan --num_processes 64
# one GPU, vLLM colocated, with the 1.5B recipe's batch plan (written for 7 processes)
accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 1 examples/train_math.py \
    --config configs/dapo_qwen2.5_1.5b.yaml --vllm_mode colocate --vllm_gpu_memory_utilization 0.3 \
    --gradient_accumulation_steps 28 --steps_per_generation 112
# one 8-GPU node: a vLLM server on GPU 7, training on GPUs 0-6
CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model Qwen/Qwen2.5-7B --max_model_len 10240 &
CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 accelerate launch --config_file configs/accelerate/zero3.yaml --num_processes 7 \
    examples/train_math.py --config configs/dapo_qwen2.5_7b.yaml
```
Multi-node: `python -m dapo_trl.launch slurm|env ... examples/train_math.py ...` on every node builds the
`accelerate launch --num_machines N --machine_rank R --main_process_ip HOST ...` line from the scheduler's variables;
examples/slurm/ and examples/kubernetes/ are complete recipes (vLLM server on its own node, `--auto_resume true` so
that a preempted run restarts from its newest complete checkpoint). Each recipe states the batch plan it was
written for (`recipe_*` keys); a run whose plan differs warns at start with the settings that restore it.

Departures from the paper in the CPU demo (the paper recipe is configs/dapo_qwen2.5_32b.yaml;
docs/paper_recipe.md lists where it and verl's differ): a 0.34M-parameter model instead of Qwen2.5-32B, a synthetic task
instead of DAPO-Math-17k, a supervised warm-up first (from random weights every group is all-wrong and nothing can be
learned), 8 samples per prompt instead of 16, 4 updates per rollout step instead of 16, and a learning rate suited to a
tiny model (1e-6 would not move it).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from dapo_trl import DAPOConfig, DAPOTrainer, MathVerifierReward, released_process_group
from dapo_trl.run.cli import (
    one_line_errors,
    parse_or_exit,
    parse_values,
    print_plan,
    resume_argument,
    wants_plan,
    with_default_config,
)
from dapo_trl.run.console import format_summary, training_signal
from dapo_trl.run.plan import batch_plan, recipe_advice
from dapo_trl.run.run_record import (
    DataFormat,
    EvalSettings,
    PromptFormat,
    RunRecord,
    save_run_outputs,
    write_run_record,
)

logger = logging.getLogger("train_math")


@dataclass
class MathScriptArguments(ScriptArguments):
    """Data, evaluation and planning settings. Without `dataset_name` and `model_name_or_path`, the CPU demo runs."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub id or local file of the training set."})
    dataset_format: str = field(
        default="auto",
        metadata={
            "help": "Where prompt and answer come from, and whether the DAPO template wraps the prompt: 'auto' (the "
            "columns decide), 'dapo_math', 'problem', 'question', 'gsm8k', 'math' or 'columns' (see "
            "dapo_trl.run.data.load_math_dataset).",
            "choices": ("auto", "dapo_math", "problem", "question", "gsm8k", "math", "columns"),
        },
    )
    prompt_column: str | None = field(default=None, metadata={"help": "Prompt/problem column (format default)."})
    answer_column: str | None = field(default=None, metadata={"help": "Answer column; dotted paths read dicts."})
    conversational: bool = field(
        default=False,
        metadata={
            "help": "Prompts as chat messages through the tokenizer's chat template (verl's way); else raw text."
        },
    )
    system_prompt: str | None = field(default=None, metadata={"help": "System message before each prompt."})
    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "open-r1's reward names, for its recipes: 'accuracy' (MathVerifierReward), 'format' (TRL's "
            "think_format_reward), 'repetition_penalty' (TRL's), 'soft_overlong_punishment' (DAPOConfig's overlong "
            "shaping, built in). Default: accuracy only."
        },
    )
    dataset_prompt_column: str | None = field(
        default=None, metadata={"help": "open-r1's name of --prompt_column (used when that is not set)."}
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    reward_rule: str = field(
        default="equivalence",
        metadata={"help": "MathVerifierReward's rule: 'equivalence' (default) or 'dapo' (the paper's exact match)."},
    )
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Evaluation set, e.g. HuggingFaceH4/aime_2024."}
    )
    eval_split: str = field(default="train", metadata={"help": "Split of the evaluation set."})
    eval_k: int = field(default=32, metadata={"help": "Samples per problem for avg@k / pass@k / maj@k (paper: 32)."})
    eval_temperature: float = field(
        default=1.0, metadata={"help": "Evaluation temperature (paper: 1.0); 0 decodes greedily."}
    )
    eval_top_p: float = field(default=0.7, metadata={"help": "Evaluation top-p (paper: 0.7)."})
    eval_max_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N problems."})
    # Batch plan
    print_plan: bool = field(default=False, metadata={"help": "Print the batch plan and exit; loads no model."})
    num_processes: int | None = field(
        default=None, metadata={"help": "With --print_plan: plan for N training processes (default: this launch's)."}
    )
    recipe_num_processes: int | None = field(default=None, metadata={"help": "Processes the recipe is written for."})
    recipe_prompts_per_rollout: int | None = field(
        default=None, metadata={"help": "The recipe's prompts per rollout step; a run that differs warns."}
    )
    recipe_completions_per_update: int | None = field(
        default=None, metadata={"help": "The recipe's completions per optimizer update; a run that differs warns."}
    )
    console: str = field(
        default="auto",
        metadata={
            "help": "'bar': progress bar with a few metrics (all of them go to metrics.jsonl); 'full': TRL's metrics "
            "dict at every log; 'auto': bar for the CPU demo, full otherwise.",
            "choices": ("auto", "bar", "full"),
        },
    )
    # A real model on CPU (configs/smollm2_cpu.yaml; dapo_trl.run.warmup)
    sft_steps: int = field(
        default=0, metadata={"help": "Supervised format warm-up steps before RL (0: none); needs a `target` column."}
    )
    sft_dataset_name: str | None = field(
        default=None,
        metadata={"help": "Warm-up set (prompt column as --prompt_column, plus `target`); default: the training set."},
    )
    sft_batch_size: int = field(default=8, metadata={"help": "Warm-up examples per step."})
    sft_learning_rate: float = field(default=3e-5, metadata={"help": "Warm-up AdamW learning rate (peak)."})
    train_top_layers: int | None = field(
        default=None, metadata={"help": "Train only the top N decoder layers and the final norm (warm-up and RL)."}
    )
    eval_before_rl: bool = field(
        default=False,
        metadata={
            "help": "Evaluate the --eval_dataset_name problems before RL too (after any warm-up), with the same "
            "settings as after: the summary shows before -> after and eval_summary.json the paired change."
        },
    )
    # CPU demo only
    demo_train_size: int = field(default=4000, metadata={"help": "Demo: synthetic training problems."})
    demo_test_size: int = field(default=200, metadata={"help": "Demo: held-out problems drawn (repeats dropped)."})
    demo_sft_steps: int = field(default=1200, metadata={"help": "Demo: supervised warm-up steps."})
    demo_eval_samples: int = field(default=4, metadata={"help": "Demo: samples per held-out problem."})


# The default `--config`: with no --config, --model_name_or_path or --dataset_name, the CPU demo runs from this YAML,
# and any other flag overrides one of its values (`--max_steps 2` trains the demo for two steps).
DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cpu_demo.yaml"
REAL_RUN_FLAGS = ("--model_name_or_path", "--dataset_name")

# What the README promises in the demo's run folder besides the model and tokenizer (a test checks the README names
# exactly these, and the demo fails if one is missing at the end).
DEMO_ARTEFACTS = ("metrics.jsonl", "training_curves.png", "eval_summary.json", "heldout.jsonl", "dapo_run.json")
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
HELDOUT_FILE = "heldout.jsonl"

# Counts that must be at least 1: a 0 on the command line stops at argparse, naming the flag.
POSITIVE_INT_FLAGS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "steps_per_generation",
    "num_generations",
    "num_iterations",
    "max_completion_length",
    "max_train_samples",
    "eval_k",
    "eval_max_samples",
    "num_processes",
    "recipe_num_processes",
    "recipe_prompts_per_rollout",
    "recipe_completions_per_update",
    "demo_train_size",
    "demo_test_size",
    "demo_eval_samples",
)


def build_parser() -> TrlParser:
    from dapo_trl.run.cli import organize_help, require_positive

    parser = TrlParser((MathScriptArguments, DAPOConfig, ModelConfig))
    # the generated usage lists every field (hundreds of lines) above each error message
    parser.usage = "%(prog)s [--config YAML] [--FIELD VALUE ...]   (--help lists every field)"
    parser.description = (
        "DAPO on a math task (the CPU demo without --model_name_or_path and --dataset_name). The defaults shown are "
        "the ones in effect: DAPOConfig's, under the values of the --config YAML (configs/cpu_demo.yaml when no "
        "--config, model or dataset is given)."
    )
    require_positive(parser, POSITIVE_INT_FLAGS)
    organize_help(parser, script_class=MathScriptArguments, model_class=ModelConfig)
    return parser


def parse_args(argv: list[str] | None = None, parser: TrlParser | None = None):
    """The run's `(MathScriptArguments, DAPOConfig, ModelConfig)`: configs/cpu_demo.yaml unless `--config` or a model
    or dataset is given, then the flags over it."""
    parser = parser or build_parser()
    argv = effective_argv(sys.argv[1:] if argv is None else argv)
    if wants_plan(argv):
        # The plan does not depend on the device: build the config as on a CPU so that it parses on any machine.
        argv += ["--use_cpu", "true", "--bf16", "false", "--fp16", "false"]
    return parse_or_exit(parser, argv)


def effective_argv(argv: list[str]) -> list[str]:
    """`argv` with the demo's `--config` in front when it names no config, model or dataset."""
    return with_default_config(argv, DEMO_CONFIG, unless=REAL_RUN_FLAGS)


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    argv = effective_argv(sys.argv[1:] if argv is None else argv)
    if wants_plan(argv):
        return print_plan(parser, argv, MathScriptArguments)
    # Missing arguments first (read without building the configs, whose checks depend on the machine): a missing
    # model is the error to report, not the bf16 default this machine cannot run.
    check_required(parser, parse_values(parser, argv))
    script_args, training_args, model_args = parse_args(argv, parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    demo = script_args.dataset_name is None and model_args.model_name_or_path is None
    try:
        rewards = build_rewards(script_args, training_args)  # names checked before anything loads
    except ValueError as error:
        parser.error(str(error))
    if not demo:
        check_paths(parser, script_args, model_args)
    warn_if_plan_differs(script_args, training_args)
    if demo:
        return run_demo(script_args, training_args, rewards=rewards)
    try:
        train_set = load_training_set(script_args)
    except (ValueError, FileNotFoundError) as error:  # data that cannot be read as asked: one line, exit code 2
        parser.error(f"--dataset_name {script_args.dataset_name}: {error}")
    return run_real(script_args, training_args, model_args, train_set, rewards=rewards)


def check_required(parser: TrlParser, values) -> None:
    """
    Stop at argparse level when a run lacks an argument it needs: a model and a dataset go together (neither: the CPU
    demo), and `eval_before_rl` needs the held-out set. `values` holds every field's value (`parse_values`).
    """
    if (values.dataset_name is None) != (values.model_name_or_path is None):
        parser.error("give both --model_name_or_path and --dataset_name (or neither, for the CPU demo).")
    if values.eval_before_rl and not values.eval_dataset_name:
        parser.error("--eval_before_rl needs the held-out problems: set --eval_dataset_name.")


def check_paths(parser: TrlParser, script_args: MathScriptArguments, model_args: ModelConfig) -> None:
    """Stop at argparse level when a model or data path cannot be what the user meant (see `dapo_trl.run.cli`)."""
    from dapo_trl.run.cli import check_data_path, check_model_path

    problems = [
        check_model_path("--model_name_or_path", model_args.model_name_or_path),
        check_data_path("--dataset_name", script_args.dataset_name),
    ]
    if script_args.eval_dataset_name:
        problems.append(check_data_path("--eval_dataset_name", script_args.eval_dataset_name))
    for problem in problems:
        if problem:
            parser.error(problem)


# ------------------------------------------------------------------------------------------------------- batch plan


def warn_if_plan_differs(script_args: MathScriptArguments, training_args: DAPOConfig) -> None:
    advice = recipe_advice(batch_plan(training_args, training_args.world_size), **_recipe_plan(script_args))
    if advice and training_args.process_index == 0:
        logger.warning(advice[0].upper() + advice[1:] + " (`--print_plan` shows the whole plan.)")


def _recipe_plan(script_args: MathScriptArguments) -> dict:
    return {
        "prompts_per_rollout": script_args.recipe_prompts_per_rollout,
        "completions_per_update": script_args.recipe_completions_per_update,
        "num_processes": script_args.recipe_num_processes,
    }


# --------------------------------------------------------------------------------------------------------- CPU demo


def run_demo(script_args: MathScriptArguments, training_args: DAPOConfig, *, rewards: list | None = None) -> dict:
    from dapo_trl.run.evaluation import _verifier_functions
    from dapo_trl.run.toy import accuracy_report, build_char_tokenizer, build_tiny_model, make_math_dataset, warmup_sft
    from dapo_trl.trainer.dataset_checks import repeated_prompts_expected

    if training_args.use_vllm:
        raise SystemExit(
            "The CPU demo's tiny model is built in memory, and vLLM loads its model from a folder: run vLLM rollouts "
            "on your own model (--model_name_or_path DIR --dataset_name FILE), e.g. --config configs/smollm2_cpu.yaml "
            "(docs/vllm.md)."
        )
    if importlib.util.find_spec("matplotlib") is None:
        raise SystemExit(
            "The CPU demo writes training_curves.png, which needs matplotlib: pip install 'dapo-trl[plot]' "
            "(`make demo` installs it)."
        )
    # a deprecation inside TRL's step that the user cannot act on; it would sit under the progress bar
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
    torch.manual_seed(training_args.seed)
    if not torch.cuda.is_available():
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started = time.perf_counter()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=training_args.seed)
    train_set = make_math_dataset(script_args.demo_train_size, seed=training_args.seed)
    test_set = _distinct(make_math_dataset(script_args.demo_test_size, seed=training_args.seed, split="test"))
    # the evaluation CLI reproduces the "after" accuracy from these files: same rows, prompt format and sampling
    record = RunRecord(
        prompt_format=PromptFormat(conversational=False),
        evaluation=EvalSettings(
            k=script_args.demo_eval_samples,
            temperature=1.0,
            top_p=1.0,
            max_new_tokens=training_args.max_completion_length,
            batch_size=64,
            seed=training_args.seed,
            reward_rule=script_args.reward_rule,
        ),
        heldout=HELDOUT_FILE,
    )
    if training_args.process_index == 0:
        write_run_record(training_args.output_dir, record)
        with open(os.path.join(training_args.output_dir, HELDOUT_FILE), "w") as f:
            for row in test_set.select_columns(["prompt", "answer", "difficulty"]):
                f.write(json.dumps(row) + "\n")

    warmup_sft(model, tokenizer, train_set, steps=script_args.demo_sft_steps, seed=training_args.seed)
    warmup_seconds = time.perf_counter() - started
    reward = rewards or build_rewards(script_args, training_args)
    settings = record.evaluation
    measure = dict(
        num_samples=settings.k,
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        batch_size=settings.batch_size,
        seed=settings.seed,
        scorer=_verifier_functions("strict", script_args.reward_rule)[0],  # the evaluation CLI's default scorer
    )
    before = accuracy_report(model, tokenizer, test_set, **measure)
    logger.info(f"after warm-up: held-out sampled accuracy {before['accuracy']:.3f}")

    # a setting refused: one line, exit code 2; the synthetic problems repeat by design (no advice to deduplicate them)
    with one_line_errors(), repeated_prompts_expected():
        trainer = DAPOTrainer(
            model=model,
            reward_funcs=reward,
            args=training_args,
            train_dataset=train_set,
            processing_class=tokenizer,
        )
    use_console(trainer, script_args, demo=True)
    rl_started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume_argument(training_args.resume_from_checkpoint))
    rl_seconds = time.perf_counter() - rl_started
    after = accuracy_report(trainer.model, tokenizer, test_set, **measure)

    summary = {
        "task": "synthetic arithmetic (CPU demo)",
        "accuracy_before_rl": before["accuracy"],
        "accuracy_after_rl": after["accuracy"],
        "heldout_problems": len(test_set),
        "samples_per_problem": settings.k,
        "before": before,
        "after": after,
        "warmup_seconds": round(warmup_seconds, 1),
        "rl_seconds": round(rl_seconds, 1),
        "optimizer_steps": trainer.state.global_step,
        # the summary box's held-out line: after warm-up -> after DAPO, sampled as the run record says
        "heldout": {
            "before": before["accuracy"],
            "after": after["accuracy"],
            "n": len(test_set),
            "sampling": settings.describe(),
        },
        "heldout_set": os.path.join(training_args.output_dir, HELDOUT_FILE),
    }
    finish(trainer, summary)
    missing = [
        name
        for name in (*MODEL_FILES, *DEMO_ARTEFACTS)
        if not os.path.exists(os.path.join(training_args.output_dir, name))
    ]
    if missing and training_args.process_index == 0:
        raise RuntimeError(f"The demo did not write {missing} into {training_args.output_dir}.")
    return summary


def _distinct(dataset):
    """Drop repeated problems (the 1+1-digit level has few held-out ones): each problem counts once."""
    first: dict[str, int] = {}
    for index, prompt in enumerate(dataset["prompt"]):
        first.setdefault(prompt, index)
    return dataset.select(sorted(first.values()))


# --------------------------------------------------------------------------------------------------------- real data


def data_settings(script_args: MathScriptArguments) -> dict:
    """
    How every data file of the run is read, the training set, the warm-up set and the held-out set alike: the format
    (which decides whether DAPO's template wraps a prompt), the columns and the prompt shape. The run record keeps the
    first three (`DataFormat`), so that `python -m dapo_trl.evaluation` reads a held-out file the same way.
    """
    return {
        **_data_format(script_args),
        "conversational": script_args.conversational,
        "system_prompt": script_args.system_prompt,
    }


def _data_format(script_args: MathScriptArguments) -> dict:
    return {
        "dataset_format": script_args.dataset_format,
        "prompt_column": script_args.prompt_column or script_args.dataset_prompt_column,
        "answer_column": script_args.answer_column,
    }


def load_training_set(script_args: MathScriptArguments):
    """The training rows, with prompts in the run's format (`data_settings`)."""
    from dapo_trl.run.data import load_math_dataset

    return load_math_dataset(
        script_args.dataset_name,
        split=script_args.dataset_train_split,
        config_name=script_args.dataset_config,
        max_samples=script_args.max_train_samples,
        **data_settings(script_args),
    )


def load_heldout(script_args: MathScriptArguments):
    """The held-out rows (`eval_dataset_name`), read as the training set is (`data_settings`)."""
    from dapo_trl.run.data import load_math_dataset

    return load_math_dataset(
        script_args.eval_dataset_name,
        split=script_args.eval_split,
        max_samples=script_args.eval_max_samples,
        **data_settings(script_args),
    )


# open-r1's `reward_funcs` names of the rewards this library or TRL ships, and what each one becomes here.
OPEN_R1_REWARDS = {
    "accuracy": "MathVerifierReward (DAPO's +1/-1 correctness of the final answer)",
    "format": "trl.rewards.think_format_reward, for string or chat prompts (1 when it opens with <think>...</think>)",
    "repetition_penalty": "trl.rewards.get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0)",
    "soft_overlong_punishment": "DAPOConfig's overlong shaping (Eq. 13), applied by the trainer, not a reward column",
}


def build_rewards(script_args: MathScriptArguments, training_args: DAPOConfig) -> list:
    """
    The reward functions of a run: `MathVerifierReward` alone, or open-r1's `reward_funcs` names mapped to this
    library's and TRL's rewards ([`OPEN_R1_REWARDS`]); an unknown name is refused with the list of known ones.
    `reward_weights` follow the names, less the one of `soft_overlong_punishment` (built into the trainer).
    """
    from trl.rewards import get_repetition_penalty_reward

    from dapo_trl.rewards.format import think_format_reward  # TRL's reads completion[0]["content"]: chat only

    names = script_args.reward_funcs or ["accuracy"]
    unknown = [name for name in names if name not in OPEN_R1_REWARDS]
    if unknown:
        raise ValueError(
            f"reward_funcs {unknown}: not a reward this library or TRL ships; known names: {list(OPEN_R1_REWARDS)}. "
            "Train with your own reward through DAPOTrainer(reward_funcs=...) (see examples/custom_trainer.py)."
        )
    if names == ["soft_overlong_punishment"]:
        raise ValueError("reward_funcs names only soft_overlong_punishment, a shaping term: add a reward (accuracy).")
    if len(set(names)) != len(names):
        raise ValueError(f"reward_funcs {names} names a reward twice.")
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(names):
        raise ValueError(f"reward_weights has {len(weights)} values for the {len(names)} reward_funcs {names}.")
    if "soft_overlong_punishment" in names:
        if not training_args.overlong_shaping:
            raise ValueError(
                "reward_funcs names soft_overlong_punishment, which is DAPOConfig's overlong shaping: set "
                "overlong_shaping true (or drop the name)."
            )
        if weights is not None:  # the trainer sees one weight per reward column
            training_args.reward_weights = [w for n, w in zip(names, weights) if n != "soft_overlong_punishment"]
    make = {
        "accuracy": lambda: build_reward(script_args),
        "format": lambda: think_format_reward,
        "repetition_penalty": lambda: get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0),
    }
    if script_args.reward_funcs and training_args.process_index == 0:
        logger.info("reward_funcs: " + "; ".join(f"{name} -> {OPEN_R1_REWARDS[name]}" for name in names))
    return [make[name]() for name in names if name in make]


def build_reward(script_args: MathScriptArguments) -> MathVerifierReward:
    if script_args.reward_rule == "equivalence":  # the default: no keyword, so older MathVerifierReward works too
        return MathVerifierReward(answer_column="answer")
    try:
        return MathVerifierReward(answer_column="answer", rule=script_args.reward_rule)
    except TypeError:
        raise ValueError(
            f"--reward_rule {script_args.reward_rule}: this dapo-trl's MathVerifierReward has no `rule` argument; "
            "only the default 'equivalence' rule is available."
        ) from None


def run_real(
    script_args: MathScriptArguments,
    training_args: DAPOConfig,
    model_args: ModelConfig,
    train_set=None,
    *,
    rewards: list | None = None,
) -> dict:
    """
    Train on the user's model and data. With an evaluation set, its one held-out result: the run record's evaluation
    (`eval_k`, `eval_temperature`, `eval_top_p`) after RL, and before RL too with `eval_before_rl`, on the same prompts
    (read like the training set, `data_settings`), through the run's vLLM engine when it generated with vLLM.
    """
    from dapo_trl.run.heldout import evaluation_engine, heldout_evaluation, load_before, paired_result, save_before

    if importlib.util.find_spec("matplotlib") is None:
        logger.warning("matplotlib is not installed (pip install 'dapo-trl[plot]'): no training_curves.png.")
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": dtype,
        **(training_args.model_init_kwargs or {}),
    }
    record = make_run_record(script_args, training_args, model_args)
    if training_args.process_index == 0:
        write_run_record(training_args.output_dir, record)
    reward = rewards or build_rewards(script_args, training_args)
    resuming = is_resuming(training_args)
    with one_line_errors():  # a setting or the data refused while the run is set up: one line, exit code 2
        prepared = prepare_real_model(script_args, training_args, model_args, resuming=resuming)
        trainer = DAPOTrainer(
            model=model_args.model_name_or_path if prepared is None else prepared["model"],
            reward_funcs=reward,
            args=training_args,
            train_dataset=load_training_set(script_args) if train_set is None else train_set,
            peft_config=get_peft_config(model_args),
        )
        heldout = load_heldout(script_args) if script_args.eval_dataset_name else None
    use_console(trainer, script_args, demo=False)
    seconds = dict(prepared["seconds"]) if prepared is not None else {}
    before = None
    if heldout is not None and script_args.eval_before_rl:
        before = load_before(training_args.output_dir) if resuming else None
        if before is None:
            before = heldout_evaluation(
                trainer.model, trainer.processing_class, heldout, record, engine=evaluation_engine(trainer)
            )
            seconds["eval_before"] = before["seconds"]
            if training_args.process_index == 0:
                save_before(training_args.output_dir, before)
        logger.info(f"held-out accuracy before RL: {before['accuracy']:.3f} ({before['sampling']}, n={before['n']})")
    rl_started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume_argument(training_args.resume_from_checkpoint))
    seconds["rl"] = time.perf_counter() - rl_started
    summary: dict = {
        "task": f"{_name(model_args.model_name_or_path)}, trained on {_name(script_args.dataset_name)}",
        "optimizer_steps": trainer.state.global_step,
    }
    if prepared is not None:
        summary.update({key: prepared[key] for key in ("warmup", "trainable_parameters") if key in prepared})
    if heldout is not None:
        after = heldout_evaluation(
            trainer.model, trainer.processing_class, heldout, record, engine=evaluation_engine(trainer)
        )
        seconds["eval_after"] = after["seconds"]
        summary["eval"] = {key: value for key, value in after.items() if key not in ("correct", "examples")}
        summary["heldout"] = (
            paired_result(before, after)
            if before is not None
            else {"after": after["accuracy"], "n": after["n"], "sampling": after["sampling"]}
        )
        summary["heldout_set"] = script_args.eval_dataset_name
        if before is not None:
            summary["heldout_before"] = before
        summary["heldout_after"] = after
    summary["seconds"] = {**seconds, "total": sum(seconds.values())}
    finish(trainer, summary)
    return summary


def is_resuming(training_args: DAPOConfig) -> bool:
    """Whether `train()` will load a checkpoint: `--resume_from_checkpoint`, or `--auto_resume` next to a complete one."""
    from dapo_trl import latest_complete_checkpoint

    if resume_argument(training_args.resume_from_checkpoint):
        return True
    return bool(training_args.auto_resume and latest_complete_checkpoint(training_args.output_dir))


def _name(path: str) -> str:
    """A model or data path as the summary names it: its last part (`outputs/run/` -> `run`)."""
    return os.path.basename(os.path.normpath(path)) or path


def prepare_real_model(
    script_args: MathScriptArguments, training_args: DAPOConfig, model_args: ModelConfig, *, resuming: bool = False
) -> dict | None:
    """
    With `sft_steps` or `train_top_layers`: the model loaded here, frozen below the top layers and warmed up (see
    `dapo_trl.run.warmup`); else None (the trainer loads the model). A resumed run skips the warm-up: the checkpoint
    holds the weights it trained from them.
    """
    if not (script_args.sft_steps or script_args.train_top_layers):
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_trl.run.data import load_math_dataset
    from dapo_trl.run.warmup import freeze_below, sft_warm_up

    started = time.perf_counter()
    torch.manual_seed(training_args.seed)
    path = model_args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, **training_args.model_init_kwargs)
    out: dict = {"model": model, "tokenizer": tokenizer, "seconds": {"load": time.perf_counter() - started}}
    if script_args.train_top_layers:
        out["trainable_parameters"] = freeze_below(model, script_args.train_top_layers)
    if script_args.sft_steps and resuming:
        logger.info("Resuming from a checkpoint: the supervised warm-up is skipped (the checkpoint holds its result).")
    elif script_args.sft_steps:
        sft_set = load_math_dataset(
            script_args.sft_dataset_name or script_args.dataset_name,
            keep_columns=["target"],
            **data_settings(script_args),
        )
        out["warmup"] = sft_warm_up(
            model,
            tokenizer,
            sft_set["prompt"],
            sft_set["target"],
            steps=script_args.sft_steps,
            batch_size=script_args.sft_batch_size,
            lr=script_args.sft_learning_rate,
            seed=training_args.seed,
            progress=training_args.process_index == 0,
        )
        out["seconds"]["warmup"] = out["warmup"]["seconds"]
        logger.info(f"warm-up: {script_args.sft_steps} steps in {out['warmup']['seconds']:.0f} s")
    return out


def make_run_record(
    script_args: MathScriptArguments, training_args: DAPOConfig, model_args: ModelConfig | None = None
) -> RunRecord:
    """How the run read its data, formatted its prompts and evaluates, written to its folder for every evaluation."""
    return RunRecord(
        data_format=DataFormat(**_data_format(script_args)),
        prompt_format=PromptFormat(
            conversational=script_args.conversational,
            system_prompt=script_args.system_prompt,
            chat_template_kwargs=dict(training_args.chat_template_kwargs or {}),
            max_prompt_length=getattr(training_args, "max_prompt_length", None),
            prompt_truncation_side=getattr(training_args, "prompt_truncation_side", "left"),
        ),
        evaluation=EvalSettings(
            k=script_args.eval_k,
            temperature=script_args.eval_temperature,
            top_p=script_args.eval_top_p,
            max_new_tokens=training_args.max_completion_length,
            seed=training_args.seed,
            reward_rule=script_args.reward_rule,
            backend="vllm" if training_args.use_vllm else "transformers",
            vllm_dtype=_vllm_dtype(training_args, model_args) if training_args.use_vllm else None,
        ),
    )


def _vllm_dtype(training_args: DAPOConfig, model_args: ModelConfig | None) -> str | None:
    """The dtype the run's vLLM engine served (`vllm_dtype`, with "auto" resolved as the trainer does where known)."""
    if training_args.vllm_dtype != "auto":
        return training_args.vllm_dtype
    if training_args.bf16 or training_args.fp16:
        return "bfloat16" if training_args.bf16 else "float16"
    dtype = getattr(model_args, "dtype", None)
    return dtype if dtype in ("float32", "bfloat16", "float16") else None


# ---------------------------------------------------------------------------------------------------------- outputs


def use_console(trainer: DAPOTrainer, script_args: MathScriptArguments, *, demo: bool) -> None:
    """`console='bar'` (the demo's default): a progress bar with a few metrics instead of a dict per log."""
    from transformers.trainer_callback import ProgressCallback

    from dapo_trl.run.console import ConciseProgressCallback

    if script_args.console == "bar" or (script_args.console == "auto" and demo):
        if trainer.pop_callback(ProgressCallback) is not None:
            trainer.add_callback(ConciseProgressCallback())


def finish(trainer: DAPOTrainer, summary: dict) -> None:
    """Save the model, the metrics log, the curves and the summary; print the summary on one screen; release the
    process group (every process has saved: nothing collective follows)."""
    is_main = save_run_outputs(trainer, summary)
    trainer.accelerator.end_training()  # trackers finish, the group is unregistered; its backend is freed after main()
    if not is_main:
        return
    rows = summary_rows(summary, trainer.args.output_dir)
    print(format_summary(f"dapo-trl: {summary['task']}", rows, trainer.state.log_history))
    print(training_signal(trainer.state.log_history))  # the last line: did the policy move at all?


def summary_rows(summary: dict, output_dir: str) -> list[tuple[str, str]]:
    """The end-of-run summary's lines, as (name, value): one held-out result, before and after RL, first."""
    from dapo_trl.run.heldout import describe_heldout

    rows = []
    if "heldout" in summary:
        rows.append(("held-out accuracy", describe_heldout(summary["heldout"])))
        detail = heldout_detail(summary.get("eval", {}))
        if detail:
            rows.append(("  after RL", detail))
    seconds = summary.get("seconds") or {"warmup": summary.get("warmup_seconds"), "rl": summary.get("rl_seconds")}
    spent = [f"{label} {seconds[key]:.0f} s" for key, label in TIME_LABELS if seconds.get(key) is not None]
    if spent:
        rows.append(("time", ", ".join(spent)))
    rows.append(("optimizer steps", str(summary["optimizer_steps"])))
    rows.append(("run folder", f"{output_dir}  (every metric: metrics.jsonl; curves: training_curves.png)"))
    diagnoses = summary.get("diagnoses", [])
    rows.append(("diagnoses fired", str(len(diagnoses))))
    rows += [(f"  step {d['step']}", f"{d['name']}: {d.get('symptom', '')}".rstrip(": ")) for d in diagnoses]
    if summary.get("heldout_set"):
        rows.append(
            ("re-evaluate", f"python -m dapo_trl.evaluation --model {output_dir} --dataset {summary['heldout_set']}")
        )
    return rows


# (key of the summary's `seconds`, label of the summary's time line)
TIME_LABELS = (
    ("warmup", "warm-up"),
    ("eval_before", "held-out before RL"),
    ("rl", "DAPO"),
    ("eval_after", "held-out after RL"),
)


def heldout_detail(metrics: dict) -> str:
    """The evaluation's other figures on one line (pass@k and maj@k with k > 1, answers missing, completion length)."""
    k = metrics.get("k", 1)
    parts = [f"{name} {metrics[name]:.3f}" for name in (f"pass@{k}", f"maj@{k}") if k > 1 and name in metrics]
    if "no_answer_frac" in metrics:
        parts.append(f"no answer {metrics['no_answer_frac']:.3f}")
    if "mean_completion_chars" in metrics:
        parts.append(f"mean completion {metrics['mean_completion_chars']:.1f} chars")
    return " | ".join(parts)


if __name__ == "__main__":
    with released_process_group():  # after main() (or a preemption stop): free gloo's threads before interpreter exit
        main()
