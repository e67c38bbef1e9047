"""Errors that point the right way: they name the settings the user gave and the fix that applies on this machine."""

import pytest

from dapo_trl import DAPOConfig

ON_CPU = {"use_cpu": True, "bf16": False}


def test_a_batch_of_partial_groups_names_the_settings_the_user_gave(tmp_path):
    """TRL derives generation_batch_size from the batch settings; its error named that size, which nobody set."""
    with pytest.raises(ValueError) as error:
        DAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=6, **ON_CPU)
    message = str(error.value)
    assert "generation_batch_size" not in message
    assert (
        "per_device_train_batch_size (6) x processes (1) x steps_per_generation (1, = gradient_accumulation_steps)"
        in (message)
    )
    assert "= 6 rows" in message and "multiple of 16" in message and "per_device_train_batch_size=16" in message
    with pytest.raises(ValueError, match=r"steps_per_generation \(2\) = 12 rows"):
        DAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=6, steps_per_generation=2, **ON_CPU)
    # a generation_batch_size the user did set is named as TRL names it
    with pytest.raises(ValueError, match=r"generation_batch_size \(24\) must be divisible by num_generations"):
        DAPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=8, generation_batch_size=24, **ON_CPU)
