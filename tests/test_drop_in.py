"""DAPOTrainer in place of GRPOTrainer is a one-line change: the same constructor call, the same YAML."""

import dataclasses
from unittest import mock

import pytest
import torch
from _tiny import ScriptedReward, scripted_dataset, tiny_model_and_tokenizer
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer, ModelConfig, ScriptArguments, TrlParser

from dapo_trl import DAPOConfig, DAPOTrainer

pytestmark = pytest.mark.integration

TRAINERS = pytest.mark.parametrize("trainer_cls", [GRPOTrainer, DAPOTrainer], ids=["GRPOTrainer", "DAPOTrainer"])


def scripted_reward(completions, kind, **kwargs):
    """A plain reward function, as most TRL projects write them."""
    return ScriptedReward()(completions, kind)


def length_reward(completions, **kwargs):
    return [-0.01 * len(c) for c in completions]


def grpo_args(output_dir, **overrides) -> GRPOConfig:
    """The project's existing GRPOConfig, passed unchanged to either trainer."""
    values = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        learning_rate=1e-3,
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=8,
        max_completion_length=8,
        seed=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return GRPOConfig(**values)


class StepRecorder(TrainerCallback):
    def __init__(self):
        self.steps: list[int] = []
        self.logs: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A local folder saved with `save_pretrained`, standing in for a Hub model id."""
    path = tmp_path_factory.mktemp("tiny-qwen2")
    model, tokenizer = tiny_model_and_tokenizer()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@TRAINERS
def test_model_id_function_reward_and_eval_dataset(trainer_cls, model_dir, tmp_path):
    trainer = trainer_cls(
        model=model_dir,  # loaded by the trainer, tokenizer included, as from the Hub
        reward_funcs=scripted_reward,
        args=grpo_args(tmp_path, eval_strategy="steps", eval_steps=2),
        train_dataset=scripted_dataset(24),
        eval_dataset=scripted_dataset(4),
    )
    assert isinstance(trainer, GRPOTrainer)
    assert trainer.model.config._name_or_path == model_dir
    trainer.train()
    assert trainer.state.global_step == 2
    assert any("eval_reward" in h for h in trainer.state.log_history)
    assert any("rewards/scripted_reward/mean" in h for h in trainer.state.log_history)


@TRAINERS
def test_model_object_reward_list_processing_class_and_callbacks(trainer_cls, tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    recorder = StepRecorder()
    trainer = trainer_cls(
        model=model,
        reward_funcs=[scripted_reward, length_reward],
        args=grpo_args(tmp_path, reward_weights=[1.0, 0.5]),
        train_dataset=scripted_dataset(24),
        processing_class=tokenizer,
        callbacks=[recorder],
    )
    trainer.train()
    assert recorder.steps == [1, 2]
    logged = {key for log in recorder.logs for key in log}
    assert {"rewards/scripted_reward/mean", "rewards/length_reward/mean", "loss"} <= logged
    assert ("dynamic_sampling/rounds" in logged) == (trainer_cls is DAPOTrainer)
    assert any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


@TRAINERS
def test_peft_config_trains_only_the_lora_adapters(trainer_cls, model_dir, tmp_path):
    from peft import LoraConfig, PeftModel

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    _, tokenizer = tiny_model_and_tokenizer()
    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=scripted_reward,
        args=grpo_args(tmp_path, max_steps=3),
        train_dataset=scripted_dataset(24),
        processing_class=tokenizer,
        peft_config=lora,
    )
    assert isinstance(trainer.model, PeftModel)
    params = dict(trainer.model.named_parameters())
    trainable = {n for n, p in params.items() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    before = {n: p.detach().clone() for n, p in params.items()}
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed, "no parameter trained"
    assert changed <= trainable, f"frozen parameters changed: {sorted(changed - trainable)}"


def test_dapo_trainer_with_grpo_config_keeps_its_values(tmp_path):
    model, tokenizer = tiny_model_and_tokenizer()
    args = grpo_args(tmp_path, epsilon_high=0.3, num_generations=2)
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=scripted_reward,
        args=args,
        train_dataset=scripted_dataset(24),
        processing_class=tokenizer,
    )
    assert isinstance(trainer.args, DAPOConfig)
    for field in dataclasses.fields(GRPOConfig):
        if field.init and field.name != "generation_batch_size":
            assert getattr(trainer.args, field.name) == getattr(args, field.name), field.name
    assert trainer.args.generation_batch_size == args.generation_batch_size


def constant_reward_1(completions, **kwargs):
    return [1.0] * len(completions)


def constant_reward_0(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.mark.timeout(120)  # before the refill stopped on a constant reward, DAPOTrainer took minutes here
@TRAINERS
def test_reward_metric_reflects_reward_weights_as_in_trl(trainer_cls, model_dir, tmp_path):
    """
    TRL's own `test_reward_metric_reflects_reward_weights` (its config, a 17-prompt training set like its `zen` one):
    two rewards that ignore the completion. Dynamic sampling cannot find an informative group, so it must stop
    refilling once the reward shows itself constant instead of running dynamic_sampling_max_rounds every step.
    """
    args = GRPOConfig(
        output_dir=str(tmp_path),
        learning_rate=0.1,
        per_device_train_batch_size=3,
        num_generations=3,
        max_completion_length=8,
        report_to="none",
        reward_weights=[0.7, 0.3],
        use_cpu=True,  # CPU-only machine
        bf16=False,
        activation_checkpointing=False,
        disable_tqdm=True,
    )
    calls = []
    original = GRPOTrainer._generate_and_score_completions

    def counted(self, inputs):
        calls.append(len(inputs))
        return original(self, inputs)

    trainer = trainer_cls(
        model=model_dir,
        reward_funcs=[constant_reward_1, constant_reward_0],
        args=args,
        train_dataset=scripted_dataset(17),
    )
    with mock.patch.object(GRPOTrainer, "_generate_and_score_completions", counted):
        trainer.train()
    log = trainer.state.log_history[-1]
    assert log["reward"] == pytest.approx(0.7, abs=1e-5)  # weighted: 0.7 * 1.0 + 0.3 * 0.0
    steps = trainer.state.global_step
    assert steps == 51  # 17 prompts, one per step, 3 epochs
    if trainer_cls is GRPOTrainer:
        assert len(calls) == steps
    else:
        # A few rounds until the reward shows itself constant (64 completions; each round is one call of all its
        # prompts), then one round of one prompt per step: 53 calls here, where 10 rounds a step made several hundred.
        assert len(calls) <= 1.5 * steps
        assert sum(calls[:3]) >= 64 and set(calls[3:]) == {3}


# A GRPO recipe as a project keeps it (open-r1 style: model, data and trainer settings in one file).
GRPO_RECIPE = """\
# Model arguments
model_name_or_path: Qwen/Qwen2.5-Math-7B
model_revision: main
dtype: bfloat16
attn_implementation: sdpa
use_peft: true
lora_r: 32
lora_alpha: 64
lora_target_modules: [q_proj, k_proj, v_proj, o_proj]

