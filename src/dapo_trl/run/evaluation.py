"""Evaluation of math policies: avg@k, pass@k and maj@k (DAPO §4.1 reports avg@32 on AIME 2024).

The metric functions are pure and take lists; [`evaluate`] samples `k` completions per prompt and feeds them through
a scorer `(completion, answer) -> bool`.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

Scorer = Callable[[str, str], bool]

_ANSWER_LINE = re.compile(r"Answer\s*:\s*(.+)")


def extract_answer_line(completion: str) -> str | None:
    """
    Return the text after the last `Answer:` in a completion (DAPO's answer format), stripped, or `None`.

    Example:
    ```python
    >>> extract_answer_line("12+30=42\\nAnswer: 42")
    '42'
    >>> extract_answer_line("no answer here") is None
    True

    ```
    """
    matches = _ANSWER_LINE.findall(completion)
    if not matches:
        return None
    # "$42$", "42." and "$42$." are common decorations of a plain answer
    answer = matches[-1].strip().rstrip(".").strip("$ ").rstrip(".")
    return answer or None


def _normalize(answer: str) -> str:
    return re.sub(r"\s+", "", answer).strip("$").rstrip(".")


def exact_match_scorer(completion: str, answer: str) -> bool:
    """
    Whitespace-insensitive exact match of the last `Answer:` line against the reference; integers compare by value.

    A deliberately simple scorer: pass `dapo_trl`'s math verifier for real benchmarks.

    Example:
    ```python
    >>> exact_match_scorer("Answer: 007", "7")
    True
    >>> exact_match_scorer("Answer: 1/2", "\\\\frac{1}{2}")
    False

    ```
    """
    predicted = extract_answer_line(completion)
    if predicted is None:
        return False
    predicted, reference = _normalize(predicted), _normalize(str(answer))
    if re.fullmatch(r"[+-]?\d+", predicted) and re.fullmatch(r"[+-]?\d+", reference):
        return int(predicted) == int(reference)
    return predicted == reference


# ---------------------------------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------------------------------


def avg_at_k(correct: Sequence[Sequence[bool]]) -> float:
    """
    Mean accuracy over all `k` samples of all prompts (avg@k), the metric DAPO reports (avg@32).

    Args:
        correct (`Sequence[Sequence[bool]]`):
            `correct[i][j]` is whether sample `j` of prompt `i` is right. Prompts may have different sample counts;
            each prompt weighs the same.

    Example:
    ```python
    >>> avg_at_k([[True, False], [True, True]])
    0.75

    ```
    """
    if len(correct) == 0:
        raise ValueError("avg_at_k needs at least one prompt.")
    per_prompt = []
    for samples in correct:
        if len(samples) == 0:
            raise ValueError("Every prompt needs at least one sample.")
        per_prompt.append(sum(bool(c) for c in samples) / len(samples))
    return sum(per_prompt) / len(per_prompt)


def pass_at_k(n: int, c: int, k: int) -> float:
    r"""
    Unbiased pass@k estimator of Chen et al. (2021), for one prompt with `n` samples of which `c` are correct.

    $$
    \text{pass@}k = 1 - \binom{n - c}{k} \Big/ \binom{n}{k}
    $$

    computed with exact integer binomials (Python divides big integers with correct rounding).

    Example:
    ```python
    >>> pass_at_k(5, 2, 1)
    0.4
    >>> pass_at_k(5, 0, 3)
    0.0
    >>> pass_at_k(5, 3, 3)
    1.0

    ```
    """
    if not 0 <= c <= n:
        raise ValueError(f"Need 0 <= c <= n, got n={n}, c={c}.")
    if not 1 <= k <= n:
        raise ValueError(f"Need 1 <= k <= n, got n={n}, k={k}.")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(correct: Sequence[Sequence[bool]], k: int) -> float:
    """Mean of [`pass_at_k`] over prompts, with `n` = the number of samples of each prompt."""
    if len(correct) == 0:
        raise ValueError("mean_pass_at_k needs at least one prompt.")
    return sum(pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct) / len(correct)


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """
    Index of the first sample carrying the most frequent extracted answer; `None` answers do not vote.

    Ties go to the answer that appears first among the samples, so the result is deterministic.

    Example:
    ```python
    >>> majority_vote(["3", "4", "4", "3"])  # tie 2-2: "3" came first
    0
    >>> majority_vote([None, "5", "6", "6"])
    2
    >>> majority_vote([None, None]) is None
    True

    ```
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    for index, answer in enumerate(answers):
        if answer is not None and counts[answer] == best:
            return index
    return None  # unreachable


def maj_at_k(answers: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]]) -> float:
    """
    Majority-vote accuracy (maj@k): for each prompt, the sample holding the most frequent answer decides.

    Args:
        answers (`Sequence[Sequence[str | None]]`):
            Normalised extracted answer of each sample (`None` when none was found). Equivalent answers must already
            be spelled the same (e.g. normalised by the verifier).
        correct (`Sequence[Sequence[bool]]`):
            Whether each sample is right; same shape as `answers`.

    Example:
    ```python
    >>> maj_at_k([["3", "4", "4"], ["1", None, "2"]], [[False, True, True], [True, False, False]])
    1.0

    ```
    """
    if len(answers) != len(correct):
        raise ValueError(f"answers and correct differ in length: {len(answers)} != {len(correct)}.")
    if len(answers) == 0:
        raise ValueError("maj_at_k needs at least one prompt.")
    hits = 0
    for prompt_answers, prompt_correct in zip(answers, correct, strict=True):
        if len(prompt_answers) != len(prompt_correct):
            raise ValueError("answers and correct must have the same number of samples per prompt.")
        winner = majority_vote(prompt_answers)
        hits += winner is not None and bool(prompt_correct[winner])
    return hits / len(answers)


