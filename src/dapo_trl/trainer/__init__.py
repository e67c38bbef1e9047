"""The trainer's steps, most of them pure functions of tensors and lists: dynamic sampling (selection, round
planning, batch rows, prompt stream and history), advantages, the loss, overlong shaping, metric merging, reward and
dataset checks, preemption and diagnostics. `dapo_trl.DAPOTrainer` is the glue that calls them.
"""
