"""
vLLM on CPU against transformers, side by side in one run, on SmolLM2-135M-Instruct:

1. generation: tokens per second of vLLM's CPU engine and of transformers `generate`, same prompts, same sampling
   (T=1, top_p=1, `--completions` completions of up to `--max-tokens` tokens);
2. training: wall time of DAPOTrainer optimizer steps with `use_vllm=True` (colocate) and with `use_vllm=False`.

Run in the environment of `make vllm-env`:
    .venv-vllm/bin/python benchmarks/vllm_speed.py --model /path/to/SmolLM2-135M-Instruct
(the folder written by scripts/get_smollm2.py). Prints both figures and their ratios.
"""

from __future__ import annotations

import argparse
import os
import time

for key, value in {
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_CI_ENV": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RANK": "0",
    "LOCAL_RANK": "0",
    "WORLD_SIZE": "1",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29631",
}.items():
    os.environ.setdefault(key, value)

PROMPTS = [
    "Tom has 3 apples and buys 5 more. How many apples does he have?",
    "What is 12 times 7?",
    "A train travels 60 km in one hour. How far does it go in 3 hours?",
    "Name a prime number larger than 20.",
]


def chat(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def generation_speed(folder: str, completions: int, max_tokens: int) -> tuple[float, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    per_prompt = completions // len(PROMPTS)
    prompt_ids = [chat(tokenizer, p) for p in PROMPTS]

    llm = LLM(model=folder, dtype="float32", max_model_len=512, distributed_executor_backend="external_launcher")
    params = SamplingParams(n=per_prompt, temperature=1.0, top_p=1.0, max_tokens=max_tokens, seed=0)
    llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids[:1]], params, use_tqdm=False)  # warm-up
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
    vllm_seconds = time.perf_counter() - start
    vllm_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    del llm

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    batch = tokenizer.pad({"input_ids": [ids for ids in prompt_ids for _ in range(per_prompt)]}, return_tensors="pt")
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(**batch, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_tokens)
    hf_seconds = time.perf_counter() - start
    new = out[:, batch["input_ids"].size(1) :]
    ended = new == tokenizer.eos_token_id  # (N, T); vLLM counts up to and including the end token too
    lengths = torch.where(
        ended.any(1), ended.int().argmax(1) + 1, torch.full_like(ended[:, 0], new.size(1), dtype=torch.long)
    )
    hf_tokens = int(lengths.sum())
    return vllm_tokens / vllm_seconds, hf_tokens / hf_seconds


def step_time(folder: str, use_vllm: bool, steps: int, max_tokens: int) -> float:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from dapo_trl import DAPOConfig, DAPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in PROMPTS * 8]})
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

        def on_train_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter())

    args = DAPOConfig(
        output_dir=f"/tmp/vllm-speed-{use_vllm}",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        max_steps=steps + 1,  # the first step is warm-up
        num_generations=4,
        per_device_train_batch_size=16,
        max_completion_length=max_tokens,
        dynamic_sampling=False,
        use_vllm=use_vllm,
        vllm_mode="colocate",
        vllm_max_model_length=512,
        learning_rate=1e-6,
        warmup_steps=0,
        disable_tqdm=True,
        logging_steps=1,
    )
    trainer = DAPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [float(len(c[0]["content"]) % 2) for c in completions]],
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.train()
    return (times[-1] - times[1]) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        default=os.environ.get("DAPO_TRL_SMOLLM2"),
        required="DAPO_TRL_SMOLLM2" not in os.environ,
        help="SmolLM2-135M-Instruct folder (scripts/get_smollm2.py), or $DAPO_TRL_SMOLLM2",
    )
    parser.add_argument("--completions", type=int, default=64, help="completions generated per engine")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per completion (EOS ignored)")
    parser.add_argument("--steps", type=int, default=2, help="DAPO optimizer steps timed per arm (vLLM on / off)")
    parser.add_argument("--step-tokens", type=int, default=64, help="max_completion_length of the timed steps")
    parser.add_argument("--skip-steps", action="store_true", help="measure generation only, no DAPO steps")
    options = parser.parse_args()

    vllm_rate, hf_rate = generation_speed(options.model, options.completions, options.max_tokens)
    print(f"generation, {options.completions} completions <= {options.max_tokens} tokens, T=1:")
    print(
        f"  vLLM-CPU {vllm_rate:.1f} tokens/s, transformers generate {hf_rate:.1f} tokens/s: {vllm_rate / hf_rate:.2f}x"
    )
    if options.skip_steps:
        return
    on = step_time(options.model, True, options.steps, options.step_tokens)
    off = step_time(options.model, False, options.steps, options.step_tokens)
    print(
        f"DAPO step, 16 completions <= {options.step_tokens} tokens, mean of {options.steps} steps after one warm-up:"
    )
    print(f"  use_vllm=True {on:.1f} s, use_vllm=False {off:.1f} s: the vLLM step takes {on / off:.2f}x the time")


if __name__ == "__main__":
    main()