# Data
dataset_name: open-r1/DAPO-Math-17k-Processed
dataset_config: en
dataset_train_split: train

# Trainer
output_dir: {output_dir}
use_cpu: true
bf16: false
activation_checkpointing: true
gradient_accumulation_steps: 4
per_device_train_batch_size: 16
per_device_eval_batch_size: 16
steps_per_generation: 8
num_generations: 16
num_iterations: 1
learning_rate: 1.0e-06
lr_scheduler_type: constant_with_warmup
warmup_steps: 10
weight_decay: 0.1
max_grad_norm: 1.0
max_steps: 500
seed: 42
logging_steps: 5
save_strategy: steps
save_steps: 50
save_total_limit: 3
report_to: [none]
log_completions: true
num_completions_to_print: 2

# Generation
max_completion_length: 2048
temperature: 1.0
top_p: 1.0
top_k: 0
repetition_penalty: 1.0
generation_kwargs:
  stop: ["</answer>"]
  min_tokens: 1
chat_template_kwargs:
  enable_thinking: false

# Objective and rewards
beta: 0.0
epsilon: 0.2
epsilon_high: 0.28
loss_type: dapo
scale_rewards: group
mask_truncated_completions: false
reward_weights: [1.0, 0.5]

# vLLM server
use_vllm: true
vllm_mode: server
vllm_server_host: 10.0.0.2
vllm_server_port: 8001
vllm_server_timeout: 600
vllm_gpu_memory_utilization: 0.7
vllm_tensor_parallel_size: 2
vllm_max_model_length: 4096
vllm_importance_sampling_correction: true
vllm_importance_sampling_mode: token_truncate
vllm_importance_sampling_clip_max: 2.0
"""


def test_realistic_grpo_yaml_loads_into_dapo_config_unchanged(tmp_path):
    import yaml

    path = tmp_path / "grpo.yaml"
    path.write_text(GRPO_RECIPE.format(output_dir=tmp_path / "out"))
    raw = yaml.safe_load(path.read_text())
    grpo = TrlParser((ScriptArguments, GRPOConfig, ModelConfig)).parse_args_and_config(["--config", str(path)])
    dapo = TrlParser((ScriptArguments, DAPOConfig, ModelConfig)).parse_args_and_config(["--config", str(path)])
    script, config, model_config = dapo
    assert isinstance(config, DAPOConfig)
    # Every key of the file lands where it belongs, with its value (report_to: [none] is normalised to []).
    for key, value in raw.items():
        holders = [obj for obj in (script, config, model_config) if hasattr(obj, key)]
        assert len(holders) == 1, key
        assert getattr(holders[0], key) == ([] if key == "report_to" else value), key
    assert config.generation_kwargs == {"stop": ["</answer>"], "min_tokens": 1}
    assert config.chat_template_kwargs == {"enable_thinking": False}
    assert config.reward_weights == [1.0, 0.5] and config.vllm_mode == "server"
    # Nothing else moves either: every GRPOConfig field, and the other two dataclasses, parse to the same values.
    for field in dataclasses.fields(GRPOConfig):
        assert getattr(config, field.name) == getattr(grpo[1], field.name), field.name
    assert script == grpo[0] and model_config == grpo[2]
    # and the DAPO-only settings take their defaults
    assert config.dynamic_sampling and config.overlong_shaping and config.overlong_buffer_len == 2048 // 5


# A user's GRPO training script, as TRL's docs write them. Only its first import line is swapped.
USER_SCRIPT = """\
{import_line}
from datasets import Dataset
from _tiny import tiny_model_and_tokenizer

