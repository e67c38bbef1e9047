import re

import pytest
import torch
from transformers import AutoTokenizer

from dapo_trl.run.toy import (
    LEVELS,
    accuracy_report,
    build_char_tokenizer,
    build_tiny_model,
    extract_int_answer,
    format_prompt,
    format_target,
    is_correct,
    is_test_problem,
    make_math_dataset,
    sampled_accuracy,
    toy_reward,
    warmup_sft,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and model
# ---------------------------------------------------------------------------------------------------------------------


def test_tokenizer_round_trip(tokenizer):
    text = "What is 47+38?\nRev: 58\nAnswer: 85\n\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character, newlines included
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id not in ids
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert encode("aéb") == encode("ab")  # outside the vocabulary: dropped


def test_tokenizer_specials_and_left_padding(tokenizer):
    assert tokenizer.padding_side == "left"
    assert {tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token} == {"<pad>", "<eos>", "<bos>"}
    assert len({tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id}) == 3
    batch = tokenizer(["1+1", "12+1"], padding=True, add_special_tokens=False)
    assert batch["input_ids"][0][0] == tokenizer.pad_token_id and batch["attention_mask"][0] == [0, 1, 1, 1]
    ids = tokenizer("Answer: 2", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Answer: 2"


def test_tokenizer_ids_are_one_per_character_in_vocabulary_order(tokenizer):
    from dapo_trl.run.toy import DEFAULT_CHARS

    assert len(tokenizer) == 4 + len(DEFAULT_CHARS)
    specials = [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id]
    assert specials == [0, 1, 2, 3]
    assert tokenizer(DEFAULT_CHARS, add_special_tokens=False)["input_ids"] == list(range(4, 4 + len(DEFAULT_CHARS)))


def test_tokenizer_reloads_as_itself_next_to_the_model(tokenizer, tmp_path):
    """A run folder holds the Qwen2 model's config.json, which makes AutoTokenizer pick Qwen2Tokenizer."""
    build_tiny_model(tokenizer, hidden_size=32, num_heads=2).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert type(reloaded) is type(tokenizer)
    text = "What is 47+38?\nRev: 58\nAnswer: 85\n\n  $x^2$ {a}, 'b'"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"]) == text
    assert (reloaded.padding_side, reloaded.pad_token_id, reloaded.eos_token_id) == ("left", 0, 1)


def test_tokenizer_save_and_reload(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "What is 9+9?\nAnswer: 18"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.padding_side == "left"
    assert reloaded.eos_token_id == tokenizer.eos_token_id and reloaded.pad_token_id == tokenizer.pad_token_id
    assert len(reloaded) == len(tokenizer)


def test_tiny_model_size_and_seed(tokenizer):
    model = build_tiny_model(tokenizer, seed=3)
    n_params = sum(p.numel() for p in model.parameters())
    assert 0.2e6 < n_params < 1e6
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    small = {"hidden_size": 32, "num_layers": 1}
    first = next(build_tiny_model(tokenizer, seed=3, **small).parameters())
    assert torch.equal(first, next(build_tiny_model(tokenizer, seed=3, **small).parameters()))
    assert not torch.equal(first, next(build_tiny_model(tokenizer, seed=4, **small).parameters()))
    ids = torch.tensor([tokenizer("What is 1+1?\n")["input_ids"]])
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tokenizer))


# ---------------------------------------------------------------------------------------------------------------------
# Task
# ---------------------------------------------------------------------------------------------------------------------


def test_dataset_is_deterministic_by_seed():
    a = make_math_dataset(200, seed=1)
    b = make_math_dataset(200, seed=1)
    c = make_math_dataset(200, seed=2)
    assert a.to_dict() == b.to_dict()
    assert a["prompt"] != c["prompt"]
    assert a.column_names == ["prompt", "answer", "target", "difficulty"]


def test_train_and_test_never_overlap():
    train = set(make_math_dataset(1500, seed=0)["prompt"]) | set(make_math_dataset(1500, seed=1)["prompt"])
    test = set(make_math_dataset(300, seed=0, split="test")["prompt"])
    assert not train & test
    assert all(is_test_problem(p) for p in test) and not any(is_test_problem(p) for p in train)
    with pytest.raises(ValueError, match="split"):
        make_math_dataset(5, split="validation")


_PROMPT = re.compile(r"What is (\d+)([+-])(\d+)\?\n")


@pytest.mark.parametrize("ops", ["+", "-", "+-"])
def test_answers_targets_and_difficulty(ops):
    ds = make_math_dataset(300, seed=0, ops=ops, level_weights=(1, 1, 1, 1, 1), work_prob=0.5)
    assert set(ds["difficulty"]) == set(range(len(LEVELS)))
    for row in ds:
        a, op, b = _PROMPT.fullmatch(row["prompt"]).groups()
        assert op in ops
        value = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert value >= 0 and row["answer"] == str(value)
        assert (len(a), len(b)) == LEVELS[row["difficulty"]] or op == "-"  # "-" may swap the operands
        lines = row["target"].split("\n")
        assert lines[-1] == f"Answer: {value}"  # DAPO's answer format: the last line
        if len(lines) == 2:
            assert lines[0] == f"Rev: {str(value)[::-1]}"
        assert is_correct(row["target"], row["answer"])
    with_work = sum("\n" in t for t in ds["target"])
    assert 90 < with_work < 210  # work_prob=0.5 of 300
    # distinct where the level holds enough problems (one-digit subtraction has only ~45 train problems)
    multi_digit = [p for p, d in zip(ds["prompt"], ds["difficulty"]) if d > 0]
    assert len(set(multi_digit)) == len(multi_digit)


def test_small_levels_allow_repeats_instead_of_looping():
    ds = make_math_dataset(400, seed=0, level_weights=(1, 0, 0, 0, 0))  # only ~80 one-digit train problems
    assert len(ds) == 400 and len(set(ds["prompt"])) < 100


def test_work_prob_extremes():
    assert not any("Rev:" in t for t in make_math_dataset(50, seed=0, work_prob=0.0)["target"])
    assert all("Rev:" in t for t in make_math_dataset(50, seed=0, work_prob=1.0)["target"])


def test_bad_task_arguments():
    with pytest.raises(ValueError, match="level_weights"):
        make_math_dataset(5, level_weights=(1, 1))
    with pytest.raises(ValueError, match="ops"):
        make_math_dataset(5, ops="*")


def test_format_helpers():
    assert format_prompt(47, "+", 38) == "What is 47+38?\n"
    assert format_target(47, "+", 38, work=False) == "Answer: 85"
    assert format_target(100, "-", 1, work=True) == "Rev: 99\nAnswer: 99"


def test_scoring():
    assert extract_int_answer("Rev: 58\nAnswer: 85") == 85
    assert extract_int_answer("Answer: 85\n\n") == 85
    assert extract_int_answer("Answer: 85 apples") is None
    assert extract_int_answer("Answer: 85\nRev: 58") is None  # not the last line
    assert extract_int_answer("") is None
    assert is_correct("Answer: 085", "85")
    assert not is_correct("Answer: 86", "85")
    assert toy_reward(["Answer: 5", "Answer: 4", [{"role": "assistant", "content": "Answer: 5"}]], ["5"] * 3) == [
        1.0,
        -1.0,
        1.0,
    ]


# ---------------------------------------------------------------------------------------------------------------------
# Measurement (untrained model: only the plumbing)
# ---------------------------------------------------------------------------------------------------------------------


def test_sampled_accuracy_uses_the_scorer(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    ds = make_math_dataset(6, seed=0, split="test")
    kwargs = {"num_samples": 2, "max_new_tokens": 4, "batch_size": 4}
    assert sampled_accuracy(model, tokenizer, ds, scorer=lambda c, a: True, **kwargs) == 1.0
    assert sampled_accuracy(model, tokenizer, ds, scorer=lambda c, a: False, **kwargs) == 0.0
    seen = []
    sampled_accuracy(model, tokenizer, ds, scorer=lambda c, a: seen.append((c, a)) or True, **kwargs)
    assert len(seen) == 12 and [a for _, a in seen[::2]] == ds["answer"]
    assert all(len(tokenizer(c, add_special_tokens=False)["input_ids"]) <= 4 for c, _ in seen)


def test_accuracy_report_is_seeded(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    ds = make_math_dataset(8, seed=0, split="test")
    r1 = accuracy_report(model, tokenizer, ds, num_samples=2, max_new_tokens=6, seed=5)
    r2 = accuracy_report(model, tokenizer, ds, num_samples=2, max_new_tokens=6, seed=5)
    assert r1 == r2
    assert r1["accuracy"] == 0.0 and r1["frac_all_wrong"] == 1.0  # random weights never answer
    assert {f"accuracy/level_{d}" for d in set(ds["difficulty"])} <= set(r1)


# ---------------------------------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_warmup_sft_learns_the_format(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=64, seed=0)
    ds = make_math_dataset(500, seed=0)
    losses = warmup_sft(model, tokenizer, ds, steps=120, batch_size=32, lr=3e-3, seed=0, progress=False)
    assert len(losses) == 120
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    report = accuracy_report(model, tokenizer, make_math_dataset(32, seed=0, split="test"), num_samples=2)
    assert report["truncated_frac"] < 0.2  # it ends with an "Answer:" line
    assert not model.training


@pytest.mark.integration
def test_warmup_sft_stops_early_once_accurate(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    ds = make_math_dataset(100, seed=0)
    kwargs = {
        "steps": 50,
        "batch_size": 8,
        "check_every": 5,
        "check_prompts": 4,
        "check_samples": 1,
        "progress": False,
    }
    assert len(warmup_sft(model, tokenizer, ds, stop_accuracy=0.0, **kwargs)) == 5  # any accuracy is >= 0
    assert len(warmup_sft(model, tokenizer, ds, stop_accuracy=1.01, **kwargs)) == 50  # never reached
    assert len(warmup_sft(model, tokenizer, ds, stop_accuracy=None, **kwargs)) == 50


@pytest.mark.integration
def test_warmup_sft_needs_targets(tokenizer):
    from datasets import Dataset

    with pytest.raises(ValueError, match="target"):
        warmup_sft(build_tiny_model(tokenizer), tokenizer, Dataset.from_dict({"prompt": ["x"]}), steps=1)


@pytest.mark.slow
@pytest.mark.integration
def test_warmup_then_grpo_raises_held_out_accuracy(tokenizer, tmp_path):
    """The demo's premise, with TRL's own GRPOTrainer in DAPO-like settings (~3 min on 2 cores)."""
    from trl import GRPOConfig, GRPOTrainer

    model = build_tiny_model(tokenizer, seed=0)
    warmup_sft(model, tokenizer, make_math_dataset(20000, seed=0), steps=1200, seed=0, progress=False)
    test = make_math_dataset(256, seed=0, split="test")
    before = sampled_accuracy(model, tokenizer, test, max_new_tokens=28)
    assert 0.2 < before < 0.7  # the mixed regime: groups are informative
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        learning_rate=1e-4,
        lr_scheduler_type="constant",
        loss_type="dapo",
        epsilon_high=0.28,
        beta=0.0,
        num_generations=8,
        per_device_train_batch_size=64,
        steps_per_generation=4,
        max_completion_length=28,
        max_steps=300,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=toy_reward,
        args=args,
        train_dataset=make_math_dataset(4000, seed=1),
        processing_class=tokenizer,
    )
    trainer.train()
    after = sampled_accuracy(trainer.model, tokenizer, test, max_new_tokens=28)
    assert after > before + 0.03


def test_public_tiny_model_and_tokenizer_builds_saves_and_reloads(tmp_path):
    """`dapo_trl.tiny_model_and_tokenizer`: the offline pair a first script starts from, loadable by path."""
    import doctest

    from transformers import AutoModelForCausalLM

    import dapo_trl
    from dapo_trl.run import toy

    assert "tiny_model_and_tokenizer" in dapo_trl.__all__
    assert doctest.testmod(toy).failed == 0
    model, tokenizer = dapo_trl.tiny_model_and_tokenizer(str(tmp_path / "tiny"), seed=1)
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "tiny"))
    assert AutoTokenizer.from_pretrained(str(tmp_path / "tiny")).decode(tokenizer("1+2?\n")["input_ids"]) == "1+2?\n"
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)
