"""
What a training run writes next to its model so that evaluation reads the model the way it was trained.

`examples/train_math.py` writes `dapo_run.json` into its output folder before training:

- `data_format`: how prompts and answers were read from a data file (`load_math_dataset`'s `dataset_format`,
  `prompt_column`, `answer_column`), so that a held-out file is read as the training file was (with or without the
  DAPO template);
- `prompt_format`: how a dataset row's prompt became model input: plain text tokenised as it is, or chat messages
  through the tokenizer's chat template (with the run's `chat_template_kwargs`), the system prompt if any, and the
  prompt-length limit;
- `evaluation`: the sampling settings of the run's own evaluation (k, temperature, top-p, new-token limit, batch size,
  seed, reward rule), so that `python -m dapo_trl.evaluation --model RUN_FOLDER` measures what the run measured;
- `heldout`: for the CPU demo, the name of the held-out file written next to it.

At the end of a run, [`save_run_outputs`] writes the rest of the folder: the model, `metrics.jsonl`,
`training_curves.png` and `eval_summary.json`.

`python -m dapo_trl.evaluation` reads it from the model folder, or from the folder above (a `checkpoint-N` inside the
run folder), and uses it for every setting not given on its command line.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

RUN_RECORD_FILE = "dapo_run.json"


@dataclass
class DataFormat:
    """
    How the run read its rows (see `dapo_trl.run.data.load_math_dataset`); held-out files are read the same way.

    Args:
        dataset_format (`str`, *optional*, defaults to `"auto"`):
            The format asked for (`"auto"`: the columns decide). It decides whether the DAPO template wraps the prompt.
        prompt_column (`str`, *optional*), answer_column (`str`, *optional*):
            The columns asked for; `None` is the format's default.
    """

    dataset_format: str = "auto"
    prompt_column: str | None = None
    answer_column: str | None = None

    def loader_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `load_math_dataset` that read a file as the run did."""
        return asdict(self)


@dataclass
class PromptFormat:
    """
    How training turned a row's prompt into model input; evaluation must do the same.

    Args:
        conversational (`bool`, *optional*, defaults to `False`):
            Prompts were chat messages rendered with the tokenizer's chat template (with a generation prompt), as
            verl does; otherwise plain text tokenised as it is.
        system_prompt (`str`, *optional*):
            A system message before the user message (conversational), or text before the prompt (plain).
        chat_template_kwargs (`dict`, *optional*):
            Extra keyword arguments of `apply_chat_template` (TRL's `chat_template_kwargs`).
        max_prompt_length (`int`, *optional*), prompt_truncation_side (`str`, *optional*, defaults to `"left"`):
            How long prompts were cut, in tokens after the chat template (DAPOConfig's settings of the same names).
    """

    conversational: bool = False
    system_prompt: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_prompt_length: int | None = None
    prompt_truncation_side: str = "left"

    def describe(self) -> str:
        kind = "chat template" if self.conversational else "plain text, no chat template"
        return kind + (", with a system prompt" if self.system_prompt else "")


@dataclass
class EvalSettings:
    """
    Sampling settings of a run's own evaluation (see `dapo_trl.evaluation.evaluate`).

    `temperature=0` is greedy decoding. `backend` is `"vllm"` when the run generated with vLLM (the evaluation then
    samples with vLLM where it is installed), with the engine's `vllm_dtype`; else `"transformers"`.
    """

    k: int
    temperature: float
    top_p: float
    max_new_tokens: int
    batch_size: int = 8
    seed: int | None = 0
    reward_rule: str = "equivalence"
    backend: str = "transformers"
    vllm_dtype: str | None = None

    def describe(self) -> str:
        """How the completions are drawn, in words: `"greedy, k=1"`, `"temperature 1.0, top-p 0.7, k=4"`."""
        if self.temperature == 0:
            return f"greedy, k={self.k}"
        top_p = f", top-p {self.top_p:g}" if self.top_p < 1 else ""
        return f"temperature {self.temperature:g}{top_p}, k={self.k}"


@dataclass
class RunRecord:
    prompt_format: PromptFormat
    evaluation: EvalSettings
    heldout: str | None = None
    data_format: DataFormat = field(default_factory=DataFormat)
    path: str | None = field(default=None, compare=False)  # where it was read from

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("path")
        return out


def write_run_record(output_dir: str, record: RunRecord) -> str:
    """Write `record` as `output_dir/dapo_run.json` and return the file's path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, RUN_RECORD_FILE)
    with open(path, "w") as f:
        json.dump(record.to_dict(), f, indent=2)
        f.write("\n")
    return path


def save_run_outputs(trainer: Any, summary: dict[str, Any]) -> bool:
    """
    Save the end of a run into `trainer.args.output_dir`: the model, and on the main process the metrics log
    (`metrics.jsonl`), the curves (`training_curves.png`, when matplotlib is installed) and `eval_summary.json`
    (`summary`, plotted under its `"task"` title, with the fired diagnoses added as `summary["diagnoses"]`).

    Every process must call it (under ZeRO-3 `save_model` gathers the weights from all of them).

    Returns:
        `bool`: whether this is the main process, the one that wrote the files and prints the summary.
    """
    from ..trainer.diagnostics import fired_diagnoses
    from .plotting import heldout_points, plot_training_curves, save_log_history

    out = trainer.args.output_dir
    trainer.save_model(out)  # every process calls it (ZeRO-3 gathers the weights); the Trainer writes once
    if not trainer.accelerator.is_main_process:  # the global main only: the nodes may share one filesystem
        return False
    save_log_history(trainer.state.log_history, os.path.join(out, "metrics.jsonl"))
    try:
        plot_training_curves(
            trainer.state.log_history,
            os.path.join(out, "training_curves.png"),
            title=summary["task"],
            heldout=heldout_points(summary, trainer.state.global_step),
        )
    except ImportError:
        logger.warning("matplotlib is not installed (pip install 'dapo-trl[plot]'): no training_curves.png")
    summary["diagnoses"] = [d.to_dict() for d in fired_diagnoses(trainer)]
    with open(os.path.join(out, "eval_summary.json"), "w") as f:
        json.dump(summary, f, indent=2, default=float)
    return True


def read_run_record(model_path: str) -> RunRecord | None:
    """
    The record of the run that produced `model_path` (its folder, or the folder above for a checkpoint), or `None`.

    Raises:
        `ValueError`: the file exists but is not a run record (the message names the file).
    """
    if not os.path.isdir(model_path):
        return None
    for folder in (model_path, os.path.dirname(os.path.abspath(model_path))):
        path = os.path.join(folder, RUN_RECORD_FILE)
        if os.path.isfile(path):
            return _parse(path)
    return None


def _parse(path: str) -> RunRecord:
    try:
        with open(path) as f:
            raw = json.load(f)
        return RunRecord(
            prompt_format=PromptFormat(**raw["prompt_format"]),
            evaluation=EvalSettings(**raw["evaluation"]),
            heldout=raw.get("heldout"),
            data_format=DataFormat(**raw.get("data_format", {})),  # absent from records of earlier versions
            path=path,
        )
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise ValueError(
            f"{path} is not a readable run record ({type(error).__name__}: {error}); delete it or pass every "
            "evaluation setting (--chat, --k, --temperature, --top_p, --max_new_tokens) on the command line."
        ) from None
