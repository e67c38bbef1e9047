import json
import math

import pytest
from datasets import Dataset

from dapo_trl.run.evaluation import (
    avg_at_k,
    cluster_answers,
    evaluate,
    exact_match_scorer,
    extract_answer_line,
    maj_at_k,
    majority_vote,
    mean_pass_at_k,
    pass_at_k,
    pass_ks,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 0, 3, 0.0),
        (5, 3, 3, 1.0),  # n - c < k: every draw of 3 holds a correct one
        (5, 5, 5, 1.0),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 3, 5, 1 - math.comb(7, 5) / math.comb(10, 5)),  # 1 - 21/252
    ],
)
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_product_form_for_large_n():
    n, c, k = 1000, 7, 32
    product = 1 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))
    assert pass_at_k(n, c, k) == pytest.approx(product, rel=1e-9)


def test_pass_at_k_is_monotone_in_k():
    values = [pass_at_k(16, 3, k) for k in range(1, 17)]
    assert values == sorted(values) and values[-1] == 1.0


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    correct = [[True, False, False, False, False], [False] * 5]
    assert mean_pass_at_k(correct, 1) == pytest.approx(0.1)
    assert mean_pass_at_k([[True, True]], 2) == 1.0


def test_avg_at_k_weighs_prompts_equally():
    assert avg_at_k([[True, False], [True, True]]) == 0.75
    # a prompt with 4 samples counts as much as one with 1
    assert avg_at_k([[True, True, True, True], [False]]) == 0.5
    with pytest.raises(ValueError):
        avg_at_k([])
    with pytest.raises(ValueError):
        avg_at_k([[]])


def test_majority_vote_ties_go_to_first_seen():
    assert majority_vote(["3", "4", "4", "3"]) == 0
    assert majority_vote(["4", "3", "3", "4"]) == 0
    assert majority_vote(["1", "2", "2"]) == 1
    assert majority_vote([None, None, "7"]) == 2  # None does not vote
    assert majority_vote([None]) is None


def test_maj_at_k():
    answers = [["3", "4", "4"], ["1", None, "2"], ["5", "6", "5"], [None, None]]
    correct = [[False, True, True], [True, False, False], [False, True, False], [False, False]]
    # prompt 1: "4" wins (right); prompt 2: tie "1"/"2" -> "1" first (right); prompt 3: "5" wins (wrong); 4: no vote
    assert maj_at_k(answers, correct) == 0.5
    with pytest.raises(ValueError):
        maj_at_k([["1"]], [[True, False]])


def test_cluster_answers_merges_equivalents():
    votes = cluster_answers(["0.5", "1/2", "2", None, "0.50"], lambda a, b: eval_fraction(a) == eval_fraction(b))
    assert votes == ["0.5", "0.5", "2", None, "0.5"]
    assert majority_vote(votes) == 0


def eval_fraction(text):
    num, _, den = text.partition("/")
    return float(num) / float(den or 1)


def test_answer_line_and_exact_scorer():
    assert extract_answer_line("Rev: 58\nAnswer: 85") == "85"
    assert extract_answer_line("Answer: 1\nAnswer: $2$.") == "2"
    assert extract_answer_line("no answer") is None
    assert exact_match_scorer("Answer: 007", "7")
    assert exact_match_scorer("Answer: x + 1", "x+1")
    assert not exact_match_scorer("Answer: 8", "7")
    assert not exact_match_scorer("85", "85")


def test_pass_ks():
    assert pass_ks(1) == [1]
    assert pass_ks(32) == [1, 2, 4, 8, 16, 32]
    assert pass_ks(12) == [1, 2, 4, 8, 12]


class _ScriptedModel:
    """Stands in for a model: `sample_completions` is patched, so only `evaluate`'s bookkeeping runs."""


