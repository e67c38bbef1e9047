"""Shared helpers for the trainer tests: a tiny local model, a scripted dataset and reward, gradient capture."""

from __future__ import annotations

import copy
import glob
import json
import os
from pathlib import Path

import torch
from datasets import Dataset
from transformers import TrainerCallback

from dapo_trl.dapo_config import DAPOConfig
from dapo_trl.dapo_trainer import DAPOTrainer
from dapo_trl.run.process_group import release_process_group
from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model
from dapo_trl.trainer.loss import dapo_loss

KINDS = ("easy", "hard", "mixed")


def live_gloo_threads() -> list[str]:
    """Names of this process's native threads that belong to gloo (Linux: /proc/self/task/<tid>/comm)."""
    names = []
    for path in glob.glob("/proc/self/task/*/comm"):
        try:
            names.append(Path(path).read_text().strip())
        except OSError:  # the thread ended between the listing and the read
            pass
    return sorted(name for name in names if "gloo" in name)


def end_runner(out_dir, tag: str) -> None:
    """
    End of a runner launched with `accelerate launch`, after its `main()` returned: release the process group as the
    examples do, then record the gloo threads still alive (`<tag>_exit_rank<r>.json`; none is expected). A backend
    left to interpreter exit sometimes aborts a finished process (SIGABRT), which fails the launch.
    """
    release_process_group()
    rank = os.environ.get("RANK", "0")
    Path(out_dir, f"{tag}_exit_rank{rank}.json").write_text(json.dumps(live_gloo_threads()))


def assert_no_gloo_thread_left(out_dir, tag: str, processes: int) -> None:
    """Every rank of a launch ended by `end_runner(out_dir, tag)` had freed gloo's threads before interpreter exit."""
    left = {r: json.loads(Path(out_dir, f"{tag}_exit_rank{r}.json").read_text()) for r in range(processes)}
    assert all(not names for names in left.values()), f"gloo threads alive at exit, by rank: {left}"


def tiny_model_and_tokenizer(seed: int = 0):
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_heads=2, seed=seed)
    return model, tokenizer


def tiny_gpt2(tokenizer):
    """A GPT-2 (learned absolute positions) of the tiny model's size, built from a config, without dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=128,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def scripted_dataset(n: int = 48, kinds=KINDS) -> Dataset:
    """Prompts `q<i>?` whose `kind` decides the scripted reward: all correct, all wrong, or mixed."""
    return Dataset.from_dict(
        {"prompt": [f"q{i}?\n" for i in range(n)], "kind": [kinds[i % len(kinds)] for i in range(n)]}
    )


class ScriptedReward:
    """+1 for `easy` prompts, -1 for `hard`, alternating +1/-1 along the global row order for `mixed`."""

    __name__ = "scripted"
    correct_reward = 1.0

    def __call__(self, completions, kind, **kwargs):
        offset = 0
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            offset = torch.distributed.get_rank() * len(completions)
        out = []
        for i, k in enumerate(kind):
            if k == "easy":
                out.append(1.0)
            elif k == "hard":
                out.append(-1.0)
            else:
                out.append(1.0 if (offset + i) % 2 == 0 else -1.0)
        return out


def config(tmp_path, **overrides) -> DAPOConfig:
    values = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-3,
        warmup_steps=0,
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=8,
        seed=0,
        max_grad_norm=0.0,  # no clipping: the tests compare raw gradients
        disable_tqdm=True,
    )
    values.update(overrides)
    return DAPOConfig(**values)


class Recorder(DAPOTrainer):
    """Records every micro-batch that reaches the loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded: list[dict] = []

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)  # first: the loss may fill in on-policy old log-probabilities
        if self.model.training:
            self.recorded.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return loss


def tiny_trainer(tmp_path, dataset=None, reward=None, cls=Recorder, model=None, **overrides) -> DAPOTrainer:
    """A `cls` trainer on the tiny model, [`ScriptedReward`] and [`scripted_dataset`], with `config(**overrides)`."""
    tiny, tokenizer = tiny_model_and_tokenizer()
    return cls(
        model=model or tiny,
        reward_funcs=[reward or ScriptedReward()],
        args=config(tmp_path, **overrides),
        train_dataset=dataset if dataset is not None else scripted_dataset(),
        processing_class=tokenizer,
    )


def logged(trainer, key: str) -> list:
    """The values of `key` in the trainer's log history, in order."""
    return [h[key] for h in trainer.state.log_history if key in h]


class GradientCapture(TrainerCallback):
    """At each optimizer step, keep the gradients, the parameters and the micro-batches that produced them."""

    def __init__(self, trainer: Recorder):
        self.trainer = trainer
        self.steps: list[dict] = []
        self._seen = 0

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        batches = self.trainer.recorded[self._seen :]
        self._seen = len(self.trainer.recorded)
        self.steps.append(
            {
                "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None},
                "params": {n: t.detach().clone() for n, t in model.state_dict().items()},
                "batches": batches,
            }
        )


class StateCapture(TrainerCallback):
    """After each optimizer step: the weights, the optimizer state and the scheduler state."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.steps: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        self.steps.append(
            {
                "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
                "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
                "scheduler": copy.deepcopy(trainer.lr_scheduler.state_dict()),
                "lr": trainer.lr_scheduler.get_last_lr(),
            }
        )


def reference_gradients(model, batches: list[dict], *, epsilon_low: float, epsilon_high: float) -> dict:
    """Gradient of the DAPO token-mean loss computed directly on the union of an optimizer step's micro-batches."""
    from dapo_trl.trainer.batch import concat_rows, loss_mask

    model.zero_grad()
    logps, olds, advs, masks = [], [], [], []
    for batch in batches:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        width = batch["completion_ids"].size(1)
        logits = model(input_ids=input_ids, attention_mask=attention).logits[:, -width - 1 : -1]
        lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
        logps.append({"completion_ids": lp})
        old = batch.get("old_per_token_logps")
        olds.append({"completion_ids": lp.detach() if old is None else old})
        advs.append(batch["advantages"])
        masks.append({"completion_ids": loss_mask(batch)})
    pad = lambda parts: concat_rows(parts, pad_token_id=0)["completion_ids"]  # noqa: E731
    loss = dapo_loss(
        pad(logps), pad(olds), torch.cat(advs), pad(masks), epsilon_low=epsilon_low, epsilon_high=epsilon_high
    )
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