rows = {{"prompt": [f"q{{i}}?\\n" for i in range(48)], "kind": ["easy", "hard", "mixed"] * 16}}
train_dataset = Dataset.from_dict(rows).to_iterable_dataset(num_shards=2)  # streamed, as load_dataset(streaming=True)


def accuracy(completions, kind, **kwargs):
    return [1.0 if k == "easy" else -1.0 if k == "hard" else float(i % 2) for i, k in enumerate(kind)]


def brevity(completions, **kwargs):
    return [-0.01 * len(c) for c in completions]


model, tokenizer = tiny_model_and_tokenizer()
training_args = GRPOConfig(
    output_dir=OUTPUT_DIR,
    use_cpu=True,
    bf16=False,
    activation_checkpointing=False,
    report_to="none",
    max_steps=3,
    num_generations=4,
    per_device_train_batch_size=8,
    max_completion_length=8,
    learning_rate=1e-3,
    scale_rewards="batch",
    multi_objective_aggregation="normalize_then_sum",
    reward_weights=[1.0, 0.5],
    logging_steps=1,
    disable_tqdm=True,
)
trainer = GRPOTrainer(
    model=model,
    reward_funcs=[accuracy, brevity],
    args=training_args,
    train_dataset=train_dataset,
    processing_class=tokenizer,
)
trainer.train()
"""


@pytest.mark.parametrize(
    "import_line",
    [
        "from trl import GRPOConfig, GRPOTrainer",
        "from dapo_trl import DAPOConfig as GRPOConfig, DAPOTrainer as GRPOTrainer",
    ],
    ids=["GRPOTrainer", "DAPOTrainer"],
)
def test_a_user_script_with_only_the_import_swapped(tmp_path, import_line):
    namespace = {"OUTPUT_DIR": str(tmp_path), "__name__": "user_script"}
    exec(compile(USER_SCRIPT.format(import_line=import_line), "user_script.py", "exec"), namespace)
    trainer = namespace["trainer"]
    assert trainer.state.global_step == 3
    assert trainer.reward_func_names == ["accuracy", "brevity"]
    logged = set().union(*[h.keys() for h in trainer.state.log_history])
    assert {"rewards/accuracy/mean", "rewards/brevity/mean", "reward", "loss"} <= logged
    if "dapo_trl" in import_line:
        assert isinstance(trainer, DAPOTrainer)
        groups = [h["dynamic_sampling/groups_trained"] for h in trainer.state.log_history if "loss" in h]
        assert groups == [trainer._ds_target] * 3  # every batch full of informative groups, from the stream


# ---------------------------------------------------------------------------------------------------- environments


def environment_owned_reward(completions, environment, **kwargs):
    """What a multi-environment run with `get_reward` on its environments gives: one value per environment."""
    return [1.0 if name == "game" else 0.0 for name in environment]


def test_a_reward_that_is_one_value_per_environment_ends_the_refill():
    from dapo_trl.trainer.sampling import ConstantRewardWatch

    watch = ConstantRewardWatch(min_completions=8)
    values = torch.tensor([[1.0] * 4, [0.0] * 4])  # (groups, G): environment "game" gives 1, "code" gives 0
    assert not watch.update(values, environments=["game", "code"])
    assert watch.update(values, environments=["game", "code"]), "8 completions of 2 groups in each environment"
    restored = ConstantRewardWatch(min_completions=8)
    restored.load_state_dict(watch.state_dict())
    assert restored.established
    assert not watch.update(torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0] * 4]), environments=["game", "code"])


@pytest.mark.integration
def test_an_environment_owned_reward_stops_refilling_like_a_constant_reward(tmp_path):
    """TRL's multi-environment runs where each environment returns the reward: a refill cannot find a mixed group."""
    from _tiny import config, tiny_model_and_tokenizer
    from datasets import Dataset

    from dapo_trl import DAPOTrainer

    model, tokenizer = tiny_model_and_tokenizer()
    data = Dataset.from_dict({"prompt": [f"q{i}?\n" for i in range(64)], "environment": ["game", "code"] * 32})
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=[environment_owned_reward],
        args=config(tmp_path, max_steps=3),
        train_dataset=data,
        processing_class=tokenizer,
    )
    trainer.train()
    rounds = [h["dynamic_sampling/rounds"] for h in trainer.state.log_history if "dynamic_sampling/rounds" in h]
    assert rounds[-1] == 1, rounds  # one round once each environment's value is established, not max_rounds
