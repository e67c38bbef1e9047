"""
One prompt format for training and evaluation: for the same data row, the prompt TRL's trainer tokenises for
training (examples/train_math.py's loader, then GRPOTrainer._tokenize_prompts) and the prompt the evaluation command
line feeds to `generate` (reading the run record) are the same tokens, with and without a chat template.
"""

import json

import pytest
import torch
from test_launch_lines import train_math

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_run_folder(tmp_path, *, chat_template: str | None):
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model

    model_dir = tmp_path / "run"
    tokenizer = build_char_tokenizer()
    if chat_template:
        tokenizer.chat_template = chat_template
    # a context long enough for DAPO's template (the trainer refuses prompts the model cannot read)
    build_tiny_model(tokenizer, hidden_size=32, num_heads=2, max_position_embeddings=512).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "data.jsonl"
    rows = [{"problem": "What is 2+3?", "answer": "5"}, {"problem": "What is 10+7?", "answer": "17"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return model_dir, data


def training_prompt_ids(model_dir, data, tmp_path, flags) -> list[list[int]]:
    """What the trainer feeds to generation for each row, through train_math.py's own loading path."""
    from dapo_trl import DAPOTrainer
    from dapo_trl.run.run_record import write_run_record
    from dapo_trl.run.toy import toy_reward

    argv = [
        "--model_name_or_path", str(model_dir), "--dataset_name", str(data), "--output_dir", str(model_dir),
        "--use_cpu", "true", "--bf16", "false", "--report_to", "none", "--num_generations", "2",
        "--per_device_train_batch_size", "2", "--max_completion_length", "4", *flags,
    ]  # fmt: skip
    script_args, training_args, _ = train_math.parse_args(argv)
    write_run_record(training_args.output_dir, train_math.make_run_record(script_args, training_args))
    dataset = train_math.load_training_set(script_args)
    trainer = DAPOTrainer(model=str(model_dir), reward_funcs=toy_reward, args=training_args, train_dataset=dataset)
    prompt_ids, _, _ = trainer._tokenize_prompts(list(dataset["prompt"]))
    return [list(ids) for ids in prompt_ids], trainer.processing_class


def evaluation_prompt_ids(model_dir, data, monkeypatch) -> list[list[int]]:
    """What `python -m dapo_trl.evaluation --model RUN --dataset DATA` feeds to `generate` for each row."""
    from transformers import Qwen2ForCausalLM

    from dapo_trl.run.evaluation import main

    seen = []

    def fake_generate(self, input_ids, attention_mask, **kwargs):
        seen.extend(ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask, strict=True))
        return torch.cat([input_ids, torch.full_like(input_ids[:, :1], kwargs["eos_token_id"])], dim=1)

    monkeypatch.setattr(Qwen2ForCausalLM, "generate", fake_generate)
    main(["--model", str(model_dir), "--dataset", str(data), "--k", "1", "--backend", "transformers"])
    return seen


@pytest.mark.integration
@pytest.mark.parametrize(
    ("chat_template", "flags"),
    [
        (None, []),  # plain text: the default, and the CPU demo
        (CHAT_TEMPLATE, []),  # the tokenizer has a chat template, but the run trained on plain text
        (CHAT_TEMPLATE, ["--conversational", "true"]),  # the Qwen recipes: the chat template, as verl
        (CHAT_TEMPLATE, ["--conversational", "true", "--system_prompt", "Be brief."]),
        (None, ["--system_prompt", "Be brief."]),
        (CHAT_TEMPLATE, ["--conversational", "true", "--max_prompt_length", "40"]),  # cut as verl: keep the end
        (None, ["--max_prompt_length", "40", "--prompt_truncation_side", "right"]),
    ],
    ids=["plain", "template-unused", "chat", "chat-system", "plain-system", "chat-cut-left", "plain-cut-right"],
)
def test_training_and_evaluation_prompts_are_identical(tmp_path, monkeypatch, chat_template, flags):
    model_dir, data = build_run_folder(tmp_path, chat_template=chat_template)
    trained, tokenizer = training_prompt_ids(model_dir, data, tmp_path, flags)
    evaluated = evaluation_prompt_ids(model_dir, data, monkeypatch)
    assert evaluated == trained
    texts = [tokenizer.decode(ids) for ids in trained]
    if "--max_prompt_length" in flags:
        assert all(len(ids) == 40 for ids in trained)
        assert texts[0].endswith("<|assistant|>") if "--conversational" in flags else texts[0].startswith("Solve")
        return
    assert "What is 2+3?" in texts[0] and "Answer:" in texts[0]  # DAPO's template around the problem
    assert texts[0].endswith("<|assistant|>") == ("--conversational" in flags)
    assert ("Be brief." in texts[0]) == ("--system_prompt" in flags)
