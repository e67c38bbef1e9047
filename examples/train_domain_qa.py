"""Train a causal LM to answer multiple-choice questions after a `<think>...</think>` block, with DAPO.

A domain beyond math: the same recipe as `examples/train_math.py` with two rewards, correctness of the chosen letter
(`dapo_trl.MultipleChoiceReward`, first, so dynamic sampling filters on it) and TRL's own
`trl.rewards.think_format_reward` (1 when the completion opens with a reasoning block, else 0). Each is logged on its
own (`rewards/multiple_choice/mean`, `rewards/think_format_reward/mean`).

Without `--config` or `--model_name_or_path` it runs the CPU demo of `configs/cpu_domain_qa.yaml` (its default
`--config`; any flag overrides one of its values): a tiny model and character tokenizer built locally (nothing is
downloaded), the shipped synthetic set `examples/data/pharma_mcq_{train,test}.jsonl` (which of ten conditions each of
thirty made-up drugs treats, four or five options A-E), a short supervised warm-up that writes
`<think>condition</think>\\nAnswer: X`, then DAPO. Everything else comes from a YAML (`--config`) or the command line:
every `DomainQAScriptArguments`, `DAPOConfig` and `ModelConfig` field is a flag, and `--print_plan` prints the batch
plan of the settings in effect without loading anything.

Your own data: a `.jsonl` file (or `.json`, `.csv`, `.parquet`, or a Hub id) with one question per row,
```
{"question": "Which drug class is first-line for ...?", "options": ["...", "...", "...", "..."], "answer": "B"}
```
`options` is a list of 2-5 texts in letter order (or a dict keyed by letter); `answer` is the correct letter or the
correct option's text (see `dapo_trl.rewards.choice` for the format and for how answers are read). Launch:
```
accelerate launch examples/train_domain_qa.py                                      # CPU demo (its default config)
accelerate launch examples/train_domain_qa.py --max_steps 20                       # the demo, 20 steps
accelerate launch examples/train_domain_qa.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
    --dataset_name my_train.jsonl --eval_dataset_name my_test.jsonl --output_dir qwen-mcq \\
    --max_completion_length 1024 --use_vllm --vllm_mode colocate --bf16
```
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.rewards import think_format_reward

from dapo_trl import DAPOConfig, DAPOTrainer, MultipleChoiceReward, extract_choice, released_process_group
from dapo_trl.rewards.choice import gold_choice, load_choice_dataset
from dapo_trl.run.cli import (
    one_line_errors,
    organize_help,
    parse_or_exit,
    print_plan,
    resume_argument,
    wants_plan,
    with_default_config,
)
from dapo_trl.run.console import training_signal
from dapo_trl.run.run_record import save_run_outputs
from dapo_trl.trainer.diagnostics import fired_diagnoses

logger = logging.getLogger("train_domain_qa")

DATA = Path(__file__).resolve().parent / "data"
INSTRUCTION = (
    "Think about the question inside <think> </think> tags, then give the letter of the correct option on the last "
    "line as 'Answer: X'."
)
# The CPU demo's tokenizer renders a chat as the bare message texts, so prompts stay short for the tiny model.
DEMO_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


@dataclass
class DomainQAScriptArguments(ScriptArguments):
    """Data and evaluation settings. Without `model_name_or_path`, the CPU demo runs."""

    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Training questions (jsonl/json/csv/parquet or Hub id). Default: the demo set."},
    )
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Held-out questions. Default: the demo's test set when training on its set."}
    )
    instruction: str | None = field(
        default=None,
        metadata={
            "help": "Paragraph before each question ('' for none). Default: INSTRUCTION, none for the CPU demo."
        },
    )
    system_prompt: str | None = field(default=None, metadata={"help": "Optional system message."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    eval_max_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N questions."})
    eval_k: int = field(default=4, metadata={"help": "Sampled answers per held-out question."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Evaluation temperature."})
    # Batch plan
    print_plan: bool = field(default=False, metadata={"help": "Print the batch plan and exit; loads no model."})
    num_processes: int | None = field(
        default=None, metadata={"help": "With --print_plan: plan for N training processes (default: this launch's)."}
    )
    recipe_num_processes: int | None = field(default=None, metadata={"help": "Processes the recipe is written for."})
    recipe_prompts_per_rollout: int | None = field(
        default=None, metadata={"help": "The recipe's prompts per rollout step (shown by --print_plan)."}
    )
    recipe_completions_per_update: int | None = field(
        default=None, metadata={"help": "The recipe's completions per optimizer update (shown by --print_plan)."}
    )
    # CPU demo only
    demo_sft_steps: int = field(default=600, metadata={"help": "Demo: supervised warm-up steps."})


# The default `--config` when neither --config nor --model_name_or_path is given: flags override its values.
DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "cpu_domain_qa.yaml"
REAL_RUN_FLAGS = ("--model_name_or_path",)


def build_parser() -> TrlParser:
    parser = TrlParser((DomainQAScriptArguments, DAPOConfig, ModelConfig))
    parser.usage = "%(prog)s [--config YAML] [--FIELD VALUE ...]   (--help lists every field)"
    parser.description = (
        "DAPO on multiple-choice questions (the CPU demo without --model_name_or_path). The defaults shown are the "
        "ones in effect: DAPOConfig's, under the values of the --config YAML (configs/cpu_domain_qa.yaml when no "
        "--config or model is given)."
    )
    organize_help(parser, script_class=DomainQAScriptArguments, model_class=ModelConfig)
    return parser


def effective_argv(argv: list[str]) -> list[str]:
    """`argv` with the demo's `--config` in front when it names no config and no model."""
    return with_default_config(argv, DEMO_CONFIG, unless=REAL_RUN_FLAGS)


