"""Training curves: every panel drawn from a log history, and the diagnoses that fired marked where they fired."""

import pytest

from dapo_trl.run.plotting import DIAGNOSIS_PANELS, PANELS, plot_training_curves, series

matplotlib = pytest.importorskip("matplotlib")


def run_history(fired: dict[str, int], steps: int = 30) -> list[dict]:
    history = []
    for step in range(1, steps + 1):
        entry = {
            "step": step,
            "reward": step / steps,
            "entropy": 1 - step / (2 * steps),
            "completions/clipped_ratio": 0.1,
        }
        entry.update({f"diagnostics/{name}": float(step >= first) for name, first in fired.items()})
        history.append(entry)
    history.append({"step": steps, "eval_accuracy": 0.5})  # entries without the plotted metrics are skipped
    return history


def test_series_skips_entries_without_the_metric():
    assert series(run_history({}, steps=3), "reward") == ([1, 2, 3], [1 / 3, 2 / 3, 1.0])


def test_every_diagnosis_has_a_panel():
    from dapo_trl.trainer.diagnostics import DETECTORS

    panels = {panel for panel, _ in PANELS}
    assert set(DETECTORS) == set(DIAGNOSIS_PANELS) and set(DIAGNOSIS_PANELS.values()) <= panels


def test_fired_diagnoses_are_marked_on_their_panel(tmp_path):
    import matplotlib.pyplot as plt

    from dapo_trl.run.plotting import _mark_diagnoses

    fig, axes = plt.subplots(2, 3)
    by_panel = dict(zip((panel for panel, _ in PANELS), axes.flat, strict=True))
    fired = _mark_diagnoses(run_history({"entropy_collapse": 12, "truncation_growth": 20}), by_panel)
    assert fired == {"entropy_collapse": 12, "truncation_growth": 20}

    def vertical_lines(panel):
        return [line.get_xdata()[0] for line in by_panel[panel].lines]

    assert vertical_lines("entropy") == [12]
    assert vertical_lines("clip and truncation fractions") == [20]
    assert vertical_lines("reward") == []
    assert [t.get_text() for t in by_panel["entropy"].texts] == ["entropy_collapse"]
    plt.close(fig)


def test_plot_writes_the_png_with_and_without_diagnoses(tmp_path):
    quiet = plot_training_curves(run_history({}), tmp_path / "quiet.png", title="t")
    marked = plot_training_curves(run_history({"reward_hacking": 25}), tmp_path / "marked.png", title="t")
    assert quiet.stat().st_size > 10_000 and marked.stat().st_size > 10_000


def _panel(fig, title):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def test_heldout_accuracy_is_plotted():
    import doctest

    import matplotlib.pyplot as plt

    from dapo_trl.run import plotting

    assert doctest.testmod(plotting).failed == 0
    history = [{"step": s, "accuracy": 0.3, "eval_accuracy": 0.2 + s / 100} for s in (10, 20)]
    fig = plotting.training_curves_figure(
        history, heldout=plotting.heldout_points({"eval": {"avg@4": 0.4, "k": 4}}, 20)
    )
    labels = [line.get_label() for line in _panel(fig, "accuracy").lines]
    assert "held-out accuracy (eval)" in labels and "held-out accuracy" in labels
    plt.close(fig)


def test_the_rollout_reward_is_drawn_once_with_dynamic_sampling():
    """With dynamic sampling TRL's `reward` is merged over every generated row: the "before filtering" curve itself."""
    import matplotlib.pyplot as plt

    from dapo_trl.run.plotting import training_curves_figure

    history = [
        {"step": s, "reward": s / 10, "dynamic_sampling/reward_before_filter": s / 10, "accuracy": 0.5}
        for s in range(1, 6)
    ]
    fig = training_curves_figure(history)
    assert [line.get_label() for line in _panel(fig, "reward").lines] == ["before filtering"]
    # without dynamic sampling, TRL's rollout values are the only ones and are drawn
    assert [line.get_label() for line in _panel(fig, "accuracy").lines] == ["rollout accuracy"]
    plt.close(fig)


def test_heldout_measurements_are_points_and_steps_whole_numbers():
    """Two held-out measurements (before and after RL) are not a trend: no line joins them; no step 2.5 tick."""
    import matplotlib.pyplot as plt

    from dapo_trl.run.plotting import heldout_points, training_curves_figure

    history = [{"step": s, "reward": s / 10} for s in range(1, 4)]
    fig = training_curves_figure(history, heldout=heldout_points({"heldout": {"before": 0.3, "after": 0.6}}, 3))
    heldout = next(line for line in _panel(fig, "accuracy").lines if line.get_label() == "held-out accuracy")
    assert list(heldout.get_xdata()) == [0, 3] and heldout.get_linestyle() == "None"
    fig.canvas.draw()
    ticks = _panel(fig, "reward").get_xticks()
    assert len(ticks) > 1 and all(float(t).is_integer() for t in ticks)
    plt.close(fig)
