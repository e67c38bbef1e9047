"""Write the word-problem files of configs/smollm2_cpu.yaml (benchmarks/real_model.py's generator; seeded).

    python examples/data/word_problems/make_word_problems.py

sft.jsonl: 2,000 one- and two-step training problems (60% two-step) with the warm-up's `target` (a worked line, then
`Answer: <n>`); train_one_step.jsonl: 2,000 one-step training problems for RL; heldout_one_step.jsonl: 150 one-step
problems of the held-out split (disjoint from the training split by question text).
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "benchmarks"))
from real_model import make_word_problems  # noqa: E402


def write(name: str, rows) -> None:
    with open(HERE / name, "w") as f:
        for row in rows:
            question = row["prompt"][-1]["content"]  # the user turn: question and answer-format instruction
            f.write(json.dumps({"question": question, **{k: row[k] for k in ("answer", "target", "steps")}}) + "\n")


if __name__ == "__main__":
    write("sft.jsonl", make_word_problems(2000, seed=0, split="train", two_step_frac=0.6))
    write("train_one_step.jsonl", make_word_problems(2000, seed=1, split="train", two_step_frac=0.0))
    write("heldout_one_step.jsonl", make_word_problems(150, seed=2, split="test", two_step_frac=0.0))
