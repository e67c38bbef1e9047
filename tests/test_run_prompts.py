"""
A run evaluates its model on the prompts it trained on: training, the before/after held-out check, the final
evaluation and `python -m dapo_trl.evaluation` give the model byte-identical prompt tokens for the same rows.

The run here reads a file with a `question` column as `dataset_format: columns` (configs/smollm2_cpu.yaml's way: no DAPO
template), as chat messages with a system prompt. Read with the default `auto` format, the same file would become
format `question`, whose prompts the DAPO template wraps: a prompt the model never trained on.
"""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def load_example():
    spec = importlib.util.spec_from_file_location("train_math_prompts", ROOT / "examples" / "train_math.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class PromptSpy:
    """Records the prompt token ids of every `generate` call (left padding removed), under the current phase."""

    def __init__(self, monkeypatch):
        from transformers.generation.utils import GenerationMixin

        self.phase = "setup"
        self.seen: dict[str, set[tuple[int, ...]]] = {}
        generate = GenerationMixin.generate

        def spy(model, *args, **kwargs):
            ids, mask = kwargs.get("input_ids", args[0] if args else None), kwargs.get("attention_mask")
            rows = self.seen.setdefault(self.phase, set())
            for row, keep in zip(ids.tolist(), mask.tolist(), strict=True):
                rows.add(tuple(token for token, kept in zip(row, keep, strict=True) if kept))
            return generate(model, *args, **kwargs)

        monkeypatch.setattr(GenerationMixin, "generate", spy)

    def during(self, phase: str, function):
        def wrapped(*args, **kwargs):
            previous, self.phase = self.phase, phase
            try:
                return function(*args, **kwargs)
            finally:
                self.phase = previous

        return wrapped


@pytest.mark.integration
def test_training_the_heldout_check_the_final_evaluation_and_the_cli_see_identical_prompts(tmp_path, monkeypatch):
    from dapo_trl import DAPOTrainer, tiny_model_and_tokenizer
    from dapo_trl.run import heldout as heldout_module
    from dapo_trl.run.evaluation import main as evaluation_main

    train_math = load_example()
    model_dir = tmp_path / "model"
    _, tokenizer = tiny_model_and_tokenizer(str(model_dir), hidden_size=32)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(model_dir)
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
    data = tmp_path / "problems.jsonl"
    data.write_text("\n".join(json.dumps(row) for row in rows) + "\n")

    spy = PromptSpy(monkeypatch)
    monkeypatch.setattr(DAPOTrainer, "train", spy.during("training", DAPOTrainer.train))
    evaluations = iter(["held-out check before RL", "held-out check after RL (the final evaluation)"])
    evaluation = heldout_module.heldout_evaluation
    monkeypatch.setattr(
        heldout_module,
        "heldout_evaluation",
        lambda *args, **kwargs: spy.during(next(evaluations), evaluation)(*args, **kwargs),
    )
    out = tmp_path / "run"
    summary = train_math.main(
        [
            "--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--eval_dataset_name", str(data),
            "--dataset_format", "columns", "--prompt_column", "question", "--answer_column", "answer",
            "--conversational", "true", "--system_prompt", "Solve it.", "--eval_before_rl", "true",
            "--eval_k", "1", "--output_dir", str(out), "--use_cpu", "true", "--bf16", "false",
            "--activation_checkpointing", "false", "--report_to", "none", "--max_steps", "1",
            "--num_generations", "4", "--per_device_train_batch_size", "32", "--max_completion_length", "4",
            "--overlong_buffer_len", "1", "--dynamic_sampling", "false", "--save_strategy", "no", "--dtype", "float32",
        ]
    )  # fmt: skip
    spy.phase = "evaluation CLI"
    evaluation_main(["--model", str(out), "--dataset", str(data)])

    training = spy.seen["training"]
    assert len(training) == len(rows)  # one rollout of all 8 prompts
    decoded = tokenizer.decode(next(iter(training)))
    assert decoded.startswith("system: Solve it.\nuser: What is") and "Solve the following" not in decoded
    for phase in ("held-out check before RL", "held-out check after RL (the final evaluation)", "evaluation CLI"):
        assert spy.seen[phase] == training, phase
    record = json.loads((out / "dapo_run.json").read_text())
    assert record["data_format"] == {
        "dataset_format": "columns",
        "prompt_column": "question",
        "answer_column": "answer",
    }
    assert summary["heldout"]["n"] == len(rows) and summary["heldout"]["sampling"] == "temperature 1, top-p 0.7, k=1"