def test_evaluate_metrics_with_patched_sampling(monkeypatch):
    scripted = {
        "p1": ["Answer: 1", "Answer: 1", "Answer: 2", "Answer: 9"],
        "p2": ["Answer: 3", "no idea", "Answer: 4", "Answer: 4"],
    }

    def fake_sample(model, tokenizer, prompts, *, k, **kwargs):
        assert k == 4 and kwargs["temperature"] == 1.0 and kwargs["top_p"] == 0.7
        return [scripted[p] for p in prompts]

    monkeypatch.setattr("dapo_trl.evaluation.sample_completions", fake_sample)

    class Tok:
        chat_template = None

    ds = Dataset.from_dict({"prompt": ["p1", "p2"], "answer": ["1", "3"]})
    m = evaluate(
        _ScriptedModel(),
        ds,
        k=4,
        tokenizer=Tok(),
        scorer=exact_match_scorer,
        answer_extractor=extract_answer_line,
        answer_equivalent=lambda a, b: a == b,
        return_samples=True,
    )
    assert m["avg@4"] == pytest.approx((2 / 4 + 1 / 4) / 2)
    assert m["pass@1"] == pytest.approx(m["avg@4"])
    assert m["pass@4"] == 1.0
    assert m["pass@2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)
    assert m["maj@4"] == pytest.approx(0.5)  # p1: "1" wins (right); p2: "4" wins (wrong)
    assert m["no_answer_frac"] == pytest.approx(1 / 8)
    assert m["samples"][1]["correct"] == [True, False, False, False]
    json.dumps(m)  # serialisable for the CLI's --output


def test_evaluate_rejects_bad_inputs():
    ds = Dataset.from_dict({"prompt": ["p"], "answer": ["1"]})
    with pytest.raises(ValueError, match="backend"):
        evaluate(object(), ds, backend="tgi")
    with pytest.raises(ValueError, match="tokenizer"):
        evaluate(object(), ds, backend="transformers")
    with pytest.raises(ValueError, match="'answer' column"):
        evaluate(object(), Dataset.from_dict({"prompt": ["p"]}), backend="transformers")


def test_cli_on_saved_checkpoint(tmp_path, capsys):
    from dapo_trl.run.evaluation import main
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"problem": f"What is {i}+1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    out = tmp_path / "metrics.json"
    main(
        [
            "--model", str(tmp_path / "ckpt"), "--dataset", str(data), "--no_template", "--k", "4",
            "--max_new_tokens", "6", "--scorer", "exact", "--backend", "transformers",
            "--output", str(out), "--save_samples",
        ]
    )  # fmt: skip
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed["num_prompts"] == 3 and printed["k"] == 4
    assert set(printed) >= {"avg@4", "pass@1", "pass@2", "pass@4", "maj@4"}
    assert len(saved["samples"]) == 3 and all(len(s["completions"]) == 4 for s in saved["samples"])
    assert saved["samples"][0]["prompt"] == "What is 0+1?"


# ---------------------------------------------------------------------------------------------------------------------
# The command line: run record, defaults, bad input
# ---------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def saved_model(tmp_path, monkeypatch):
    """cwd = tmp_path, holding outputs/run (a tiny saved model) and data.jsonl (3 problems)."""
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model

    monkeypatch.chdir(tmp_path)
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, hidden_size=32, num_layers=1).save_pretrained("outputs/run")
    tokenizer.save_pretrained("outputs/run")
    rows = [{"prompt": f"What is {i}+1?\n", "answer": str(i + 1)} for i in range(3)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def test_cli_defaults_come_from_the_run_record_then_the_paper(saved_model):
    from dapo_trl.run.evaluation import parse_cli
    from dapo_trl.run.run_record import EvalSettings, PromptFormat, RunRecord, write_run_record

    args = parse_cli(["--model", "outputs/run", "--dataset", "data.jsonl"])
    assert (args.k, args.temperature, args.top_p, args.max_new_tokens) == (32, 1.0, 0.7, 20480)  # DAPO §4.1
    assert args.chat == "auto" and args.run_record is None

    record = RunRecord(
        prompt_format=PromptFormat(conversational=True, system_prompt="Be brief.", chat_template_kwargs={"x": 1}),
        evaluation=EvalSettings(k=3, temperature=0.9, top_p=1.0, max_new_tokens=5, batch_size=2, seed=7),
    )
    write_run_record("outputs/run", record)
    args = parse_cli(["--model", "outputs/run", "--dataset", "data.jsonl", "--k", "4"])
    assert (args.k, args.temperature, args.top_p, args.max_new_tokens, args.batch_size, args.seed) == (
        4,  # the command line wins
        0.9,
        1.0,
        5,
        2,
        7,
    )
    assert (args.chat, args.system_prompt, args.chat_template_kwargs) == ("yes", "Be brief.", {"x": 1})
    assert args.reward_rule == "equivalence"  # the record's
    record.evaluation.reward_rule = "dapo"
    write_run_record("outputs/run", record)
    assert parse_cli(["--model", "outputs/run", "--dataset", "data.jsonl"]).reward_rule == "dapo"
    argv = ["--model", "outputs/run", "--dataset", "data.jsonl", "--reward_rule", "equivalence"]
    assert parse_cli(argv).reward_rule == "equivalence"
    # a checkpoint inside the run folder finds the record one level up
    (saved_model / "outputs" / "run" / "checkpoint-2").mkdir()
    for name in ("config.json", "model.safetensors"):
        (saved_model / "outputs" / "run" / "checkpoint-2" / name).write_bytes(
            (saved_model / "outputs/run" / name).read_bytes()
        )
    assert parse_cli(["--model", "outputs/run/checkpoint-2", "--dataset", "data.jsonl"]).k == 3
    assert parse_cli(["--model", "outputs/run", "--dataset", "data.jsonl", "--ignore_run_record"]).k == 32


def test_cli_evaluates_with_the_recorded_settings(saved_model, capsys):
    from dapo_trl.run.evaluation import main
    from dapo_trl.run.run_record import EvalSettings, PromptFormat, RunRecord, write_run_record

    record = RunRecord(PromptFormat(), EvalSettings(k=3, temperature=1.0, top_p=1.0, max_new_tokens=4, batch_size=2))
    write_run_record("outputs/run", record)
    metrics = main(["--model", "outputs/run", "--dataset", "data.jsonl", "--save_samples", "--output", "m.json"])
    assert metrics["k"] == 3 and "avg@3" in metrics
    samples = json.loads((saved_model / "m.json").read_text())["samples"]
    assert samples[0]["prompt"] == "What is 0+1?\n"  # plain text, as recorded: no chat template, no DAPO template
    assert all(len(c) <= 4 for s in samples for c in s["completions"])  # 4 new tokens of one character at most


def test_unreadable_run_record_is_named(saved_model, capsys):
    from dapo_trl.run.evaluation import parse_cli

    (saved_model / "outputs" / "run" / "dapo_run.json").write_text("{not json")
    with pytest.raises(SystemExit):
        parse_cli(["--model", "outputs/run", "--dataset", "data.jsonl"])
    assert "dapo_run.json is not a readable run record" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--model", "outputs/rnu", "--dataset", "data.jsonl"], "outputs/rnu"),  # missing relative path, not the Hub
        (["--model", "/no/such/folder", "--dataset", "data.jsonl"], "/no/such/folder"),
        (["--model", "outputs/run/checkpoint-9", "--dataset", "data.jsonl"], "checkpoint-9"),
        (["--model", "gpt-nope", "--dataset", "data.jsonl"], "HF_HUB_OFFLINE"),  # a Hub id, offline, not cached
        (["--model", "data.jsonl", "--dataset", "data.jsonl"], "is a file"),
        (["--model", "outputs", "--dataset", "data.jsonl"], "no config.json"),
        (["--model", "outputs/run", "--dataset", "empty.jsonl"], "empty.jsonl is empty"),
        (["--model", "outputs/run", "--dataset", "blank.jsonl"], "blank.jsonl is empty"),
        (["--model", "outputs/run", "--dataset", "dta.jsonl"], "dta.jsonl"),
        (["--model", "outputs/run", "--dataset", "outputs/nothing/"], "outputs/nothing/"),
        (["--model", "outputs/run", "--dataset", "data.jsonl", "--k", "0"], "--k"),
        (["--model", "outputs/run", "--dataset", "data.jsonl", "--batch_size", "0"], "--batch_size"),
        (["--model", "outputs/run", "--dataset", "data.jsonl", "--max_samples", "0"], "--max_samples"),
        (["--model", "outputs/run", "--dataset", "data.jsonl", "--max_new_tokens", "-1"], "--max_new_tokens"),
        (["--model", "outputs/run", "--dataset", "data.jsonl", "--top_p", "1.5"], "--top_p"),
        (["--model", "outputs/run", "--dataset", "data.jsonl", "--temperature", "-1"], "--temperature"),
    ],
)
def test_cli_bad_input_stops_at_argparse_naming_the_flag_or_path(saved_model, argv, named, capsys):
    from dapo_trl.run.evaluation import main

    (saved_model / "empty.jsonl").write_text("")
    (saved_model / "blank.jsonl").write_text("\n\n")
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    error = capsys.readouterr().err
    assert named in error, error


def test_unscorable_gold_answers_are_left_out_of_the_metrics():
    """A gold the verifier cannot use is neither right nor wrong: it leaves the metrics, with a warning and a count."""
    from dapo_trl.run.evaluation import _drop_unscorable

    prompts, answers, dropped = _drop_unscorable(["a", "b", "c", "d"], ["4", None, ["7"], "???"])
    assert (prompts, answers, dropped) == (["a", "c"], ["4", ["7"]], 2)  # a one-element list is kept, unwrapped later
    with pytest.raises(ValueError, match="None of the 2 gold answers"):
        _drop_unscorable(["a", "b"], [None, ""])
