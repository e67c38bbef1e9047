"""The readable console: a progress bar with a few numbers, no metrics dict per log; a one-screen summary."""

from types import SimpleNamespace

from dapo_trl.run.console import ConciseProgressCallback, format_summary

LOGS = {
    "loss": 0.01,
    "reward": -0.25,
    "accuracy": 0.4375,
    "dynamic_sampling/informative_frac": 0.62,
    "entropy": 0.118,
    "completions/mean_length": 17.8,
    "clip_ratio/high_mean": 0.0002,
    "epoch": 0.3,
}


class Bar:
    def __init__(self):
        self.written, self.postfix = [], None

    def write(self, text):
        self.written.append(text)

    def set_postfix(self, values, refresh=True):
        self.postfix = dict(values)


def test_bar_shows_a_few_metrics_and_prints_no_dict():
    callback = ConciseProgressCallback()
    callback.training_bar = Bar()
    state = SimpleNamespace(is_world_process_zero=True)
    callback.on_log(None, state, None, logs=LOGS)
    callback.on_log(None, state, None, logs={"loss": 0.0, "entropy": 0.2})  # a log without reward keeps the last one
    assert callback.training_bar.written == []
    assert callback.training_bar.postfix == {
        "reward": "-0.25",
        "acc": "0.438",
        "informative": "0.62",
        "entropy": "0.2",
        "len": "17.8",
    }


def test_other_processes_show_nothing():
    callback = ConciseProgressCallback()
    callback.training_bar = Bar()
    callback.on_log(None, SimpleNamespace(is_world_process_zero=False), None, logs=LOGS)
    assert callback.training_bar.postfix is None


def test_summary_fits_a_screen():
    text = format_summary("dapo-trl: demo", [("held-out accuracy", "0.45 -> 0.54")], [LOGS, {"train_runtime": 3.0}])
    lines = text.splitlines()
    assert "held-out accuracy   0.45 -> 0.54" in lines
    assert any(line.startswith("last logged") and "informative groups 0.62" in line for line in lines)
    assert len(lines) < 25 and max(map(len, lines)) < 120


def test_quiet_logs_keeps_only_errors_and_restores_the_levels(caplog):
    import logging

    from transformers.utils import logging as hf_logging

    from dapo_trl.run.console import quiet_logs

    ours = logging.getLogger("dapo_trl")
    before = (hf_logging.get_verbosity(), ours.level)
    with caplog.at_level(logging.WARNING, logger="dapo_trl"):
        with quiet_logs():
            logging.getLogger("dapo_trl.trainer").warning("hidden")
            logging.getLogger("dapo_trl.trainer").error("shown")
            assert hf_logging.get_verbosity() == hf_logging.ERROR
        logging.getLogger("dapo_trl.trainer").warning("after")
    assert [r.getMessage() for r in caplog.records] == ["shown", "after"]
    assert (hf_logging.get_verbosity(), ours.level) == before


def test_doctests():
    """Among them: a name longer than the value column still leaves two spaces before its value."""
    import doctest

    from dapo_trl.run import console

    assert doctest.testmod(console).failed == 0