# ---------------------------------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------------------------------


def sample_completions(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str | list[dict[str, str]]],
    *,
    k: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    batch_size: int = 32,
    seed: int | None = 0,
    progress: bool = False,
    chat_template_kwargs: dict[str, Any] | None = None,
    max_prompt_length: int | None = None,
    prompt_truncation_side: str = "left",
) -> list[list[str]]:
    """
    Sample `k` completions per prompt with transformers `generate` (left padding, special tokens skipped).

    Prompts are encoded as `DAPOTrainer` encodes them for training (see [`encode_prompts`]): chat-message prompts
    through the tokenizer's chat template with a generation prompt (and `chat_template_kwargs`), plain-text prompts as
    they are, then cut to `max_prompt_length` tokens on `prompt_truncation_side` (DAPOConfig's settings of the same
    names). `batch_size` counts prompts; each batch holds `batch_size * k` sequences.

    Returns:
        `list[list[str]]`: `k` decoded completions for each prompt, in order.
    """
    import torch
    from tqdm.auto import tqdm

    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")
    if not do_sample and k > 1:
        logger.warning("Greedy decoding with k=%d yields %d identical completions per prompt.", k, k)
    texts, add_special_tokens = encode_prompts(tokenizer, prompts, chat_template_kwargs=chat_template_kwargs)
    if seed is not None:
        torch.manual_seed(seed)
    previous_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    gen_kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": do_sample,
        "num_return_sequences": k if do_sample else 1,  # greedy: one completion, repeated (generate refuses k > 1)
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if do_sample:
        # top_k=0 disables transformers' default top-k=50 so that temperature/top-p alone shape the distribution
        gen_kwargs.update(temperature=temperature, top_p=top_p, top_k=0)
    else:
        gen_kwargs.update(temperature=None, top_p=None, top_k=None)
    out: list[list[str]] = []
    try:
        batches = range(0, len(texts), batch_size)
        for start in tqdm(batches, desc="sampling", disable=not progress, unit="batch"):
            chunk = texts[start : start + batch_size]
            ids = tokenizer(chunk, add_special_tokens=add_special_tokens)["input_ids"]
            if max_prompt_length is not None:
                from ..trainer.dataset_checks import truncate_prompt_ids

                ids, _ = truncate_prompt_ids(ids, max_prompt_length, prompt_truncation_side)
            enc = tokenizer.pad({"input_ids": ids}, return_tensors="pt").to(device)
            with torch.no_grad():
                generated = model.generate(**enc, **gen_kwargs)  # (len(chunk) * k, P + C); len(chunk) when greedy
            decoded = tokenizer.batch_decode(generated[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            per_prompt = k if do_sample else 1
            out.extend(decoded[i * per_prompt : (i + 1) * per_prompt] * (k // per_prompt) for i in range(len(chunk)))
    finally:
        tokenizer.padding_side = previous_side
        model.train(was_training)
    return out


def encode_prompts(
    tokenizer: Any,
    prompts: Sequence[str | list[dict[str, str]]],
    *,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> tuple[list[str], bool]:
    """
    The text the model sees for each prompt, and whether the tokenizer adds its special tokens when encoding it.

    The same rule as TRL's `GRPOTrainer` in training: chat messages go through `apply_chat_template` with
    `add_generation_prompt=True` and the run's `chat_template_kwargs` (the template writes the special tokens itself),
    plain text is encoded as it is with the tokenizer's usual special tokens (e.g. a BOS).

    Returns:
        `tuple[list[str], bool]`: rendered prompts, and `add_special_tokens` for `tokenizer(texts, ...)`.
    """
    conversational = [not isinstance(p, str) for p in prompts]
    if any(conversational) and not all(conversational):
        raise ValueError("Prompts mix plain text and chat messages; give all of them in one format.")
    if not any(conversational):
        return list(prompts), True
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            "The prompts are chat messages but the tokenizer has no chat template; set one on the tokenizer, or "
            "evaluate plain-text prompts (--chat no) if that is how the model was trained."
        )
    kwargs = dict(chat_template_kwargs or {})
    texts = [
        tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True, **kwargs) for p in prompts
    ]
    return texts, False


def _sample_vllm(
    model_path: str | None,
    prompts: Sequence[str | list[dict[str, str]]],
    *,
    k: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    chat_template_kwargs: dict[str, Any] | None = None,
    tokenizer: Any = None,
    max_prompt_length: int | None = None,
    prompt_truncation_side: str = "left",
    engine: Any = None,
    dtype: str | None = None,
) -> list[list[str]]:
    """
    `k` completions per prompt from vLLM: from `engine` (an `LLM` already holding the weights, e.g. a trainer's
    colocated one) or else a new `LLM` loaded from `model_path` (in `dtype`, default vLLM's choice). Prompts are
    rendered and cut as [`sample_completions`] does; `temperature=0` is greedy.
    """
    from vllm import SamplingParams

    if engine is None:
        from vllm import LLM

        engine = LLM(model=model_path, seed=seed or 0, **({"dtype": dtype} if dtype else {}))
    params = SamplingParams(n=k, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, seed=seed)
    texts, special = encode_prompts(tokenizer, prompts, chat_template_kwargs=chat_template_kwargs)
    ids = tokenizer(texts, add_special_tokens=special)["input_ids"]  # as in training: render, tokenise, cut
    if max_prompt_length is not None:
        from ..trainer.dataset_checks import truncate_prompt_ids

        ids, _ = truncate_prompt_ids(ids, max_prompt_length, prompt_truncation_side)
    results = engine.generate([{"prompt_token_ids": list(i)} for i in ids], params, use_tqdm=False)
    return [[o.text for o in r.outputs] for r in results]


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def choose_backend(
    requested: str, *, model_is_path: bool, run_used_vllm: bool, vllm_importable: bool, cuda: bool
) -> str:
    """
    The generation backend of an evaluation: `requested` unless it is `"auto"`, which picks vLLM for a saved model
    when vLLM is importable and either a GPU is there or the run that trained the model generated with vLLM (vLLM's
    CPU build then runs here too), else transformers.

    Example:
    ```python
    >>> choose_backend("auto", model_is_path=True, run_used_vllm=True, vllm_importable=True, cuda=False)
    'vllm'
    >>> choose_backend("auto", model_is_path=True, run_used_vllm=True, vllm_importable=False, cuda=False)
    'transformers'

    ```
    """
    if requested != "auto":
        return requested
    return "vllm" if model_is_path and vllm_importable and (cuda or run_used_vllm) else "transformers"


# ---------------------------------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------------------------------


def cluster_answers(answers: Sequence[str | None], equivalent: Callable[[str, str], bool]) -> list[str | None]:
    """
    Map each answer to the first earlier answer it is equivalent to, so that majority voting counts `0.5` and
    `\\frac{1}{2}` as one answer. `None` stays `None`.

    Example:
    ```python
    >>> cluster_answers(["2", "2.0", None, "3"], lambda a, b: float(a) == float(b))
    ['2', '2', None, '3']

    ```
    """
    representatives: list[str] = []
    out: list[str | None] = []
    for answer in answers:
        if answer is None:
            out.append(None)
            continue
        match = next((r for r in representatives if r == answer or equivalent(r, answer)), None)
        if match is None:
            representatives.append(answer)
            match = answer
        out.append(match)
    return out


def _verifier_scorer(completion: str, answer: str, extraction: str = "strict", rule: str = "equivalence") -> bool:
    from ..verifier import score_completion

    return bool(score_completion(completion, answer, extraction=extraction, rule=rule))


def _drop_unscorable(prompts: list, answers: list) -> tuple[list, list, int]:
    """Leave out rows whose gold answer the verifier cannot use (`None`, blank, junk): no accuracy can be measured on
    them, and scoring them as wrong would understate it. Warns with the count; refuses a set with no usable row."""
    from ..verifier import extract_gold_answer

    usable = [extract_gold_answer(a) is not None for a in answers]
    dropped = usable.count(False)
    if dropped == len(answers):
        raise ValueError(
            f"None of the {len(answers)} gold answers of the evaluation set can be scored (e.g. {answers[0]!r}): check "
            "the answer column."
        )
    if dropped:
        logger.warning(
            f"{dropped} of {len(answers)} evaluation rows have a gold answer that cannot be scored; they are left out "
            "of every metric (num_unscorable_prompts)."
        )
    keep = [i for i, ok in enumerate(usable) if ok]
    return [prompts[i] for i in keep], [answers[i] for i in keep], dropped


def _verifier_equivalent(a: str, b: str) -> bool:
    from ..verifier import verify

    return verify(a, b)


def _verifier_extract(completion: str, extraction: str = "strict") -> str | None:
    from ..verifier import extract_answer

    return extract_answer(completion, extraction=extraction)


def _verifier_functions(extraction: str, rule: str) -> tuple[Scorer, Callable, Callable]:
    """Scorer, answer extractor and vote equivalence for the CLI's `--extraction` and `--reward_rule`."""
    import functools

    scorer = functools.partial(_verifier_scorer, extraction=extraction, rule=rule)
    if rule == "dapo":  # votes are the rule's normalised answers, equal when identical
        return scorer, _dapo_extract, str.__eq__
    return scorer, functools.partial(_verifier_extract, extraction=extraction), _verifier_equivalent


def _dapo_extract(completion: str) -> str | None:
    from ..verifier import dapo_rule

    answer = dapo_rule.extract(completion)
    return None if answer == dapo_rule.INVALID else answer


def pass_ks(k: int) -> list[int]:
    """The `k` of pass@k to report for `k` samples: 1, powers of two below `k`, and `k`."""
    ks = [1]
    while ks[-1] * 2 < k:
        ks.append(ks[-1] * 2)
    if ks[-1] != k:
        ks.append(k)
    return ks


def evaluate(
    model_or_path: Any,
    dataset: Any,
    *,
    k: int = 32,
    temperature: float = 1.0,
    top_p: float = 0.7,
    max_new_tokens: int = 20480,
    backend: str = "auto",
    scorer: Scorer | None = None,
    answer_extractor: Callable[[str], str | None] | None = None,
    answer_equivalent: Callable[[str, str], bool] | None = None,
    tokenizer: Any = None,
    use_chat_template: bool | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    max_prompt_length: int | None = None,
    prompt_truncation_side: str | None = None,
    batch_size: int = 8,
    seed: int | None = 0,
    progress: bool = True,
    return_samples: bool = False,
    vllm_engine: Any = None,
    vllm_dtype: str | None = None,
) -> dict[str, Any]:
    """
    Sample `k` completions per prompt and report avg@k, pass@k and maj@k.

    The defaults are DAPO §4.1's evaluation: avg@32 at temperature 1.0 and top-p 0.7, with up to 20,480 new tokens
    (the paper's generation limit, 16,384 + 4,096). Pass the run's own `max_completion_length` for smaller models.

    Args:
        model_or_path (`PreTrainedModel` or `str`):
            A model, or the path of a saved checkpoint (loaded with `AutoModelForCausalLM`, on CUDA when available).
        temperature (`float`, *optional*, defaults to `1.0`):
            Sampling temperature; `0` is greedy decoding (top-p then plays no part).
        dataset (`datasets.Dataset`):
            With `prompt` (string or chat-message list) and `answer` columns, as [`dapo_trl.run.data.load_math_dataset`]
            returns.
        k (`int`, *optional*, defaults to `32`):
            Samples per prompt.
        backend (`str`, *optional*, defaults to `"auto"`):
            `"transformers"` (`generate`), `"vllm"` (a saved model's path, or `vllm_engine`) or `"auto"` (see
            [`choose_backend`]: vLLM when importable and given a path, with a GPU or when the model's run record says
            its run generated with vLLM; else transformers).
        scorer (`Callable[[str, str], bool]`, *optional*):
            `(completion, answer) -> correct`. Defaults to `dapo_trl.verifier.score_completion`.
        answer_extractor (`Callable[[str], str | None]`, *optional*):
            Final answer of a completion, for maj@k. Defaults to `dapo_trl.verifier.extract_answer`.
        answer_equivalent (`Callable[[str, str], bool]`, *optional*):
            Whether two extracted answers are the same vote. Defaults to `dapo_trl.verifier.verify`.
        tokenizer (`PreTrainedTokenizerBase`, *optional*):
            Needed with a model object; loaded from the path otherwise.
        max_new_tokens (`int`, *optional*, defaults to `20480`):
            New-token limit of each completion (DAPO §4.1: 20,480).
        use_chat_template (`bool`, *optional*):
            The prompt format the model was trained with. `True`: plain-text prompts become a user message and every
            prompt goes through the chat template; `False`: chat-message prompts are flattened to their text and
            nothing is templated (as `load_math_dataset(conversational=False)` does for training). Defaults to the
            format recorded in the run folder (`dapo_run.json`, see `dapo_trl.run.run_record`) when `model_or_path` is one,
            else to whether the tokenizer has a chat template (a guess, logged as such).
        chat_template_kwargs (`dict`, *optional*):
            Extra arguments of `apply_chat_template`, as the run's `chat_template_kwargs`. Defaults to the recorded
            ones, when the run folder has a record.
        max_prompt_length (`int`, *optional*), prompt_truncation_side (`str`, *optional*):
            Cut prompts as the run's DAPOConfig did (`"left"` keeps their end). Default to the recorded values, else
            no limit.
        batch_size (`int`, *optional*, defaults to `8`):
            Prompts per `generate` call (each with `k` samples).
        return_samples (`bool`, *optional*, defaults to `False`):
            Also return the completions, extracted answers and verdicts under `"samples"`.
        vllm_engine (`vllm.LLM`, *optional*):
            An engine that already holds the model's weights (a trainer's colocated one, synced): sample with it
            instead of loading the model again; implies `backend="vllm"` and needs `tokenizer`.
        vllm_dtype (`str`, *optional*):
            Dtype of a vLLM engine loaded from the path (default: the run record's, else vLLM's choice).

    Returns:
        `dict[str, Any]`: `avg@k`, `pass@j` for j in [`pass_ks`], `maj@k`, `num_prompts`, `k`,
        `mean_completion_chars`, `no_answer_frac`.
    """
    if backend not in ("auto", "transformers", "vllm"):
        raise ValueError(f"backend must be 'auto', 'transformers' or 'vllm', got {backend!r}.")
    for column in ("prompt", "answer"):
        if column not in dataset.column_names:
            raise ValueError(f"The dataset needs a {column!r} column; it has {dataset.column_names}.")
    scorer = scorer or _verifier_scorer
    answer_extractor = answer_extractor or _verifier_extract
    answer_equivalent = answer_equivalent or _verifier_equivalent
    record = _run_record_of(model_or_path)
    recorded = record.evaluation if record is not None else None
    if vllm_engine is not None:
        backend = "vllm"
    elif backend == "auto":
        import torch

        backend = choose_backend(
            backend,
            model_is_path=isinstance(model_or_path, str),
            run_used_vllm=recorded is not None and recorded.backend == "vllm",
            vllm_importable=vllm_installed(),
            cuda=torch.cuda.is_available(),
        )
    if backend == "vllm" and vllm_engine is None and not isinstance(model_or_path, str):
        raise ValueError("backend='vllm' needs the path of a saved model (or vllm_engine=), not a model object.")
    if vllm_dtype is None and recorded is not None:
        vllm_dtype = recorded.vllm_dtype

    if tokenizer is None:
        if not isinstance(model_or_path, str):
            raise ValueError("Pass tokenizer= together with a model object.")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_or_path)
        if tokenizer.pad_token is None:  # e.g. Llama: batched generation needs a pad token
            tokenizer.pad_token = tokenizer.eos_token
    use_chat_template, chat_template_kwargs, max_prompt_length, prompt_truncation_side = _prompt_format(
        model_or_path, tokenizer, use_chat_template, chat_template_kwargs, max_prompt_length, prompt_truncation_side
    )
    prompts = [_as_format(p, use_chat_template) for p in dataset["prompt"]]
    answers = list(dataset["answer"])  # kept as they are: a one-element list must not become the string "['1']"
    unscorable = 0
    if getattr(scorer, "func", scorer) is _verifier_scorer:  # the verifier, possibly with the CLI's options bound
        prompts, answers, unscorable = _drop_unscorable(prompts, answers)

    logger.info("Sampling %d x %d completions with %s.", len(prompts), k, backend)
    if backend == "vllm":  # the vllm tier runs it (tests/test_vllm.py)
        completions = _sample_vllm(
            model_or_path if isinstance(model_or_path, str) else None,
            prompts,
            k=k,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            chat_template_kwargs=chat_template_kwargs,
            tokenizer=tokenizer,
            max_prompt_length=max_prompt_length,
            prompt_truncation_side=prompt_truncation_side,
            engine=vllm_engine,
            dtype=vllm_dtype,
        )
    else:
        model = model_or_path
        if isinstance(model, str):
            import torch
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model, dtype="auto")
            if torch.cuda.is_available():
                model = model.to("cuda")
        completions = sample_completions(
            model,
            tokenizer,
            prompts,
            k=k,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            do_sample=temperature > 0,
            batch_size=batch_size,
            seed=seed,
            progress=progress,
            chat_template_kwargs=chat_template_kwargs,
            max_prompt_length=max_prompt_length,
            prompt_truncation_side=prompt_truncation_side,
        )
    correct = [[scorer(c, a) for c in group] for group, a in zip(completions, answers, strict=True)]
    extracted = [[answer_extractor(c) for c in group] for group in completions]
    votes = [cluster_answers(group, answer_equivalent) for group in extracted]
    flat = [c for group in completions for c in group]
    metrics: dict[str, Any] = {"num_prompts": len(prompts), "k": k, f"avg@{k}": avg_at_k(correct)}
    metrics["num_unscorable_prompts"] = unscorable
    for j in pass_ks(k):
        metrics[f"pass@{j}"] = mean_pass_at_k(correct, j)
    metrics[f"maj@{k}"] = maj_at_k(votes, correct)
    metrics["mean_completion_chars"] = sum(len(c) for c in flat) / len(flat)
    metrics["no_answer_frac"] = sum(a is None for group in extracted for a in group) / len(flat)
    if return_samples:
        metrics["samples"] = [
            {"prompt": p, "answer": a, "completions": c, "extracted": e, "correct": r}
            for p, a, c, e, r in zip(prompts, answers, completions, extracted, correct, strict=True)
        ]
    return metrics


def _prompt_format(
    model_or_path: Any,
    tokenizer: Any,
    use_chat_template: bool | None,
    chat_template_kwargs: dict[str, Any] | None,
    max_prompt_length: int | None,
    prompt_truncation_side: str | None,
) -> tuple[bool, dict[str, Any], int | None, str]:
    """Fill the prompt-format settings not given from the run record of `model_or_path`, if it has one."""
    record = _run_record_of(model_or_path)
    if record is not None:
        recorded = record.prompt_format
        use_chat_template = recorded.conversational if use_chat_template is None else use_chat_template
        chat_template_kwargs = recorded.chat_template_kwargs if chat_template_kwargs is None else chat_template_kwargs
        max_prompt_length = recorded.max_prompt_length if max_prompt_length is None else max_prompt_length
        prompt_truncation_side = prompt_truncation_side or recorded.prompt_truncation_side
    if use_chat_template is None:
        use_chat_template = getattr(tokenizer, "chat_template", None) is not None
        if use_chat_template:
            logger.warning(
                "No record of the prompt format the model was trained with: applying the tokenizer's chat template "
                "because it has one. Pass use_chat_template=False if the model was trained on plain-text prompts."
            )
    return use_chat_template, dict(chat_template_kwargs or {}), max_prompt_length, prompt_truncation_side or "left"


def _run_record_of(model_or_path: Any) -> Any:
    """The run record (`dapo_run.json`) of a saved model's folder, `None` for a model object or a folder without one."""
    from .run_record import read_run_record

    return read_run_record(model_or_path) if isinstance(model_or_path, str) else None


def _as_format(prompt: Any, use_chat_template: bool) -> Any:
    from ..trainer.dataset_checks import prompt_text

    if use_chat_template:
        return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return prompt if isinstance(prompt, str) else prompt_text(prompt)


# Built-in defaults of the command line, used when neither the command line nor the run record gives a value
# (DAPO §4.1's evaluation: avg@32, temperature 1.0, top-p 0.7, up to 20,480 new tokens).
CLI_DEFAULTS: dict[str, Any] = {
    "k": 32,
    "temperature": 1.0,
    "top_p": 0.7,
    "max_new_tokens": 20480,
    "batch_size": 8,
    "seed": 0,
}


def build_parser() -> Any:
    """The evaluation command line's `argparse` parser (no file is touched by parsing alone)."""
    import argparse

    from .cli import non_negative_float, positive_int, probability
    from .data import DATASET_FORMATS

    parser = argparse.ArgumentParser(
        prog="python -m dapo_trl.evaluation",
        description="avg@k / pass@k / maj@k of a saved model on a math dataset. Settings not given here come from "
        "the run record (dapo_run.json) of the model's run folder, else from DAPO §4.1's evaluation.",
    )
    data = parser.add_argument_group("model and data")
    data.add_argument("--model", required=True, help="Folder of a saved model (a run folder), or a Hub model id.")
    data.add_argument("--dataset", required=True, help="Local data file or folder, or a Hub dataset id.")
    data.add_argument("--split", default="train", help="Split to evaluate; slicing works (default: %(default)s).")
    data.add_argument("--dataset_config", default=None, help="Hub configuration of the dataset (e.g. 'main').")
    data.add_argument(
        "--dataset_format",
        default=None,
        choices=DATASET_FORMATS,
        help="Where prompt and answer come from, and whether DAPO's template wraps the prompt (see "
        "dapo_trl.run.data.load_math_dataset). Default: the run record's (how the run read its data), else 'auto' "
        "(the columns decide).",
    )
    data.add_argument(
        "--prompt_column", default=None, help="Prompt/problem column (default: the run record's, else the format's)."
    )
    data.add_argument(
        "--answer_column", default=None, help="Answer column; dotted paths read dicts (default: as --prompt_column)."
    )
    data.add_argument("--no_template", action="store_true", help="Use raw problems, without DAPO's template.")
    data.add_argument("--max_samples", type=positive_int, default=None, help="Evaluate the first N prompts only.")

    sampling = parser.add_argument_group("sampling (default: the run record's, else DAPO §4.1's)")
    sampling.add_argument("--k", type=positive_int, default=None, help="Samples per prompt (default 32).")
    sampling.add_argument(
        "--temperature", type=non_negative_float, default=None, help="Default 1.0; 0 decodes greedily."
    )
    sampling.add_argument("--top_p", type=probability, default=None, help="Default 0.7.")
    sampling.add_argument("--max_new_tokens", type=positive_int, default=None, help="Default 20480 (§4.1).")
    sampling.add_argument("--batch_size", type=positive_int, default=None, help="Prompts per generate call (8).")
    sampling.add_argument("--seed", type=int, default=None, help="Default 0.")
    sampling.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "transformers", "vllm"),
        help="Generation backend; 'auto': vLLM when importable, with a GPU or when the run generated with vLLM "
        "(its record says so), else transformers.",
    )

    prompt = parser.add_argument_group("prompt format (default: the run record's)")
    prompt.add_argument(
        "--chat",
        default="auto",
        choices=("auto", "yes", "no"),
        help="Apply the tokenizer's chat template: auto = as the run trained (its record), else if it has one.",
    )
    prompt.add_argument("--system_prompt", default=None, help="System message (default: the run record's).")
    prompt.add_argument(
        "--max_prompt_length", type=positive_int, default=None, help="Cut longer prompts (default: the run record's)."
    )
    prompt.add_argument(
        "--prompt_truncation_side",
        default=None,
        choices=("left", "right", "error"),
        help="Where prompts longer than --max_prompt_length are cut, or 'error' (default: the run record's).",
    )
    prompt.add_argument("--ignore_run_record", action="store_true", help="Do not read the model's dapo_run.json.")

    scoring = parser.add_argument_group("scoring and output")
    scoring.add_argument(
        "--scorer", default="verifier", choices=("verifier", "exact"), help="Math verifier or exact match."
    )
    scoring.add_argument(
        "--extraction",
        default="strict",
        choices=("strict", "lenient"),
        help="Verifier answer extraction: 'strict' (boxed answer or Answer: line only, as in training) or 'lenient' "
        "(else the last math expression of the final sentence; for models not trained on an answer format).",
    )
    scoring.add_argument(
        "--reward_rule",
        default=None,
        choices=("equivalence", "dapo"),
        help="'equivalence' (this verifier) or 'dapo' (the DAPO paper's rule: last Answer: line of the last 300 "
        "characters, normalised exact match). Default: the run record's, else 'equivalence'.",
    )
    scoring.add_argument("--output", default=None, help="Write the metrics (and samples) as JSON here.")
    scoring.add_argument("--save_samples", action="store_true", help="Include every completion in --output.")
    return parser


