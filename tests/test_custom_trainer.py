"""The curriculum subclass of examples/custom_trainer.py: behaviour changed through DAPOTrainer's extension points."""

import importlib.util
from pathlib import Path

import pytest
import torch
from _tiny import KINDS, ScriptedReward, config, scripted_dataset, tiny_model_and_tokenizer

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_trainer.py"
RETIRE_AFTER = 2


def load_example():
    spec = importlib.util.spec_from_file_location("custom_trainer_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = load_example()


class RecordingCurriculum(example.CurriculumDAPOTrainer):
    """Records each training round's prompt indices and the prompts retired when they were drawn."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rounds: list[tuple[list[int], set[int]]] = []

    def on_groups_scored(self, prompt_indices, values, informative, classification):
        # Retirements only happen in this hook, so the set before the call is the set `skip_prompt` saw at the draw.
        self.rounds.append((list(prompt_indices), set(self.retired)))
        super().on_groups_scored(prompt_indices, values, informative, classification)


def make_trainer(output_dir, retire_after=RETIRE_AFTER, **overrides):
    model, tokenizer = tiny_model_and_tokenizer()
    return RecordingCurriculum(
        model=model,
        reward_funcs=[ScriptedReward()],  # "easy" prompts (index % 3 == 0) are always solved by every completion
        args=config(output_dir, **overrides),
        train_dataset=scripted_dataset(24),
        processing_class=tokenizer,
        retire_after=retire_after,
    )


def is_easy(index: int) -> bool:
    return KINDS[index % len(KINDS)] == "easy"


RUN = dict(max_steps=8, save_strategy="steps", save_steps=4)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("curriculum")
    trainer = make_trainer(output_dir, **RUN)
    trainer.train()
    return trainer, output_dir


def test_solved_prompts_are_retired_and_never_drawn_again(full_run):
    trainer, _ = full_run
    easy = {i for i in range(len(trainer.train_dataset)) if is_easy(i)}
    assert trainer.retired, "the curriculum retired nothing"
    assert trainer.retired <= easy, "only always-solved prompts may be retired"
    for indices, retired_then in trainer.rounds:
        assert not set(indices) & retired_then, f"retired prompts {set(indices) & retired_then} were drawn again"
    for index in trainer.retired:  # retired as soon as it was solved RETIRE_AFTER times in a row
        assert sum(index in indices for indices, _ in trainer.rounds) == RETIRE_AFTER


def test_without_retirement_solved_prompts_come_back(tmp_path):
    # The control for the test above: with the same budget and no retirement, solved prompts are drawn more than
    # RETIRE_AFTER times, so that test fails if `skip_prompt` does nothing.
    control = make_trainer(tmp_path, max_steps=RUN["max_steps"], retire_after=10**6)
    control.train()
    assert not control.retired
    draws = [i for indices, _ in control.rounds for i in indices]
    assert sum(draws.count(i) > RETIRE_AFTER for i in set(draws) if is_easy(i)) >= 4


def test_curriculum_metric_is_logged(full_run):
    trainer, _ = full_run
    logged = [h["curriculum/retired_prompts"] for h in trainer.state.log_history if "curriculum/retired_prompts" in h]
    assert len(logged) == trainer.args.max_steps
    assert logged == sorted(logged) and logged[0] < logged[-1] == len(trainer.retired)
    active = [h["curriculum/active_prompts"] for h in trainer.state.log_history if "curriculum/active_prompts" in h]
    assert active[-1] == len(trainer.train_dataset) - len(trainer.retired)


def test_curriculum_state_survives_resume(full_run, tmp_path):
    full, output_dir = full_run
    checkpoint = output_dir / "checkpoint-4"
    saved = torch.load(checkpoint / "dapo_sampler_state.pt", weights_only=True)["curriculum"]
    assert saved["retired"], "nothing retired at the checkpoint: the test would not show the restore"
    resumed = make_trainer(tmp_path, **RUN)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    _, retired_at_resume = resumed.rounds[0]
    assert retired_at_resume == set(saved["retired"])
    assert resumed.retired == full.retired
    assert resumed.rounds == full.rounds[-len(resumed.rounds) :]  # the same prompts as the uninterrupted run


def test_floor_keeps_prompts_in_play(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    dataset = scripted_dataset(12, kinds=("easy", "easy", "mixed"))
    trainer = example.CurriculumDAPOTrainer(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=config(tmp_path, max_steps=4),
        train_dataset=dataset,
        processing_class=tokenizer,
        retire_after=1,
        min_active_prompts=6,
    )
    trainer.train()
    assert len(trainer.retired) == len(dataset) - 6


def test_example_main_runs_with_a_tiny_budget(tmp_path):
    trainer = example.main(["--output-dir", str(tmp_path), "--max-steps", "2", "--sft-steps", "100"])
    assert trainer.state.global_step == 2
    assert any("curriculum/retired_prompts" in h for h in trainer.state.log_history)
