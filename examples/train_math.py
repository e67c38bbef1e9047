"""Train a causal LM to answer math problems with DAPO (arXiv 2503.14476).

With no arguments it runs the embedded CPU demo: a tiny model and tokenizer built locally (nothing is downloaded), a
synthetic arithmetic task in the DAPO answer format, a short supervised warm-up until sampled accuracy is mixed, then
the full DAPO recipe. Everything else comes from a YAML (`--config`) or the command line: every `ScriptArguments`,
`DAPOConfig` and `ModelConfig` field is a flag.

Launch:
```
accelerate launch examples/train_math.py                                              # CPU demo (embedded default)
accelerate launch examples/train_math.py --config configs/cpu_demo.yaml               # the same, from YAML
accelerate launch examples/train_math.py --config configs/smoke.yaml                  # seconds, for a quick check
# one GPU, vLLM colocated
accelerate launch examples/train_math.py --config configs/dapo_qwen2.5_1.5b.yaml --vllm_mode colocate
# one 8-GPU node: a vLLM server on GPU 7, training on GPUs 0-6
CUDA_VISIBLE_DEVICES=7 trl vllm-serve --model Qwen/Qwen2.5-7B &
CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6 accelerate launch --config_file configs/accelerate/zero2.yaml --num_processes 7 \
    examples/train_math.py --config configs/dapo_qwen2.5_7b.yaml
```
Multi-node: `python -m dapo_trl.launch slurm|env ... examples/train_math.py ...` on every node builds the
`accelerate launch --num_machines N --machine_rank R --main_process_ip HOST ...` line from the scheduler's variables;
examples/slurm/ and examples/kubernetes/ are complete recipes (vLLM server on its own node, `--auto_resume true` so
that a preempted run restarts from its newest complete checkpoint).

Departures from the paper in the CPU demo (the GPU configs follow §4.1): a 0.4M-parameter model instead of
Qwen2.5-32B, a synthetic task instead of DAPO-Math-17k, a supervised warm-up first (from random weights every group
is all-wrong and nothing can be learned), 8 samples per prompt instead of 16, and a learning rate suited to a tiny
model (1e-6 would not move it).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field

import torch
from trl import ModelConfig, ScriptArguments, TrlParser, get_peft_config

from dapo_trl import DAPOConfig, DAPOTrainer, MathVerifierReward
from dapo_trl.diagnostics import fired_diagnoses
from dapo_trl.plotting import plot_training_curves, save_log_history

logger = logging.getLogger("train_math")


@dataclass
class MathScriptArguments(ScriptArguments):
    """Data and evaluation settings. Without `dataset_name` and `model_name_or_path`, the CPU demo runs."""

    dataset_name: str | None = field(default=None, metadata={"help": "Hub id or local file of the training set."})
    prompt_column: str | None = field(default=None, metadata={"help": "Prompt/problem column (format default)."})
    answer_column: str | None = field(default=None, metadata={"help": "Answer column; dotted paths read dicts."})
    conversational: bool = field(default=False, metadata={"help": "Build chat-message prompts from raw problems."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    eval_dataset_name: str | None = field(
        default=None, metadata={"help": "Evaluation set, e.g. HuggingFaceH4/aime_2024."}
    )
    eval_split: str = field(default="train", metadata={"help": "Split of the evaluation set."})
    eval_k: int = field(default=32, metadata={"help": "Samples per problem for avg@k / pass@k / maj@k (paper: 32)."})
    eval_temperature: float = field(default=1.0, metadata={"help": "Evaluation temperature (paper: 1.0)."})
    eval_top_p: float = field(default=0.7, metadata={"help": "Evaluation top-p (paper: 0.7)."})
    eval_max_samples: int | None = field(default=None, metadata={"help": "Evaluate on the first N problems."})
    # CPU demo only
    demo_train_size: int = field(default=4000, metadata={"help": "Demo: synthetic training problems."})
    demo_test_size: int = field(default=200, metadata={"help": "Demo: held-out problems."})
    demo_sft_steps: int = field(default=1200, metadata={"help": "Demo: supervised warm-up steps."})
    demo_eval_samples: int = field(default=4, metadata={"help": "Demo: samples per held-out problem."})


# The embedded CPU default (configs/cpu_demo.yaml holds the same values).
CPU_DEMO: dict = {
    "output_dir": "outputs/cpu-demo",
    "use_cpu": True,
    "bf16": False,
    "gradient_checkpointing": False,
    "ddp_find_unused_parameters": False,
    "report_to": "none",
    "seed": 0,
    "logging_steps": 10,
    "save_strategy": "no",
    "log_completions": False,
    # rollout: 32 prompts x 8 samples per generation batch, 4 updates of 64 rows each
    "max_steps": 300,
    "num_generations": 8,
    "per_device_train_batch_size": 64,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 4,  # > gradient_accumulation_steps: the ratio moves, so clip-higher acts
    "temperature": 1.0,
    "top_p": 1.0,
    "max_completion_length": 28,  # the longest well-formed completion is 21 tokens
    "overlong_buffer_len": 7,
    "overlong_penalty_factor": 1.0,
    "epsilon": 0.2,
    "epsilon_high": 0.28,
    "beta": 0.0,
    "loss_type": "dapo",
    "dynamic_sampling": True,
    "dynamic_sampling_max_rounds": 4,
    "dynamic_sampling_on_exhausted": "train",
    "learning_rate": 1e-4,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "demo_train_size": 20000,
    "demo_test_size": 256,
    "demo_sft_steps": 1200,
    "demo_eval_samples": 8,
}


def parse_args(argv: list[str] | None = None):
    parser = TrlParser((MathScriptArguments, DAPOConfig, ModelConfig))
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        return parser.parse_dict(CPU_DEMO)
    return parser.parse_args_and_config(argv)


def main(argv: list[str] | None = None) -> dict:
    script_args, training_args, model_args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if script_args.dataset_name is None and model_args.model_name_or_path is None:
        return run_demo(script_args, training_args)
    return run_real(script_args, training_args, model_args)


# --------------------------------------------------------------------------------------------------------- CPU demo


def run_demo(script_args: MathScriptArguments, training_args: DAPOConfig) -> dict:
    from dapo_trl.toy import accuracy_report, build_char_tokenizer, build_tiny_model, make_math_dataset, warmup_sft

    torch.manual_seed(training_args.seed)
    if not torch.cuda.is_available():
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started = time.perf_counter()
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, seed=training_args.seed)
    train_set = make_math_dataset(script_args.demo_train_size, seed=training_args.seed)
    test_set = make_math_dataset(script_args.demo_test_size, seed=training_args.seed, split="test")

    warmup_sft(model, tokenizer, train_set, steps=script_args.demo_sft_steps, seed=training_args.seed)
    warmup_seconds = time.perf_counter() - started
    measure = dict(
        num_samples=script_args.demo_eval_samples,
        max_new_tokens=training_args.max_completion_length,
        seed=training_args.seed,
    )
    before = accuracy_report(model, tokenizer, test_set, **measure)
    logger.info(f"after warm-up: held-out sampled accuracy {before['accuracy']:.3f}")

    trainer = DAPOTrainer(
        model=model,
        reward_funcs=MathVerifierReward(answer_column="answer"),
        args=training_args,
        train_dataset=train_set,
        processing_class=tokenizer,
    )
    rl_started = time.perf_counter()
    trainer.train()
    rl_seconds = time.perf_counter() - rl_started
    after = accuracy_report(trainer.model, tokenizer, test_set, **measure)

    summary = {
        "task": "synthetic arithmetic (CPU demo)",
        "accuracy_before_rl": before["accuracy"],
        "accuracy_after_rl": after["accuracy"],
        "before": before,
        "after": after,
        "warmup_seconds": round(warmup_seconds, 1),
        "rl_seconds": round(rl_seconds, 1),
        "optimizer_steps": trainer.state.global_step,
    }
    finish(trainer, summary)
    return summary


# --------------------------------------------------------------------------------------------------------- real data


def run_real(script_args: MathScriptArguments, training_args: DAPOConfig, model_args: ModelConfig) -> dict:
    from dapo_trl.data import load_math_dataset
    from dapo_trl.evaluation import evaluate

    if script_args.dataset_name is None or model_args.model_name_or_path is None:
        raise ValueError("Give both --model_name_or_path and --dataset_name (or neither, for the CPU demo).")
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "attn_implementation": model_args.attn_implementation,
        "dtype": dtype,
        **(training_args.model_init_kwargs or {}),
    }
    train_set = load_math_dataset(
        script_args.dataset_name,
        split=script_args.dataset_train_split,
        config_name=script_args.dataset_config,
        prompt_column=script_args.prompt_column,
        answer_column=script_args.answer_column,
        conversational=script_args.conversational,
        max_samples=script_args.max_train_samples,
    )
    trainer = DAPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=MathVerifierReward(answer_column="answer"),
        args=training_args,
        train_dataset=train_set,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    summary: dict = {"task": script_args.dataset_name, "optimizer_steps": trainer.state.global_step}
    if script_args.eval_dataset_name:
        eval_set = load_math_dataset(
            script_args.eval_dataset_name,
            split=script_args.eval_split,
            conversational=script_args.conversational,
            max_samples=script_args.eval_max_samples,
        )
        summary["eval"] = evaluate(
            trainer.model,
            eval_set,
            k=script_args.eval_k,
            temperature=script_args.eval_temperature,
            top_p=script_args.eval_top_p,
            max_new_tokens=training_args.max_completion_length,
            tokenizer=trainer.processing_class,
        )
    finish(trainer, summary)
    return summary


def finish(trainer: DAPOTrainer, summary: dict) -> None:
    """Save the model, the metrics log, the curves and the summary; print the summary on one screen."""
    out = trainer.args.output_dir
    trainer.save_model(out)  # every process calls it (ZeRO-3 gathers the weights); the Trainer writes once
    if not trainer.accelerator.is_main_process:  # the global main only: the nodes may share one filesystem
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
    history = trainer.state.log_history
    last = {k: v for entry in history for k, v in entry.items()}
    lines = ["", "=" * 72, f"dapo-trl: {summary['task']}", "-" * 72]
    if "accuracy_before_rl" in summary:
        lines.append(
            f"held-out sampled accuracy   {summary['accuracy_before_rl']:.3f} -> {summary['accuracy_after_rl']:.3f}"
            f"   (after warm-up -> after DAPO)"
        )
        lines.append(
            f"time                        warm-up {summary['warmup_seconds']}s, DAPO {summary['rl_seconds']}s"
        )
    for name, value in summary.get("eval", {}).items():
        if isinstance(value, float):
            lines.append(f"{name:<28}{value:.4f}")
    lines.append(f"optimizer steps             {summary['optimizer_steps']}")
    for key in (
        "dynamic_sampling/informative_frac",
        "dynamic_sampling/rounds",
        "dynamic_sampling/prompts_consumed",
        "entropy",
        "clip_ratio/high_mean",
        "completions/mean_length",
    ):
        if key in last and last[key] is not None:
            lines.append(f"{key:<36}{last[key]:.4g}   (last logged)")
    diagnoses = fired_diagnoses(trainer)
    lines.append(f"diagnoses fired             {len(diagnoses)}")
    lines.extend(f"  step {d.step:<6} {d.name}: {d.symptom}" for d in diagnoses)
    lines.append(f"outputs                     {trainer.args.output_dir}")
    lines.append("=" * 72)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