def parse_cli(argv: Sequence[str] | None = None) -> Any:
    """
    Parse and check the command line, then fill the settings it leaves out from the model's run record.

    Every check names the flag or the path: a missing model folder or data file, a mistyped relative path (not sent
    to the Hub), an empty data file, a count below 1.
    """
    from .cli import check_data_path, check_model_path
    from .run_record import read_run_record

    parser = build_parser()
    args = parser.parse_args(argv)
    for problem in (check_model_path("--model", args.model), check_data_path("--dataset", args.dataset)):
        if problem:
            parser.error(problem)
    record = None
    if not args.ignore_run_record:
        try:
            record = read_run_record(args.model)
        except ValueError as error:
            parser.error(str(error))
    recorded = {} if record is None else vars(record.evaluation)
    for name, default in CLI_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, recorded.get(name, default))
    if args.reward_rule is None:  # score with the rule the run trained with
        args.reward_rule = recorded.get("reward_rule", "equivalence")
    if args.chat == "auto" and record is not None:
        args.chat = "yes" if record.prompt_format.conversational else "no"
    if record is not None and args.system_prompt is None:
        args.system_prompt = record.prompt_format.system_prompt
    if record is not None and args.dataset_format is None:  # read the file as the run read its data
        data_format = record.data_format
        args.dataset_format = data_format.dataset_format
        args.prompt_column = args.prompt_column or data_format.prompt_column
        args.answer_column = args.answer_column or data_format.answer_column
    args.dataset_format = args.dataset_format or "auto"
    if record is not None:
        recorded = record.prompt_format
        args.max_prompt_length = args.max_prompt_length or recorded.max_prompt_length
        args.prompt_truncation_side = args.prompt_truncation_side or recorded.prompt_truncation_side
    args.chat_template_kwargs = {} if record is None else record.prompt_format.chat_template_kwargs
    args.run_record = record
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """
    Command line: evaluate a saved model on a math dataset, as the run that trained it evaluated it.

    ```
    python -m dapo_trl.evaluation --model outputs/cpu-demo --dataset outputs/cpu-demo/heldout.jsonl
    python -m dapo_trl.evaluation --model PATH --dataset HuggingFaceH4/aime_2024 --split train --k 32 \\
        --temperature 1.0 --top_p 0.7 --max_new_tokens 20480 --output metrics.json
    ```
    """
    import json

    from .data import load_math_dataset

    args = parse_cli(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.run_record is not None:
        logger.info("Settings not given on the command line come from %s.", args.run_record.path)
    chat = {"auto": None, "yes": True, "no": False}[args.chat]
    try:
        dataset = load_math_dataset(
            args.dataset,
            split=args.split,
            config_name=args.dataset_config,
            dataset_format=args.dataset_format,
            prompt_column=args.prompt_column,
            answer_column=args.answer_column,
            apply_template=False if args.no_template else None,
            conversational=bool(chat),
            system_prompt=args.system_prompt,
            max_samples=args.max_samples,
        )
    except (ValueError, FileNotFoundError) as error:  # data that cannot be read as asked: one line, exit code 2
        build_parser().error(f"--dataset {args.dataset}: {error}")
    exact = args.scorer == "exact"
    scorer, extractor, equivalent = _verifier_functions(args.extraction, args.reward_rule)
    metrics = evaluate(
        args.model,
        dataset,
        k=args.k,
        temperature=args.temperature,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        backend=args.backend,
        scorer=exact_match_scorer if exact else scorer,
        answer_extractor=extract_answer_line if exact else extractor,
        answer_equivalent=(lambda a, b: _normalize(a) == _normalize(b)) if exact else equivalent,
        use_chat_template=chat,
        chat_template_kwargs=args.chat_template_kwargs,
        max_prompt_length=args.max_prompt_length,
        prompt_truncation_side=args.prompt_truncation_side,
        batch_size=args.batch_size,
        seed=args.seed,
        return_samples=args.save_samples,
    )
    summary = {key: value for key, value in metrics.items() if key != "samples"}
    print(json.dumps(summary, indent=2))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(metrics, f, indent=2)
    return metrics


if __name__ == "__main__":
    main()