def parse_args(argv: list[str] | None = None, parser: TrlParser | None = None):
    parser = parser or build_parser()
    return parse_or_exit(parser, effective_argv(sys.argv[1:] if argv is None else argv))


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    argv = effective_argv(sys.argv[1:] if argv is None else argv)
    if wants_plan(argv):
        return print_plan(parser, argv, DomainQAScriptArguments)
    script_args, training_args, model_args = parse_args(argv, parser)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if script_args.instruction is None:  # the demo's tiny model has a 128-token context: no instruction paragraph
        script_args.instruction = INSTRUCTION if model_args.model_name_or_path else ""
    try:
        train_set, eval_set = load_data(script_args)
    except (ValueError, FileNotFoundError) as error:  # data that cannot be read as asked: one line, exit code 2
        parser.error(str(error))
    if model_args.model_name_or_path is None:
        return run_demo(script_args, training_args, train_set, eval_set)
    return run_real(script_args, training_args, model_args, train_set, eval_set)


def load_data(script_args: DomainQAScriptArguments):
    train_path = script_args.dataset_name or str(DATA / "pharma_mcq_train.jsonl")
    eval_path = script_args.eval_dataset_name
    if eval_path is None and script_args.dataset_name is None:
        eval_path = str(DATA / "pharma_mcq_test.jsonl")
    kwargs = dict(instruction=script_args.instruction or None, system_prompt=script_args.system_prompt)
    train_set = load_choice_dataset(
        train_path, split=script_args.dataset_train_split, max_samples=script_args.max_train_samples, **kwargs
    )
    eval_set = (
        load_choice_dataset(eval_path, max_samples=script_args.eval_max_samples, **kwargs) if eval_path else None
    )
    return train_set, eval_set


def rewards() -> list:
    """Correctness first (dynamic sampling's default filter is the first reward), then TRL's format reward."""
    return [MultipleChoiceReward(), think_format_reward]


# --------------------------------------------------------------------------------------------------------- CPU demo


def run_demo(script_args, training_args: DAPOConfig, train_set, eval_set) -> dict:
    from datasets import Dataset

    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model, warmup_sft

    torch.manual_seed(training_args.seed)
    if not torch.cuda.is_available():
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started = time.perf_counter()
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = DEMO_CHAT_TEMPLATE
    model = build_tiny_model(tokenizer, seed=training_args.seed)
    if "explanation" not in train_set.column_names:
        raise ValueError("The CPU demo's warm-up writes each row's 'explanation' inside <think>; the data has none.")
    rendered = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in train_set["prompt"]
    ]
    targets = [
        f"<think>{row['explanation']}</think>\nAnswer: {gold_choice(row['answer'], row['options'])}"
        for row in train_set
    ]
    warm_up = Dataset.from_dict({"prompt": rendered, "target": targets})
    warmup_sft(
        model, tokenizer, warm_up, steps=script_args.demo_sft_steps, seed=training_args.seed, stop_accuracy=None
    )
    warmup_seconds = time.perf_counter() - started
    before = choice_accuracy(model, tokenizer, eval_set, script_args, training_args)
    logger.info(f"after warm-up: held-out accuracy {before['accuracy']:.3f}, format {before['format']:.3f}")

    with one_line_errors():  # a setting or the data refused: one line, exit code 2
        trainer = DAPOTrainer(
            model=model,
            reward_funcs=rewards(),
            args=training_args,
            train_dataset=train_set,
            processing_class=tokenizer,
        )
    rl_started = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume_argument(training_args.resume_from_checkpoint))
    rl_seconds = time.perf_counter() - rl_started
    after = choice_accuracy(trainer.model, tokenizer, eval_set, script_args, training_args)
    summary = {
        "task": "synthetic multiple-choice QA (CPU demo)",
        "before": before,
        "after": after,
        "warmup_seconds": round(warmup_seconds, 1),
        "rl_seconds": round(rl_seconds, 1),
        "optimizer_steps": trainer.state.global_step,
    }
    finish(trainer, summary)
    return summary


