"""Write the synthetic multiple-choice set of `examples/train_domain_qa.py` (fictional drugs and what they treat).

```
python examples/data/make_pharma_mcq.py        # rewrites pharma_mcq_train.jsonl and pharma_mcq_test.jsonl here
```

Thirty made-up drug names, each treating one of ten conditions. A question asks what one drug treats and offers the
right condition among four or five options (letters A-E) in random order. Train and test share the facts but never a
question (same drug, same options, same order), so held-out accuracy measures reading the options, not memorised
letters. Drugs are drawn with skewed frequencies, so the model learns some facts before others and groups of sampled
answers are mixed (dynamic sampling has something to filter). The rows follow the format documented in
`dapo_trl.rewards.choice`; `explanation` is what the CPU demo's supervised warm-up writes inside `<think>...</think>`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

CONDITIONS = ("fever", "cough", "rash", "gout", "acne", "flu", "ulcer", "asthma", "anemia", "nausea")
HERE = Path(__file__).resolve().parent


def drug_names(n: int = 30, seed: int = 0) -> list[str]:
    rng = random.Random(f"drugs-{seed}")
    names: list[str] = []
    while len(names) < n:
        name = "".join(rng.choice(c) for c in ("bdfklmnprstvz", "aeiou", "lmnrstvx", "aeiou", "lnrsx"))
        if name.capitalize() not in names:
            names.append(name.capitalize())
    return names


def make_rows(n: int, *, split: str, seed: int = 0) -> list[dict]:
    """`n` questions of one split; the same seed gives the same facts in both splits and disjoint questions."""
    drugs = drug_names(seed=seed)
    treats = {drug: CONDITIONS[i % len(CONDITIONS)] for i, drug in enumerate(drugs)}
    weights = [1 / (1 + i % 10) for i in range(len(drugs))]  # some facts are seen far more often than others
    rng = random.Random(f"{split}-{seed}")
    seen: set[str] = set()
    rows: list[dict] = []
    while len(rows) < n:
        drug = rng.choices(drugs, weights=weights)[0]
        wrong = rng.sample([c for c in CONDITIONS if c != treats[drug]], rng.choice((3, 4)))
        options = [treats[drug], *wrong]
        rng.shuffle(options)
        key = f"{drug}:{','.join(options)}"
        if key in seen or _in_train(key, seed) != (split == "train"):
            continue
        seen.add(key)
        rows.append({
            "question": f"What does {drug} treat?",
            "options": options,
            "answer": "ABCDE"[options.index(treats[drug])],
            "explanation": treats[drug],
        })  # fmt: skip
    return rows


def _in_train(key: str, seed: int) -> bool:
    return random.Random(f"{key}-{seed}").random() >= 0.1  # one question in ten is reserved for the test split


def main() -> None:
    for split, n in (("train", 1500), ("test", 200)):
        path = HERE / f"pharma_mcq_{split}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in make_rows(n, split=split)))
        print(f"wrote {path} ({n} rows)")


if __name__ == "__main__":
    main()
