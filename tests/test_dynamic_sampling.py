"""Dynamic sampling inside DAPOTrainer on a tiny local model (CPU)."""

import logging

import pytest
import torch
from _tiny import KINDS, Recorder, ScriptedReward, config, logged, scripted_dataset, tiny_model_and_tokenizer

from dapo_trl.trainer.loss import trl_num_items_for_exact_normalizer, window_token_counts

pytestmark = pytest.mark.integration


def make_trainer(tmp_path, dataset=None, eval_dataset=None, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    args = config(tmp_path, **overrides)
    return Recorder(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=args,
        train_dataset=dataset if dataset is not None else scripted_dataset(),
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )


def prompt_kinds(trainer, batch):
    """Kind of each real (not masked-out padding) row's prompt, read back from the token ids."""
    texts = trainer.processing_class.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
    real = batch["advantages"] != 0
    return [KINDS[int(t.strip()[1:-1]) % len(KINDS)] for t, r in zip(texts, real) if r]


def test_only_informative_groups_reach_the_loss_in_exact_shapes(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=3, steps_per_generation=2, gradient_accumulation_steps=2)
    trainer.train()
    assert trainer.recorded, "nothing reached the loss"
    for batch in trainer.recorded:
        assert batch["completion_ids"].size(0) == trainer.args.per_device_train_batch_size
        assert set(prompt_kinds(trainer, batch)) == {"mixed"}
    # each generation batch holds target groups of G rows
    assert trainer._ds_target == trainer.args.generation_batch_size // trainer.num_generations
    assert logged(trainer, "dynamic_sampling/groups_trained") == [trainer._ds_target] * 3
    assert max(logged(trainer, "dynamic_sampling/informative_frac")) < 0.7  # 1/3 of prompts are mixed
    assert all(u == 0 for u in logged(trainer, "dynamic_sampling/underfilled"))


def test_token_normaliser_is_recomputed_on_the_filtered_batch(tmp_path):
    trainer = make_trainer(
        tmp_path, max_steps=2, steps_per_generation=4, gradient_accumulation_steps=2, per_device_train_batch_size=4
    )
    trainer.train()
    batches = trainer.recorded[:4]  # the first generation batch
    counts = [float(b["completion_mask"].sum()) for b in batches]
    windows = window_token_counts(counts, steps_per_generation=4, num_iterations=1, gradient_accumulation_steps=2)
    for batch, window in zip(batches, windows):
        expected = trl_num_items_for_exact_normalizer(window, steps_per_generation=4, gradient_accumulation_steps=2)
        assert batch["num_items_in_batch"].item() == pytest.approx(expected)


class VaryingPenalty:
    """Stands in for the overlong penalty with values that always vary within a group (as lengths would)."""

    __name__ = "overlong_penalty"

    def __call__(self, completions, **kwargs):
        return [-0.1 * (i % 3) for i in range(len(completions))]


class VaryingPenaltyTrainer(Recorder):
    def build_overlong_penalty(self):
        return VaryingPenalty()


def make_varying(tmp_path, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    return VaryingPenaltyTrainer(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=config(tmp_path, **overrides),
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )


def test_filter_uses_correctness_not_the_shaped_sum(tmp_path):
    trainer = make_varying(tmp_path, max_steps=2)
    trainer.train()
    assert max(logged(trainer, "overlong/penalty_mean")) < 0  # the stand-in penalty acted
    for batch in trainer.recorded:
        assert set(prompt_kinds(trainer, batch)) == {"mixed"}


def test_filter_on_total_lets_shaped_groups_through(tmp_path):
    trainer = make_varying(tmp_path, max_steps=2, dynamic_sampling_reward="total")
    trainer.train()
    kinds = {k for batch in trainer.recorded for k in prompt_kinds(trainer, batch)}
    assert kinds & {"easy", "hard"}, "the shaped sum varies in every group, so constant-correctness groups get in"


def test_unknown_filter_reward_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a reward function"):
        make_trainer(tmp_path, dynamic_sampling_reward="accuracy")


def test_exhausted_rounds_train_on_masked_batch_with_warning(tmp_path, caplog):
    dataset = scripted_dataset(kinds=("easy", "hard"))  # no informative group exists
    trainer = make_trainer(tmp_path, dataset=dataset, max_steps=1, dynamic_sampling_max_rounds=2)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "informative groups" in caplog.text
    assert logged(trainer, "dynamic_sampling/underfilled") == [1.0]
    assert logged(trainer, "dynamic_sampling/rounds") == [2.0]
    for batch in trainer.recorded:
        assert batch["completion_ids"].size(0) == trainer.args.per_device_train_batch_size
        assert batch["completion_mask"].sum() == 0 and batch["advantages"].abs().sum() == 0


def test_exhausted_rounds_raise_when_asked(tmp_path):
    dataset = scripted_dataset(kinds=("easy", "hard"))
    trainer = make_trainer(
        tmp_path, dataset=dataset, max_steps=1, dynamic_sampling_max_rounds=2, dynamic_sampling_on_exhausted="raise"
    )
    with pytest.raises(RuntimeError, match="dynamic_sampling_max_rounds=2"):
        trainer.train()


def test_evaluation_never_filters(tmp_path):
    eval_dataset = scripted_dataset(n=8, kinds=("easy", "hard"))
    trainer = make_trainer(tmp_path, eval_dataset=eval_dataset, per_device_eval_batch_size=8, max_steps=1)
    seen = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        out = original(inputs)
        seen.append(out["completion_ids"].size(0))
        return out

    trainer._generate_and_score_completions = spy
    metrics = trainer.evaluate()
    assert sum(seen) == len(eval_dataset) * trainer.num_generations  # every row, none dropped
    assert "eval_reward" in metrics


def test_carry_over_reuses_surplus_with_sampling_logprobs(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=4, dynamic_sampling_carry_over=True, dynamic_sampling_margin=4.0)
    trainer.train()
    assert sum(logged(trainer, "dynamic_sampling/groups_carried")) > 0
    with_carried = [b for b in trainer.recorded if "dapo_on_policy" in b and not b["dapo_on_policy"].all()]
    assert with_carried, "no trained batch held carried rows"
    for batch in trainer.recorded:
        assert set(prompt_kinds(trainer, batch)) == {"mixed"}
    for batch in with_carried:
        carried = ~batch["dapo_on_policy"]
        assert batch["old_per_token_logps"][carried].abs().sum() > 0  # the sampling policy's log-probabilities


def test_streamed_dataset_trains_the_groups_of_its_map_style_copy(tmp_path):
    common = dict(max_steps=3, shuffle_dataset=False, dynamic_sampling_carry_over=True)
    mapped = make_trainer(tmp_path / "map", **common)
    mapped.train()
    streamed = make_trainer(tmp_path / "stream", dataset=scripted_dataset().to_iterable_dataset(), **common)
    streamed.train()
    assert len(mapped.recorded) == len(streamed.recorded) > 0
    for a, b in zip(mapped.recorded, streamed.recorded, strict=True):
        assert torch.equal(a["prompt_ids"], b["prompt_ids"])
        assert torch.equal(a["advantages"], b["advantages"])
    for key in ("dynamic_sampling/prompts_consumed", "dynamic_sampling/groups_carried", "loss"):
        assert logged(mapped, key) == pytest.approx(logged(streamed, key)), key


def test_streamed_dataset_needs_max_steps(tmp_path):
    with pytest.raises(ValueError, match="max_steps"):
        make_trainer(tmp_path, dataset=scripted_dataset().to_iterable_dataset(), max_steps=-1)


@pytest.mark.parametrize("max_steps", [-1, 2])
def test_streamed_dataset_with_dispatch_batches_gets_trls_error_first(tmp_path, max_steps):
    """GRPOTrainer's own message about dispatch_batches comes before the project's max_steps check, as in TRL."""
    with pytest.raises(ValueError, match="Iterable datasets require `dispatch_batches=False`"):
        make_trainer(
            tmp_path,
            dataset=scripted_dataset().to_iterable_dataset(),
            max_steps=max_steps,
            accelerator_config={"dispatch_batches": True},
        )


@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_mid_stream_reproduces_the_uninterrupted_run(tmp_path, shuffle):
    common = dict(max_steps=6, save_strategy="steps", save_steps=3, shuffle_dataset=shuffle)
    stream = lambda: scripted_dataset(12).to_iterable_dataset(num_shards=2)  # noqa: E731  (12 prompts: epochs wrap)
    full = make_trainer(tmp_path / "full", dataset=stream(), **common)
    full.train()
    resumed = make_trainer(tmp_path / "resumed", dataset=stream(), **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    for key in ("loss", "reward", "dynamic_sampling/prompts_consumed"):
        tail_full = [h.get(key) for h in full.state.log_history if h.get("step", 0) > 3 and "loss" in h]
        tail_resumed = [h.get(key) for h in resumed.state.log_history if h.get("step", 0) > 3 and "loss" in h]
        assert tail_full and tail_full == pytest.approx(tail_resumed), key


def test_duplicated_prompts_warn(tmp_path, caplog):
    from datasets import concatenate_datasets

    dataset = concatenate_datasets([scripted_dataset(12)] * 3)
    with caplog.at_level(logging.WARNING):
        make_trainer(tmp_path, dataset=dataset)
    assert "24 duplicated prompts" in caplog.text


def test_dynamic_sampling_off_trains_on_everything(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, dynamic_sampling=False)
    trainer.train()
    kinds = {k for batch in trainer.recorded for k in prompt_kinds(trainer, batch)}
    assert "mixed" in kinds and not logged(trainer, "dynamic_sampling/rounds")


def test_resume_reproduces_the_uninterrupted_run(tmp_path):
    common = dict(max_steps=4, save_strategy="steps", save_steps=2, dynamic_sampling_carry_over=True)
    full = make_trainer(tmp_path / "full", **common)
    full.train()
    resumed = make_trainer(tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    for key in ("loss", "reward", "dynamic_sampling/prompts_consumed", "dynamic_sampling/groups_carried"):
        tail_full = [h.get(key) for h in full.state.log_history if h.get("step", 0) > 2 and "loss" in h]
        tail_resumed = [h.get(key) for h in resumed.state.log_history if h.get("step", 0) > 2 and "loss" in h]
        assert tail_full and tail_full == pytest.approx(tail_resumed), key


def skip_run(tmp_path, **overrides):
    # 12 prompts: each is drawn many times, so zero-variance histories build up and skipping acts.
    common = dict(max_steps=12, dynamic_sampling_skip=True, dynamic_sampling_skip_target=1.0)
    return make_trainer(tmp_path, dataset=scripted_dataset(12), **{**common, **overrides})


def test_prompt_skipping_passes_over_zero_variance_prompts_and_raises_the_informative_rate(tmp_path):
    trainer = skip_run(tmp_path)
    trainer.train()
    skipped = logged(trainer, "dynamic_sampling/prompts_skipped")
    assert sum(skipped) > 0
    # (None: a step that generated nothing, its batch all carried groups; carry-over is on with skipping)
    informative = [v for v in logged(trainer, "dynamic_sampling/informative_frac") if v is not None]
    assert sum(informative[-4:]) / 4 > sum(informative[:2]) / 2  # easy/hard prompts are skipped once known
    assert all(k == "mixed" for batch in trainer.recorded for k in prompt_kinds(trainer, batch))
    baseline = make_trainer(tmp_path / "off", dataset=scripted_dataset(12), max_steps=12)
    baseline.train()
    assert sum(logged(trainer, "dynamic_sampling/groups_generated")) < sum(
        logged(baseline, "dynamic_sampling/groups_generated")
    )


def test_prompt_skipping_resumes_exactly(tmp_path):
    common = dict(save_strategy="steps", save_steps=6)
    full = skip_run(tmp_path / "full", **common)
    full.train()
    resumed = skip_run(tmp_path / "resumed", **common)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-6"))
    for key in ("loss", "dynamic_sampling/prompts_skipped", "dynamic_sampling/prompts_consumed"):
        tail_full = [h.get(key) for h in full.state.log_history if h.get("step", 0) > 6 and "loss" in h]
        tail_resumed = [h.get(key) for h in resumed.state.log_history if h.get("step", 0) > 6 and "loss" in h]
        assert tail_full and tail_full == pytest.approx(tail_resumed), key
    for name, array in full._skip_policy.state_dict()["history"].items():
        assert torch.equal(torch.as_tensor(array), torch.as_tensor(resumed._skip_policy.state_dict()["history"][name]))
    # skipping's defaults probe and carry over: their state resumes too
    assert full.args.dynamic_sampling_probe == 2 and full.args.dynamic_sampling_carry_over
    probe_full, probe_resumed = full._probe_rule.state_dict(), resumed._probe_rule.state_dict()
    for name, value in probe_full.items():
        assert torch.equal(torch.as_tensor(value), torch.as_tensor(probe_resumed[name])), name
    assert full._carry_sampled_at == resumed._carry_sampled_at
    assert full._no_informative.state_dict() == resumed._no_informative.state_dict()


class CallRecorder(Recorder):
    """Also records, per TRL generation call, the (prompt, completion) of every row and how many rows it had."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[list[tuple[str, str]]] = []

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self.calls.append([(str(p), str(c)) for p, c in zip(prompts, completions, strict=True)])
        return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)


def test_probing_completes_mixed_probes_and_trains_whole_groups_holding_the_probe(tmp_path):
    trainer = make_probe_trainer(tmp_path, max_steps=3)
    trainer.train()
    G, k = 4, 2
    # Calls alternate: a probe of k rows per prompt, then the rest (G - k) of the groups completed.
    sizes = [len(call) for call in trainer.calls]
    assert sizes[0] % k == 0 and len(sizes) % 2 == 0
    probe_rows = {row for call in trainer.calls[0::2] for row in call}
    rest_rows = {row for call in trainer.calls[1::2] for row in call}
    dropped = logged(trainer, "dynamic_sampling/probe_dropped")
    assert sum(dropped) > 0  # easy and hard prompts stop after their probe
    tokenizer = trainer.processing_class
    for batch in trainer.recorded:
        assert batch["completion_ids"].size(0) == trainer.args.per_device_train_batch_size
        assert set(prompt_kinds(trainer, batch)) == {"mixed"}
        real = batch["advantages"] != 0
        prompts = tokenizer.batch_decode(batch["prompt_ids"][real], skip_special_tokens=True)
        completions = tokenizer.batch_decode(batch["completion_ids"][real], skip_special_tokens=True)
        by_prompt: dict[str, list[str]] = {}
        for prompt, completion in zip(prompts, completions, strict=True):
            by_prompt.setdefault(prompt, []).append(completion)
        for prompt, group in by_prompt.items():
            assert len(group) == G  # the whole group is trained
            from_probe = sum(any(p.endswith(prompt) and c == x for p, c in probe_rows) for x in group)
            from_rest = sum(any(p.endswith(prompt) and c == x for p, c in rest_rows) for x in group)
            assert from_probe >= k and from_rest >= G - k, (prompt, group)


def make_probe_trainer(tmp_path, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    return CallRecorder(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=config(tmp_path, **{"dynamic_sampling_probe": 2, **overrides}),
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )


def test_prompt_skipping_refuses_streamed_datasets(tmp_path):
    with pytest.raises(ValueError, match="streamed training set"):
        make_trainer(tmp_path, dataset=scripted_dataset().to_iterable_dataset(), dynamic_sampling_skip=True)


def test_a_stream_skipping_every_prompt_after_the_first_ones_returns_instead_of_looping():
    from dapo_trl.trainer.prompt_source import StreamPrompts

    stream = StreamPrompts(scripted_dataset(6).to_iterable_dataset(), seed=0, shuffle=False)
    seen = set()

    def once(index):  # each prompt may be taken only the first time it is drawn
        if index in seen:
            return True
        seen.add(index)
        return False

    indices, rows = stream.take(10, skip=once)
    assert indices == list(range(6)) and len(rows) == 6


# ---------------------------------------------------------------- settings that leave no group informative


def format_reward(completions, **kwargs):
    """A reward that does not look at the completion: every completion is "well formatted"."""
    return [1.0] * len(completions)


def test_a_constant_filter_reward_ends_the_refill_and_names_the_setting(tmp_path, caplog):
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = Recorder(
        model=model,
        reward_funcs=[format_reward, ScriptedReward()],  # the verifier second: dynamic sampling filters on the first
        args=config(tmp_path, max_steps=3, dynamic_sampling_max_rounds=10),
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
    )
    with caplog.at_level(logging.WARNING):
        trainer.train()
    # Rounds until 64 completions showed one value, then one round of just the missing prompts per step.
    assert logged(trainer, "dynamic_sampling/rounds") == [2.0, 1.0, 1.0]
    assert logged(trainer, "dynamic_sampling/groups_generated")[1:] == [2.0, 2.0]
    text = caplog.text
    assert "filters on the first reward function, 'format_reward' (dynamic_sampling_reward is not set)" in text
    assert "dynamic_sampling_reward='scripted'" in text
    underfill = [r.getMessage() for r in caplog.records if "informative groups a batch needs" in r.getMessage()]
    assert underfill and not any("too easy" in m or "all-correct" in m for m in underfill)  # no correct value
    assert "too easy" not in text  # nor in the warning about the constant reward


def test_a_verifier_that_fails_every_prompt_still_refills(tmp_path):
    """A reward with a declared correct value scores the completion: all-wrong rounds are the data, so refill goes on."""
    dataset = scripted_dataset(kinds=("hard",))
    trainer = make_trainer(
        tmp_path, dataset=dataset, max_steps=2, dynamic_sampling_max_rounds=3, dynamic_sampling_max_round_prompts=4
    )
    trainer.train()
    assert logged(trainer, "dynamic_sampling/rounds") == [3.0, 3.0]  # 24 groups: too few to tell scarce from none


def test_once_a_whole_round_budget_found_nothing_informative_later_steps_run_one_round(tmp_path, caplog):
    """An untrained model whose answers are all wrong: the first step spends its budget, later ones do not."""
    dataset = scripted_dataset(kinds=("hard",))
    trainer = make_trainer(tmp_path, dataset=dataset, max_steps=4, dynamic_sampling_max_rounds=6)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert logged(trainer, "dynamic_sampling/rounds") == [6.0, 1.0, 1.0, 1.0]
    generated = logged(trainer, "dynamic_sampling/groups_generated")
    assert generated[0] >= 64 and generated[1:] == [2.0, 2.0, 2.0]  # one round of the missing prompts
    warning = next(r.getMessage() for r in caplog.records if "informative groups a batch needs" in r.getMessage())
    assert f"None of the last {int(generated[0])} groups generated was informative" in warning
    assert "each step runs a single round" in warning
    assert trainer._no_informative.established


def test_scarce_informative_groups_keep_the_full_round_budget(tmp_path):
    """One informative group among a step's rounds is scarcity, not absence: the paper's refill goes on."""
    dataset = scripted_dataset(n=60, kinds=("hard",) * 19 + ("mixed",))  # 1 prompt in 20 gives informative groups
    trainer = make_trainer(tmp_path, dataset=dataset, max_steps=4, dynamic_sampling_max_rounds=3)
    trainer.train()
    rounds, underfilled = logged(trainer, "dynamic_sampling/rounds"), logged(trainer, "dynamic_sampling/underfilled")
    assert not trainer._no_informative.established
    assert all(r == 3.0 for r, u in zip(rounds, underfilled, strict=True) if u)  # an unfilled batch used every round
    assert min(rounds) > 1


def test_a_tolerance_wider_than_the_reward_is_named_and_groups_are_described_as_they_are(tmp_path, caplog):
    trainer = make_trainer(tmp_path, max_steps=1, dynamic_sampling_max_rounds=2, dynamic_sampling_tolerance=5.0)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    text = caplog.text
    assert "dynamic_sampling_tolerance=5 is at least the spread of the first reward function, 'scripted'" in text
    assert "(up to 2 here)" in text and "mixed but within dynamic_sampling_tolerance" in text
    assert "100% all-correct" not in text
    # a third of the prompts are easy, a third hard, a third mixed: the figures say so
    for key in ("all_correct_frac", "all_wrong_frac"):
        assert logged(trainer, f"dynamic_sampling/{key}")[0] == pytest.approx(1 / 3, abs=0.15)


def test_a_completion_limit_that_cuts_every_answer_is_named(tmp_path, caplog):
    dataset = scripted_dataset(kinds=("easy", "hard"))
    trainer = make_trainer(
        tmp_path, dataset=dataset, max_steps=1, dynamic_sampling_max_rounds=2, max_completion_length=1,
        overlong_shaping=False,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "of the completions were cut off at max_completion_length=1 tokens" in caplog.text
    assert "Raise max_completion_length" in caplog.text


def test_the_constant_reward_watch_resumes_exactly(tmp_path):
    common = dict(max_steps=3, save_strategy="steps", save_steps=1, dynamic_sampling_max_rounds=10)
    tokenizer = tiny_model_and_tokenizer()[1]

    def run(folder, resume=None):
        trainer = Recorder(
            model=tiny_model_and_tokenizer()[0],
            reward_funcs=[format_reward, ScriptedReward()],
            args=config(folder, **common),
            train_dataset=scripted_dataset(),
            processing_class=tokenizer,
        )
        trainer.train(resume_from_checkpoint=resume)
        return [logged(trainer, f"dynamic_sampling/{key}") for key in ("rounds", "groups_generated")]

    full = run(tmp_path / "full")
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "full" / "checkpoint-1"))
    # After step 1 the reward is known constant: later steps draw only the 2 prompts a batch needs, resumed or not.
    assert full[0] == [2.0, 1.0, 1.0] and full[1][1:] == [2.0, 2.0]
    assert resumed == full  # the resumed log holds step 1 from the checkpoint


class CountingReward(ScriptedReward):
    """ScriptedReward that records the number of completions of each call (a judge with a fixed cost per call)."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, completions, kind, **kwargs):
        self.calls.append(len(completions))
        return super().__call__(completions, kind, **kwargs)


class RoundSpy(Recorder):
    """Records, per dynamic-sampling round, the reward calls and the generation calls (and their sizes) it made."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds: list[dict] = []
        self._generations: list[int] | None = None

    def _generate_and_score_round(self, indices, rows):
        reward = self.reward_funcs[0]
        calls_before, self._generations = len(reward.calls), []
        scored = super()._generate_and_score_round(indices, rows)
        self.rounds.append(
            {"prompts": len(indices), "reward_calls": reward.calls[calls_before:], "generations": self._generations}
        )
        self._generations = None
        return scored


def _count_generations(monkeypatch):
    from trl import GRPOTrainer

    original = GRPOTrainer._generate_single_turn

    def counted(self, prompt_ids, *args, **kwargs):
        if getattr(self, "_generations", None) is not None:
            self._generations.append(len(prompt_ids))
        return original(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", counted)


def test_each_round_is_scored_in_one_reward_call_and_generated_in_batch_sized_chunks(tmp_path, monkeypatch):
    _count_generations(monkeypatch)
    reward = CountingReward()
    model, tokenizer = tiny_model_and_tokenizer()
    kinds = ("easy", "hard", "hard", "easy", "mixed")  # one prompt in five is informative: rounds of several batches
    trainer = RoundSpy(
        model=model,
        reward_funcs=[reward],
        args=config(tmp_path, max_steps=2),
        train_dataset=scripted_dataset(100, kinds),
        processing_class=tokenizer,
    )
    trainer.train()
    G, batch_rows = trainer.num_generations, trainer.args.generation_batch_size
    assert trainer.rounds and any(r["prompts"] * G > batch_rows for r in trainer.rounds), "no round above one batch"
    for r in trainer.rounds:
        assert r["reward_calls"] == [r["prompts"] * G], r  # one call with every row of the round
        assert sum(r["generations"]) == r["prompts"] * G
        assert max(r["generations"]) <= batch_rows, r  # generation never holds more than one generation batch
    assert len(reward.calls) == len(trainer.rounds)
    assert sum(h.get("dynamic_sampling/rounds", 0) for h in trainer.state.log_history) == len(trainer.rounds)


class LengthRewardModel(torch.nn.Module):
    """A reward model (an `nn.Module`, which TRL calls with the tokenised texts): records each forward's rows."""

    def __init__(self):
        from transformers import PretrainedConfig

        super().__init__()
        self.config = PretrainedConfig(name_or_path="length-judge")  # TRL names the reward and sets its pad id here
        self.forwards: list[int] = []

    def forward(self, input_ids, attention_mask, **kwargs):
        from types import SimpleNamespace

        self.forwards.append(input_ids.size(0))
        return SimpleNamespace(logits=attention_mask.sum(1, keepdim=True).float() / 100)


def test_a_reward_model_scores_a_round_in_forwards_of_at_most_one_generation_batch(tmp_path, monkeypatch):
    _count_generations(monkeypatch)
    reward, judge = CountingReward(), LengthRewardModel()
    model, tokenizer = tiny_model_and_tokenizer()
    trainer = RoundSpy(
        model=model,
        reward_funcs=[reward, judge],
        reward_processing_classes=[None, tokenizer],
        args=config(tmp_path, max_steps=2),
        train_dataset=scripted_dataset(100, ("easy", "hard", "hard", "easy", "mixed")),
        processing_class=tokenizer,
    )
    trainer.train()
    batch_rows = trainer.args.generation_batch_size
    assert any(r["prompts"] * trainer.num_generations > batch_rows for r in trainer.rounds)
    assert sum(judge.forwards) == sum(reward.calls) and max(judge.forwards) <= batch_rows
    assert any(key.startswith("rewards/length-judge/") for h in trainer.state.log_history for key in h)


def test_row_selection_copies_only_when_it_changes_the_rows():
    from dapo_trl.trainer import batch as _batch

    batch = {"completion_ids": torch.arange(6).view(3, 2), "_group": torch.tensor([0, 1, 1])}
    assert _batch.keep_rows(batch, torch.tensor([True, True, True])) is batch
    assert _batch.sort_rows(batch, batch["_group"]) is batch
    kept = _batch.keep_rows(batch, torch.tensor([False, True, True]))
    assert kept["completion_ids"].tolist() == [[2, 3], [4, 5]]
    shuffled = _batch.select_rows(batch, torch.tensor([2, 0, 1]))
    assert _batch.sort_rows(shuffled, shuffled["_group"])["_group"].tolist() == [0, 1, 1]
    joined = _batch.concat_rows([batch], pad_token_id=0)
    assert joined is not batch and joined["completion_ids"] is batch["completion_ids"]
