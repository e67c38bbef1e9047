"""Train a causal LM to answer multiple-choice questions after a `<think>...</think>` block, with DAPO.

A domain beyond math: the same recipe as `examples/train_math.py` with two rewards, correctness of the chosen letter
(`dapo_trl.MultipleChoiceReward`, first, so dynamic sampling filters on it) and TRL's own
`trl.rewards.think_format_reward` (1 when the completion opens with a reasoning block, else 0). Each is logged on its
own (`rewards/multiple_choice/mean`, `rewards/think_format_reward/mean`).

With no arguments it runs the embedded CPU demo: a tiny model and character tokenizer built locally (nothing is
downloaded), the shipped synthetic set `examples/data/pharma_mcq_{train,test}.jsonl` (which of ten conditions each of
thirty made-up drugs treats, four or five options A-E), a short supervised warm-up that writes
`<think>condition</think>\\nAnswer: X`, then DAPO. Everything else comes from a YAML (`--config`) or the command line:
every `DomainQAScriptArguments`, `DAPOConfig` and `ModelConfig` field is a flag.

Your own data: a `.jsonl` file (or `.json`, `.csv`, `.parquet`, or a Hub id) with one question per row,
```
{"question": "Which drug class is first-line for ...?", "options": ["...", "...", "...", "..."], "answer": "B"}
```
`options` is a list of 2-5 texts in letter order (or a dict keyed by letter); `answer` is the correct letter or the
correct option's text (see `dapo_trl.choice` for the format and for how answers are read). Launch:
```
accelerate launch examples/train_domain_qa.py                                      # CPU demo (embedded default)
accelerate launch examples/train_domain_qa.py --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct \\
    --dataset_name my_train.jsonl --eval_dataset_name my_test.jsonl --output_dir qwen-mcq \\
    --max_completion_length 1024 --use_vllm --vllm_mode colocate --bf16
```
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config
from trl.rewards import think_format_reward

from dapo_trl import DAPOConfig, DAPOTrainer, MultipleChoiceReward, extract_choice
from dapo_trl.choice import gold_choice, load_choice_dataset
from dapo_trl.diagnostics import fired_diagnoses
from dapo_trl.plotting import plot_training_curves, save_log_history

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
    # CPU demo only
    demo_sft_steps: int = field(default=600, metadata={"help": "Demo: supervised warm-up steps."})


# The embedded CPU default.
CPU_DEMO: dict = {
    "output_dir": "outputs/cpu-domain-qa",
    "use_cpu": True,
    "bf16": False,
    "gradient_checkpointing": False,
    "ddp_find_unused_parameters": False,
    "report_to": "none",
    "seed": 0,
    "logging_steps": 10,
    "save_strategy": "no",
    "log_completions": False,
    # rollout: 16 prompts x 8 samples per generation batch, 4 updates of 32 rows each
    "max_steps": 200,
    "num_generations": 8,
    "per_device_train_batch_size": 32,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 4,
    "max_completion_length": 40,  # the longest well-formed completion is 32 tokens
    "overlong_buffer_len": 8,
    "beta": 0.0,
    "loss_type": "dapo",
    "dynamic_sampling": True,
    "dynamic_sampling_reward": "multiple_choice",  # filter on correctness, never on the format reward
    "dynamic_sampling_max_rounds": 4,
    "learning_rate": 1e-4,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "demo_sft_steps": 600,
    "eval_k": 4,
}


def parse_args(argv: list[str] | None = None):
    parser = TrlParser((DomainQAScriptArguments, DAPOConfig, ModelConfig))
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return parser.parse_dict(CPU_DEMO)
    return parser.parse_args_and_config(argv)


def main(argv: list[str] | None = None) -> dict:
    script_args, training_args, model_args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if script_args.instruction is None:  # the demo's tiny model has a 128-token context: no instruction paragraph
        script_args.instruction = INSTRUCTION if model_args.model_name_or_path else ""
    train_set, eval_set = load_data(script_args)
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

    from dapo_trl.toy import build_char_tokenizer, build_tiny_model, warmup_sft

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

    trainer = DAPOTrainer(
        model=model, reward_funcs=rewards(), args=training_args, train_dataset=train_set, processing_class=tokenizer
    )
    rl_started = time.perf_counter()
    trainer.train()
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
    trainer = DAPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=rewards(),
        args=training_args,
        train_dataset=train_set,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
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
    from dapo_trl.evaluation import sample_completions

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
    """Save the model, the metrics log, the curves and the summary; print the summary on one screen."""
    out = trainer.args.output_dir
    trainer.save_model(out)
    if not trainer.accelerator.is_main_process:
        return
    save_log_history(trainer.state.log_history, os.path.join(out, "metrics.jsonl"))
    try:
        plot_training_curves(
            trainer.state.log_history, os.path.join(out, "training_curves.png"), title=summary["task"]
        )
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'dapo-trl[plot]'): no training_curves.png")
    summary["diagnoses"] = [d.to_dict() for d in fired_diagnoses(trainer)]
    with open(os.path.join(out, "eval_summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
    print(format_summary(trainer, summary))


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
    main()