# --------------------------------------------------------------------------------------------------------- real model


def run_real(script_args, training_args: DAPOConfig, model_args: ModelConfig, train_set, eval_set) -> dict:
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": dtype,
        **(training_args.model_init_kwargs or {}),
    }
    with one_line_errors():  # a setting or the data refused: one line, exit code 2
        trainer = DAPOTrainer(
            model=model_args.model_name_or_path,
            reward_funcs=rewards(),
            args=training_args,
            train_dataset=train_set,
            peft_config=get_peft_config(model_args),
        )
    trainer.train(resume_from_checkpoint=resume_argument(training_args.resume_from_checkpoint))
    summary: dict = {"task": script_args.dataset_name or "synthetic multiple-choice QA"}
    summary["optimizer_steps"] = trainer.state.global_step
    if eval_set is not None:
        summary["after"] = choice_accuracy(
            trainer.model, trainer.processing_class, eval_set, script_args, training_args
        )
    finish(trainer, summary)
    return summary


# --------------------------------------------------------------------------------------------------------- evaluation


def choice_accuracy(model, tokenizer, dataset, script_args, training_args: DAPOConfig) -> dict:
    """Sampled accuracy (avg@k), the share of answers with a letter, and the share in the `<think>` format."""
    from dapo_trl.run.evaluation import sample_completions

    if dataset is None:
        return {}
    completions = sample_completions(
        model,
        tokenizer,
        dataset["prompt"],
        k=script_args.eval_k,
        max_new_tokens=training_args.max_completion_length,
        temperature=script_args.eval_temperature,
        seed=training_args.seed,
    )
    correct = answered = formatted = 0
    for samples, row in zip(completions, dataset, strict=True):
        gold = gold_choice(row["answer"], row["options"])
        for text in samples:
            letter = extract_choice(text, row["options"])
            correct += letter == gold
            answered += letter is not None
        formatted += sum(think_format_reward([[{"content": text}] for text in samples]))
    n = len(dataset) * script_args.eval_k
    return {"accuracy": correct / n, "answered": answered / n, "format": formatted / n, "num_questions": len(dataset)}


def finish(trainer: DAPOTrainer, summary: dict) -> None:
    """Save the model, the metrics log, the curves and the summary; print the summary on one screen; release the
    process group (every process has saved: nothing collective follows)."""
    is_main = save_run_outputs(trainer, summary)
    trainer.accelerator.end_training()  # trackers finish, the group is unregistered; its backend is freed after main()
    if not is_main:
        return
    print(format_summary(trainer, summary))
    print(training_signal(trainer.state.log_history))  # the last line: did the policy move at all?


def format_summary(trainer: DAPOTrainer, summary: dict) -> str:
    last = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    lines = ["", "=" * 72, f"dapo-trl: {summary['task']}", "-" * 72]
    before, after = summary.get("before", {}), summary.get("after", {})
    for name in ("accuracy", "answered", "format"):
        if name in after:
            was = f"{before[name]:.3f} -> " if name in before else ""
            lines.append(f"held-out {name:<19}{was}{after[name]:.3f}")
    if "warmup_seconds" in summary:
        lines.append(
            f"time                        warm-up {summary['warmup_seconds']}s, DAPO {summary['rl_seconds']}s"
        )
    lines.append(f"optimizer steps             {summary['optimizer_steps']}")
    for key in (
        "rewards/multiple_choice/mean",
        "rewards/think_format_reward/mean",
        "dynamic_sampling/informative_frac",
    ):
        if last.get(key) is not None:
            lines.append(f"{key:<36}{last[key]:.4g}   (last logged)")
    diagnoses = fired_diagnoses(trainer)
    lines.append(f"diagnoses fired             {len(diagnoses)}")
    lines.extend(f"  step {d.step:<6} {d.name}: {d.symptom}" for d in diagnoses)
    lines.append(f"outputs                     {trainer.args.output_dir}")
    lines.append("=" * 72)
    return "\n".join(lines)


if __name__ == "__main__":
    with released_process_group():  # after main() (or a preemption stop): free gloo's threads before interpreter exit
        main()
