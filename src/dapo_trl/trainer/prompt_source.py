"""Where dynamic sampling draws its prompts: a map-style dataset through [`PromptStream`], or a streamed dataset.

Both sources give every process the same prompts in the same order (same seed), wrap into the next epoch at the end of
the data, and save their position with the sampler state so a resumed run continues exactly where it stopped.

- [`DatasetPrompts`]: a map-style `datasets.Dataset` (or any indexable set of rows); prompt `i` is row `i`.
- [`StreamPrompts`]: a `datasets.IterableDataset` (`load_dataset(..., streaming=True)`), read in order, shuffled with
  a buffer like TRL does for streams. A prompt's index is its position in the current epoch of the stream.

With dynamic sampling off, TRL's own sampler picks the prompts; [`EpochSampler`] makes its order resumable too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .sampling import PromptStream

logger = logging.getLogger(__name__)

Skip = Callable[[int], bool] | None


class EpochSampler(torch.utils.data.Sampler):
    """
    TRL's `RepeatSampler` with an order that depends only on the seed and the epoch.

    `RepeatSampler` seeds its generator once and draws a new permutation at each pass, so epoch `e` gets the
    `(e + 1)`-th permutation of that generator. A run resumed in epoch `e` builds a fresh sampler and transformers does
    not replay the earlier epochs: the resumed epoch would get epoch 0's permutation (some prompts trained twice,
    others never). This wrapper reseeds the generator and replays the draws of epochs `0 .. e - 1` before each pass, so
    an uninterrupted run sees exactly TRL's order and a resumed run the same order again.

    The epoch of a pass comes from `epoch`, a callable read when the pass starts (the trainer gives the integer part
    of `TrainerState.epoch`, which a resumed run restores): `set_epoch` does not reach a sampler nested in the loader
    of a resumed multi-process run (`SkipBatchSampler(BatchSamplerShard(BatchSampler(sampler)))`). Without `epoch`,
    the epoch is the last `set_epoch` value, and each pass otherwise counts as the next epoch, as in `RepeatSampler`.
    """

    def __init__(self, sampler: torch.utils.data.Sampler, *, epoch: Callable[[], float | None] | None = None) -> None:
        self.sampler = sampler
        self.epoch = 0
        self._epoch_source = epoch

    @staticmethod
    def wraps(sampler: Any) -> bool:
        """Whether `sampler` draws one permutation per pass from a `generator` seeded with `seed` (`RepeatSampler`)."""
        return (
            bool(getattr(sampler, "shuffle", False))
            and isinstance(getattr(sampler, "generator", None), torch.Generator)
            and hasattr(sampler, "seed")
            and hasattr(sampler, "num_samples")
        )

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self._epoch_source is not None:
            self.epoch = int(self._epoch_source() or 0)
        epoch, self.epoch = self.epoch, self.epoch + 1
        seed = self.sampler.seed if self.sampler.seed is not None else torch.Generator().initial_seed()
        generator = self.sampler.generator  # reseeded in place: accelerate may hold a reference to it
        generator.manual_seed(seed)
        for _ in range(epoch):
            torch.randperm(self.sampler.num_samples, generator=generator)  # one draw per pass, as RepeatSampler
        yield from self.sampler

    def __len__(self) -> int:
        return len(self.sampler)


class DatasetPrompts:
    """Prompts of a map-style dataset, drawn by a shuffled, resumable [`PromptStream`] over its indices."""

    streaming = False

    def __init__(self, dataset: Any, *, seed: int, shuffle: bool) -> None:
        self.dataset = dataset
        self.stream = PromptStream(len(dataset), seed=seed, shuffle=shuffle)

    @property
    def consumed(self) -> int:
        return self.stream.consumed

    def take(self, n: int, *, skip: Skip = None) -> tuple[list[int], list[dict[str, Any]]]:
        """The next `n` prompts (fewer if `skip` passes over a whole epoch): their indices and their rows."""
        indices = self.stream.take(n, skip=skip)
        if not indices:
            return [], []
        columns = self.dataset[indices]
        rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
        return indices, rows

    def state_dict(self) -> dict:
        return {**self.stream.state_dict(), "num_prompts": self.stream.num_prompts}

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_prompts", self.stream.num_prompts) != self.stream.num_prompts:
            raise ValueError(
                f"The checkpoint's prompt stream was saved for a training set of {state['num_prompts']} prompts, but "
                f"this run's has {self.stream.num_prompts}. Resume with the same training set, or resume without "
                "the sampler state (delete dapo_sampler_state.pt from the checkpoint folder: the prompt stream then "
                "restarts from the beginning)."
            )
        if state.get("streaming"):
            raise ValueError(
                "The checkpoint's sampler state was saved for a streamed training set, but this run's training set "
                "is map-style. Resume with the same kind of dataset, or delete dapo_sampler_state.pt from the "
                "checkpoint folder to restart the prompt stream."
            )
        self.stream.load_state_dict(state)


class StreamPrompts:
    """
    Prompts of a `datasets.IterableDataset`, read in order.

    Epoch `e` reads the stream after `set_epoch(e)` (so a shuffled stream is reshuffled each epoch) and the next epoch
    starts when it ends. The position is saved as `(epoch, position)`; on resume the stream is restored with the
    dataset's own `state_dict()` when it is not shuffled (exact and instant), and otherwise replayed from the start of
    the epoch, skipping `position` rows (exact for a seeded stream, and costs reading those rows again).
    """

    streaming = True

    def __init__(self, dataset: Any, *, seed: int, shuffle: bool) -> None:
        self.shuffled = shuffle
        self.dataset = dataset.shuffle(seed=seed) if shuffle else dataset
        self.epoch = 0
        self.position = 0  # rows read in the current epoch
        self.consumed = 0  # prompts handed out, all epochs
        self._iterator = None
        self._restore: dict | None = None

    def _rows(self):
        if self._iterator is None:
            self.dataset.set_epoch(self.epoch)
            restore, self._restore = self._restore, None
            if restore is not None and restore.get("dataset") is not None:
                self.dataset.load_state_dict(restore["dataset"])
                self._iterator = iter(self.dataset)
            else:
                self._iterator = iter(self.dataset)
                for _ in range(self.position):  # replay to the saved position
                    next(self._iterator)
        return self._iterator

    def _next_row(self) -> dict | None:
        try:
            return next(self._rows())
        except StopIteration:
            return None

    def take(self, n: int, *, skip: Skip = None) -> tuple[list[int], list[dict[str, Any]]]:
        """The next `n` prompts: their positions in the epoch and their rows. Wraps into the next epoch at the end."""
        indices: list[int] = []
        rows: list[dict[str, Any]] = []
        rows_at_wrap: int | None = None  # rows taken when this call last wrapped into a new epoch
        while len(rows) < n:
            row = self._next_row()
            if row is None:
                if self.position == 0:
                    raise ValueError("The streamed training dataset yielded no rows.")
                if rows_at_wrap == len(rows):  # a whole epoch passed over: return what there is, never loop forever
                    break
                rows_at_wrap = len(rows)
                self.epoch += 1
                self.position = 0
                self._iterator = None
                continue
            index = self.position
            self.position += 1
            if skip is not None and skip(index):
                continue
            indices.append(index)
            rows.append(dict(row))
        self.consumed += len(rows)
        return indices, rows

    def state_dict(self) -> dict:
        state = {"epoch": self.epoch, "position": self.position, "consumed": self.consumed, "streaming": True}
        if not self.shuffled and self._iterator is not None and hasattr(self.dataset, "state_dict"):
            state["dataset"] = self.dataset.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if not state.get("streaming"):
            raise ValueError(
                "The checkpoint's sampler state was saved for a map-style training set, but this run streams its "
                "training set. Resume with the same kind of dataset, or delete dapo_sampler_state.pt from the "
                "checkpoint folder to restart the prompt stream."
            )
        self.epoch, self.position, self.consumed = int(state["epoch"]), int(state["position"]), int(state["consumed"])
        self._iterator = None
        self._restore = state
