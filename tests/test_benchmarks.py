"""The benchmarks run (`--quick`) and print their tables; the dynamic-sampling simulation matches the trainer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dynamic_sampling_quick():
    ds = load_benchmark("dynamic_sampling")
    return ds, ds.main(["--quick"])


def test_dynamic_sampling_quick_prints_every_row(dynamic_sampling_quick, capsys):
    ds, _ = dynamic_sampling_quick
    ds.main(["--quick", "--steps", "5", "--section", "rounds"])
    out = capsys.readouterr().out
    assert "| population | p (start) | strategy | gen/trained | x floor (1/p) | rounds/step |" in out
    for pop in ds.POPULATIONS:
        assert f"| {pop.name} | Beta({pop.a:g}, {pop.b:g}) |" in out
        for strat in ds.STRATEGIES:
            rows = [
                line for line in out.splitlines() if line.startswith(f"| {pop.name} |") and f"| {strat.name} |" in line
            ]
            assert len(rows) == 1, (pop.name, strat.name)
    assert "meets targets" in out


def test_carry_over_reaches_the_floor_in_few_rounds(dynamic_sampling_quick):
    ds, results = dynamic_sampling_quick
    results = results["rounds"]
    for pop in ds.POPULATIONS:
        carry = results[pop.name, "adaptive+carry"]
        deficit = results[pop.name, "deficit"]
        # Exact-deficit refill never overshoots, so it sits on the floor too: carry-over must match it in groups
        # generated per group trained while needing far fewer rounds.
        assert carry.gen_per_trained <= 1.03 * deficit.gen_per_trained, pop.name
        assert carry.mean_rounds < 0.7 * deficit.mean_rounds, pop.name
        # Discarding the surplus wastes generation; carrying it does not.
        assert carry.gen_per_trained < results[pop.name, "adaptive"].gen_per_trained, pop.name
        assert carry.gen_per_trained < results[pop.name, "fixed-3x"].gen_per_trained, pop.name
        assert carry.floor_ratio <= ds.TARGET_FLOOR_RATIO, pop.name
        assert carry.underfilled == 0, pop.name
    # Where one round of the default cap (4x the target) can hold the batch, one round usually suffices.
    for pop in ds.POPULATIONS[1:]:
        assert results[pop.name, "adaptive+carry"].mean_rounds <= ds.TARGET_ROUNDS, pop.name


def test_skipping_section_prints_every_row(dynamic_sampling_quick):
    ds, results = dynamic_sampling_quick
    assert set(results["skip"]) == {(pop.name, v.name) for pop in ds.POPULATIONS for v in ds.SKIP_VARIANTS}
    table = ds.format_skip_results(results["skip"], dict.fromkeys((p.name for p in ds.POPULATIONS), (0.5, 0.5)))
    for pop in ds.POPULATIONS:
        for variant in ds.SKIP_VARIANTS:
            assert sum(
                line.startswith(f"| {pop.name} |") and f"| {variant.name} |" in line for line in table.splitlines()
            )
    assert "meets targets" in ds.format_skip_targets(results["skip"])


def test_skipping_cuts_generation_where_most_groups_are_zero_variance(dynamic_sampling_quick):
    ds, results = dynamic_sampling_quick
    results = results["skip"]
    for pop in ds.SKIP_TARGET_POPULATIONS:
        for skip, baseline in (("adaptive+skip", "adaptive"), ("adaptive+carry+skip", "adaptive+carry")):
            r, b = results[pop, skip], results[pop, baseline]
            assert b.skipped == 0 and r.skipped > 0, (pop, skip)
            assert r.gen_per_trained < 0.75 * b.gen_per_trained, (pop, skip)
            assert r.later_floor_ratio < 0.6, (pop, skip)  # once a history exists (after the first epoch)
            assert r.mean_rounds <= ds.TARGET_ROUNDS and r.underfilled == 0, (pop, skip)
            assert r.redrawn > 0 and 0 < r.missed_share, (pop, skip)  # exploration happens, and misses are counted
    # Where generated groups already beat the policy's target, it (almost) never skips.
    uniform = results["uniform", "adaptive+carry+skip"]
    assert uniform.skipped < 0.02 * uniform.generated
    assert uniform.gen_per_trained == pytest.approx(results["uniform", "adaptive+carry"].gen_per_trained, rel=0.02)


def test_skipping_defaults_keep_what_they_generate_and_probe_within_reach_of_the_oracle(dynamic_sampling_quick):
    ds, results = dynamic_sampling_quick
    skip = results["skip"]
    for pop in ds.POPULATIONS:
        default, oracle = skip[pop.name, ds.DEFAULT_SKIP_VARIANT], skip[pop.name, "adaptive+carry+oracle"]
        assert default.floor_ratio <= ds.TARGET_ORACLE_RATIO * oracle.floor_ratio, pop.name
        assert default.mean_rounds <= ds.TARGET_ROUNDS and default.underfilled == 0, pop.name
        # The planner before: surplus discarded without carry-over; carried groups now wait until used.
        assert skip[pop.name, "adaptive+skip"].discarded_per_100 > 3, pop.name
        assert default.discarded_per_100 < 1, pop.name
        assert 0 < default.completed < default.probed, pop.name  # some probes are completed, some dropped
    for pop in ds.SKIP_TARGET_POPULATIONS:  # probing cuts the first pass, which no skip rule can
        assert skip[pop, ds.DEFAULT_SKIP_VARIANT].floor_ratio < 0.85 * skip[pop, "adaptive+carry+skip"].floor_ratio
    held_out = results["heldout"]
    assert set(held_out) == {(ds.HELD_OUT.name, v.name) for v in ds.SKIP_VARIANTS}
    assert held_out[ds.HELD_OUT.name, ds.DEFAULT_SKIP_VARIANT].floor_ratio < 0.6
    targets = ds.format_skip_targets(skip, held_out)
    assert f"| {ds.HELD_OUT.name} |" in targets and "meets targets" in targets


def test_the_oracle_reference_skips_seen_prompts_on_their_true_pass_rates_and_beats_both_rules(dynamic_sampling_quick):
    ds, results = dynamic_sampling_quick
    policy = ds.OracleSkipPolicy(4, oracle_threshold=0.5, rule="posterior", num_generations=4)
    policy.informative = torch.tensor([0.1, 0.9, 0.1, 0.9], dtype=torch.float64)
    assert not any(policy.should_skip(i) for i in range(4))  # nothing generated yet: never skipped
    classification = ds.classify_groups(torch.tensor([1.0] * 4 + [1.0, -1.0, 1.0, -1.0]), 4, correct_value=1.0)
    policy.record([0, 1], classification, step=0)
    assert [policy.should_skip(i) for i in range(4)] == [True, False, False, False]
    assert policy.run_totals()["skipped"] == 1 and policy.skipped_now == [0]
    for pop in ds.SKIP_TARGET_POPULATIONS:  # no estimation error and no exploration: below both rules
        oracle = results["skip"][pop, "adaptive+carry+oracle"]
        assert oracle.skipped > 0, pop
        for rule in ("skip", "posterior"):
            assert oracle.floor_ratio < results["skip"][pop, f"adaptive+carry+{rule}"].floor_ratio, (pop, rule)
    assert "| oracle |" in ds.format_skip_targets(results["skip"])


def test_simulated_dynamics_keep_solved_prompts_solved():
    ds = load_benchmark("dynamic_sampling")
    pop = ds.POPULATIONS[1]
    rates = ds.sample_pass_rates(pop, num_prompts=2000, seed=0)
    speed = ds.sample_learnability(2000, seed=0)
    before, after = rates, ds.drifted(torch.logit(rates), 2.0, 1.0, speed)
    assert (after >= before).all()  # nothing is unlearned
    assert speed.mean().item() == pytest.approx(1.0, abs=0.1)
    assert ((before < 0.05) & (after > 0.2)).sum() > 0  # some unsolved prompts become solvable


def test_informative_rate_formula_matches_monte_carlo():
    ds = load_benchmark("dynamic_sampling")
    gen = torch.Generator().manual_seed(0)
    for pop in ds.POPULATIONS:
        q = torch.distributions.Beta(torch.tensor(pop.a), torch.tensor(pop.b)).sample((200_000,)).double()
        correct = torch.binomial(torch.full_like(q, 16.0), q, generator=gen)
        monte_carlo = ((correct > 0) & (correct < 16)).double().mean().item()
        assert ds.beta_informative_rate(pop.a, pop.b, 16) == pytest.approx(monte_carlo, abs=0.01), pop.name


class Verdicts:
    """Pseudo-random informative verdicts, the same sequence for whoever asks with the same seed."""

    def __init__(self, rate: float, seed: int) -> None:
        self.rate = rate
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, n: int) -> torch.Tensor:
        return torch.rand(n, generator=self.gen) < self.rate


@pytest.mark.integration
@pytest.mark.parametrize("rate", [0.1, 0.9])
def test_simulation_loop_matches_the_trainer(tmp_path, rate):
    """`sample_generation_batch` decides every round and every batch exactly as `DAPOTrainer` does."""
    from transformers.trainer_callback import PrinterCallback

    from dapo_trl.dapo_config import DAPOConfig
    from dapo_trl.dapo_trainer import DAPOTrainer
    from dapo_trl.run.toy import build_char_tokenizer, build_tiny_model, make_math_dataset
    from dapo_trl.trainer.sampling import PromptStream, RoundPlanner

    ds = load_benchmark("dynamic_sampling")
    seed, steps, max_rounds = 0, 8, 2

    class ScriptedVerdicts(DAPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.verdicts = Verdicts(rate, seed)
            self.rounds: list[list[int]] = []

        def select_informative_groups(self, values):
            return self.verdicts(values.size(0))

        def on_groups_scored(self, prompt_indices, values, informative, classification):
            self.rounds.append(list(prompt_indices))

    tokenizer = build_char_tokenizer()
    dataset = make_math_dataset(40, seed=seed)
    args = DAPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        max_steps=steps,
        seed=seed,
        num_generations=4,
        per_device_train_batch_size=16,  # target: 4 groups
        max_completion_length=4,
        overlong_shaping=False,
        dynamic_sampling_carry_over=True,
        dynamic_sampling_max_rounds=max_rounds,
        dynamic_sampling_max_round_prompts=16,  # small rounds, so the script reaches every case below
    )

    def distinct_reward(completions, **kwargs):
        """Never constant, so that the scripted verdicts alone decide (a constant reward would end refills early)."""
        return [float(i) for i in range(len(completions))]

    trainer = ScriptedVerdicts(
        model=build_tiny_model(tokenizer, hidden_size=32, num_heads=2),
        reward_funcs=[distinct_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "dynamic_sampling/rounds" in h]
    assert len(logged) == steps

    target = trainer._ds_target
    planner = RoundPlanner(target, z=args.dynamic_sampling_margin, max_round_prompts=16)
    stream = PromptStream(len(dataset), seed=seed)
    verdicts = Verdicts(rate, seed)
    rounds: list[list[int]] = []

    def score(indices):
        rounds.append(list(indices))
        return verdicts(len(indices))

    carried, carried_at, watch = 0, (), ds.NoInformativeWatch()
    outcomes = []
    for step in range(steps):
        out = ds.sample_generation_batch(
            planner,
            stream,
            score,
            target=target,
            num_carried=carried,
            max_rounds=max_rounds,
            carry_over=True,
            step=step,  # one optimizer update per generation batch here
            carried_at=carried_at,
            carry=ds.Carry(max_staleness=2.0),  # the trainer's default: two generation batches
            watch=watch,
        )
        carried, carried_at = out.carried_out, out.carried_at
        outcomes.append(out)

    assert rounds == trainer.rounds
    simulated = [(o.rounds, o.generated, o.carried_in, o.trained, o.discarded, float(o.missing > 0)) for o in outcomes]
    from_trainer = [
        tuple(
            h[f"dynamic_sampling/{k}"]
            for k in ("rounds", "groups_generated", "groups_carried", "groups_trained", "groups_discarded")
        )
        + (h["dynamic_sampling/underfilled"],)
        for h in logged
    ]
    assert simulated == from_trainer
    assert list(outcomes[-1].carried_at) == trainer._carry_sampled_at
    if rate < 0.5:  # the scripted verdicts reach second rounds, carried groups and an underfilled batch
        assert max(o.rounds for o in outcomes) > 1 and any(o.carried_in for o in outcomes)
        assert any(o.missing for o in outcomes)
    else:  # surplus beyond a batch: carried groups wait a batch, and those older than two batches are dropped
        assert any(o.carried_out > target for o in outcomes) and any(o.discarded for o in outcomes)
        assert any(step - min(o.carried_at, default=step) == 1 for step, o in enumerate(outcomes))
    assert planner.state_dict() == pytest.approx(trainer._planner.state_dict())


@pytest.mark.integration
def test_overhead_quick_prints_the_comparison(capsys):
    overhead = load_benchmark("overhead")
    runs = overhead.main(["--quick"])
    out = capsys.readouterr().out
    for kind in overhead.KINDS:
        assert f"| {kind} |" in out
        assert len(runs[kind]) == 2 and all(run["cpu_times"] for run in runs[kind])
    assert "DAPO / GRPO step time (CPU)" in out
    # A loose bound (quick mode on shared cores is noisy): catches a gross regression, not a few percent.
    ratio = overhead._median(runs["DAPO"], "cpu_times") / overhead._median(runs["GRPO"], "cpu_times")
    assert ratio < 1.5


@pytest.mark.integration
def test_staleness_quick_prints_carried_and_fresh_ratios(capsys):
    trainer = load_benchmark("staleness").main(["--quick"])
    out = capsys.readouterr().out
    assert "| rows | micro-step | staleness | tokens | mean | std | p1 | p99 | clipped |" in out
    assert "carried_staleness [4.0]" in out
    # fresh rows start every generation batch at ratio 1 (TRL's old log-probs, computed at another padding)
    fresh = torch.cat(trainer.records["fresh", 0, 0])
    assert fresh.numel() and torch.equal(fresh, torch.ones_like(fresh))
    assert any(kind == "carried" for kind, _, _ in trainer.records)


def test_memory_peak_follows_allocations_and_frees_in_time_order():
    memory = load_benchmark("memory")
    changes = [(3, 8), (0, 4), (4, -12), (1, 4), (2, -4)]  # out of order on purpose
    assert memory.peak_allocated(changes) == 12
    assert memory.peak_allocated(changes, window=(1, 2)) == 8


def test_memory_assembly_window_starts_after_the_last_generation_inside_the_preparation():
    memory = load_benchmark("memory")
    assert memory.after_last([5, 12, 15, 30], (10, 20)) == (15, 20)  # generations before and after it ignored
    assert memory.after_last([30], (10, 20)) == (10, 20)


def test_memory_rows_held_counts_each_storage_once():
    memory = load_benchmark("memory")
    ids = torch.zeros(4, 8, dtype=torch.long)  # 256 bytes
    batch = {"completion_ids": ids, "view": ids[:2], "advantages": torch.zeros(4)}  # a view shares ids' storage
    assert memory.tensor_bytes((batch, "plan", 3), None, [torch.zeros(2, dtype=torch.float64)]) == 256 + 16 + 16


@pytest.mark.integration
def test_memory_quick_prints_the_side_by_side_table(capsys):
    memory = load_benchmark("memory")
    results = memory.main(["--quick"])
    out = capsys.readouterr().out
    assert (
        "| processes | batch per process (completions) | informative every | rows generated (DAPO, all processes) |"
        in out
    )
    assert {r["every"] for r in results} == {1, 3}
    for r in results:
        for kind in ("grpo", "dapo"):
            assert 0 < r[kind]["preparation"] <= r[kind]["peak"], (kind, r)
            assert 0 < r[kind]["rows"] <= r[kind]["assembly"] <= r[kind]["peak"], (kind, r)
        assert f"| 1 | {r['rows']} | {r['every']} |" in out
    refill = next(r for r in results if r["every"] == 3)
    assert refill["dapo"]["generated_rows"] > refill["rows"]  # one group in three informative: refill rounds
    # Loose (tiny model, one process): catches a gross regression in what dynamic sampling keeps alive.
    assert all(r["dapo"]["peak"] < memory.LIMIT_RATIO * r["grpo"]["peak"] for r in results)


def test_skip_decomposition_books_every_generated_group_once():
    """The parts of `skip_decomposition` add up to the groups generated per trained group, for the defaults (with a
    probe, whose dropped groups count k / G) and for the oracle."""
    sd = load_benchmark("skip_decomposition")
    ds = load_benchmark("dynamic_sampling")
    for variant in (ds.DEFAULT_SKIP_VARIANT, "adaptive+carry+oracle"):
        result, ledger, p = sd.decompose(
            ds.HELD_OUT, num_generations=4, seed=1, passes=2.0, variant=variant, num_prompts=1024
        )
        booked = result.trained + sum(ledger.cost[part] for part in sd.PARTS[1:])
        assert booked == pytest.approx(result.gen_per_trained * result.trained, rel=1e-6)
        assert result.floor_ratio == pytest.approx(result.gen_per_trained * p, rel=1e-6)
        assert all(cost >= 0 for cost in ledger.cost.values())
    assert ledger.dropped_cost == 0  # the oracle runs without a probe
