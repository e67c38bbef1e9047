"""DAPOTrainer with colocated vLLM on CPU, run as its own process (vLLM's offline engine needs a `__main__` guard).

Usage: python tests/scripts/vllm_run.py OUT.json [--model DIR] [--steps N] [--dynamic-sampling] [--no-head-repack]
[--save-steps N] [--resume CHECKPOINT] [--output-dir DIR] [--completion-length N] [--batch N] [--untied]
[--lora MODULES [--modules-to-save MODULES]] [--lr LR]

After every weight sync it compares vLLM's log-probabilities of a fixed text with the trainer model's and writes,
to OUT.json: the largest gap per generation, the weight syncs per optimizer step, the logged metrics and a checksum
of the final weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

for key, value in {
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",  # both cores (the default reserves one for the scheduler)
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_CI_ENV": "1",  # eager start: ~10 s instead of 1-3 minutes of torch.compile
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}.items():
    os.environ.setdefault(key, value)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FIXED_TEXT = "12+34=46\nq7? the answer is 3"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dynamic-sampling", action="store_true")
    parser.add_argument("--no-head-repack", action="store_true")
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--resume")
    parser.add_argument("--output-dir", default="vllm-run")
    parser.add_argument("--completion-length", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--round-sizing", default="adaptive")
    parser.add_argument("--vllm-dtype", default="auto")
    parser.add_argument("--unsaved-model", action="store_true", help="an in-memory model whose folder does not exist")
    parser.add_argument("--untied", action="store_true", help="the tiny model with an output head of its own")
    parser.add_argument("--lora", help="train a LoRA adapter on these comma-separated modules (PEFT)")
    parser.add_argument("--modules-to-save", help="with --lora: train full copies of these comma-separated modules")
    parser.add_argument("--lr", type=float, default=1e-3)
    options = parser.parse_args()

    import torch
    from _tiny import ScriptedReward, config, scripted_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dapo_trl import DAPOTrainer
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model
    from dapo_trl.trainer import vllm_colocate

    if options.no_head_repack:  # the stale-head failure the CPU sync prevents
        vllm_colocate.repack_vocab_layers = lambda model: []

    folder = options.model
    if folder is None:
        tokenizer = build_char_tokenizer()
        model = build_tiny_model(tokenizer, hidden_size=64, num_heads=2)  # head_dim 32: vLLM's CPU attention has no 16
        if options.untied:
            model.config.tie_word_embeddings = False
            head = model.model.embed_tokens.weight.detach().clone()
            model.lm_head.weight = torch.nn.Parameter(head + 0.02 * torch.randn_like(head))
        folder = str(Path(options.output_dir) / "model")
        if options.unsaved_model:
            folder = str(Path(options.output_dir) / "never-saved")
        else:
            model.save_pretrained(folder)
            tokenizer.save_pretrained(folder)
    if options.unsaved_model:
        model.name_or_path = folder
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token

    text_ids = tokenizer(FIXED_TEXT)["input_ids"]
    gaps: list[dict] = []

    class Checked(DAPOTrainer):
        def _generate_single_turn(self, *args, **kwargs):
            out = super()._generate_single_turn(*args, **kwargs)  # syncs the weights when the step changed
            gaps.append({"step": self.state.global_step, "gap": logprob_gap(self)})
            return out

    def logprob_gap(trainer) -> float:
        from vllm import SamplingParams

        llm = trainer.vllm_generation.llm
        params = SamplingParams(max_tokens=1, prompt_logprobs=0)
        result = llm.generate([{"prompt_token_ids": text_ids}], params, use_tqdm=False)[0]
        served = torch.tensor([next(iter(d.values())).logprob for d in result.prompt_logprobs[1:]])
        policy = trainer.accelerator.unwrap_model(trainer.model)
        was_training = policy.training
        policy.eval()
        with torch.no_grad():
            logits = policy(torch.tensor([text_ids])).logits[0, :-1].float()
        policy.train(was_training)
        expected = logits.log_softmax(-1).gather(1, torch.tensor(text_ids[1:])[:, None])[:, 0]
        return (served - expected).abs().max().item()

    peft_config = None
    if options.lora:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=options.lora.split(","),
            modules_to_save=options.modules_to_save.split(",") if options.modules_to_save else None,
        )

    args = config(
        Path(options.output_dir),
        learning_rate=options.lr,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=128,
        max_steps=options.steps,
        dynamic_sampling=options.dynamic_sampling,
        num_generations=options.num_generations,
        per_device_train_batch_size=options.batch,
        max_completion_length=options.completion_length,
        save_strategy="steps" if options.save_steps else "no",
        save_steps=options.save_steps or 500,
        dynamic_sampling_max_rounds=6,
        dynamic_sampling_round_sizing=options.round_sizing,
        vllm_dtype=options.vllm_dtype,
    )
    trainer = Checked(
        model=model,
        reward_funcs=[ScriptedReward()],
        args=args,
        train_dataset=scripted_dataset(),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    trainer.train(resume_from_checkpoint=options.resume)
    history = trainer.state.log_history
    final = [p.detach().double().sum().item() for p in trainer.model.parameters()]
    Path(options.out).write_text(
        json.dumps(
            {
                "gaps": gaps,
                "history": history,
                "weight_syncs_total": trainer._weight_syncs,
                "checksum": final,
                "engine_dtype": str(trainer.vllm_generation.llm.llm_engine.model_config.dtype),
            }
        )
    )


if __name__ == "__main__":
    main()
