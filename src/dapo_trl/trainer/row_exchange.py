"""Which process sends which rows where, so each process receives only the rows it trains.

Dynamic sampling picks the trained groups from rows spread over the processes: each process holds the rows it
generated (and the carried rows it kept). The assembled batch is the trained groups in group order, padded to a full
generation batch, and process `r` trains the `r`-th equal slice of it. Gathering every row onto every process would
replicate the whole batch; instead every process computes the same [`ExchangePlan`] from small metadata (the group id
of every row of every process) and then moves only the rows each slice needs.

The order is the one of a gather of all rows: rows of all processes concatenated in process order, then sorted
stably by group. Within a group, rows therefore keep process order, then local order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ExchangePlan:
    """
    sources[r]: `(R, 2)` long tensor of `(process, local row)` for each row of process `r`'s slice, in training order;
    padding[r]: `(R,)` bool, the rows that are fully masked copies of `filler` (see `batch.pad_rows`).
    filler: `(process, local row)` of the row padding rows copy: the first trained row, else the first row held
    anywhere; `None` when no process holds a row (each process then pads with a local template row).
    """

    sources: list[torch.Tensor]
    padding: list[torch.Tensor]
    filler: tuple[int, int] | None

    def sends(self, src: int, dst: int) -> torch.Tensor:
        """Sorted distinct local row indices `src` sends to `dst` (each row once, however often `dst` uses it)."""
        rows = self.sources[dst]
        return torch.unique(rows[rows[:, 0] == src, 1])


def plan_exchange(groups: list[torch.Tensor], train: list[int], num_rows: int) -> ExchangePlan:
    """
    The plan for `len(groups)` processes: `groups[p]` holds the group id `(B_p,)` of each row process `p` holds,
    `train` the group ids to train, `num_rows` the padded batch size (a multiple of the process count).

    Example: two processes, groups 0 and 1 trained, padded to 6 rows (3 per process).
    ```python
    >>> plan = plan_exchange([torch.tensor([1, 0]), torch.tensor([0, 1, 2])], [0, 1], 6)
    >>> plan.sources[0].tolist(), plan.sources[1].tolist(), plan.padding[1].tolist()
    ([[0, 1], [1, 0], [0, 0]], [[1, 1], [0, 1], [0, 1]], [False, True, True])

    ```
    """
    processes = len(groups)
    owner = torch.cat([torch.full((len(g),), p, dtype=torch.long) for p, g in enumerate(groups)])
    local = torch.cat([torch.arange(len(g), dtype=torch.long) for g in groups])
    group = torch.cat([g.long().cpu() for g in groups])
    order = torch.argsort(group, stable=True)
    owner, local, group = owner[order], local[order], group[order]
    trained = torch.isin(group, torch.tensor(train, dtype=torch.long))
    rows = torch.stack([owner[trained], local[trained]], dim=1)  # (T, 2)
    num_rows = max(num_rows, len(rows))
    if num_rows % processes:
        raise ValueError(f"{num_rows} rows cannot be split evenly over {processes} processes.")
    filler = None
    if len(rows):
        filler = (int(rows[0, 0]), int(rows[0, 1]))
    elif len(owner):
        filler = (int(owner[0]), int(local[0]))
    fill = torch.tensor([filler or (0, 0)], dtype=torch.long).expand(num_rows - len(rows), 2)
    padding = torch.arange(num_rows) >= len(rows)
    per_process = num_rows // processes
    return ExchangePlan(
        sources=list(torch.cat([rows, fill]).split(per_process)),
        padding=list(padding.split(per_process)),
        filler=filler,
    )


def exchange_rows(local: dict, plan: ExchangePlan, *, rank: int, processes: int) -> dict:
    """
    Process `rank`'s slice of the batch: its own rows of `local` and the rows other processes send it (a collective:
    every process calls it with the same plan). `local` holds this process's rows with every per-token tensor
    already at the width all processes agreed on; it may have zero rows. Padding rows are returned as they are sent
    (unmasked): see [`mask_padding`].
    """
    keys = sorted(local)
    received = {rank: local}
    if processes > 1:
        import torch.distributed as dist

        ops, buffers = [], {}
        for peer in range(processes):
            if peer == rank:
                continue
            out = plan.sends(rank, peer).to(local[keys[0]].device)
            if out.numel():
                ops += [dist.P2POp(dist.isend, _wire(local[k][out]), peer) for k in keys]
            incoming = plan.sends(peer, rank).numel()
            if incoming:
                buffers[peer] = {k: _wire(local[k].new_empty((incoming, *local[k].shape[1:]))) for k in keys}
                ops += [dist.P2POp(dist.irecv, buffers[peer][k], peer) for k in keys]
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        for peer, rows in buffers.items():
            received[peer] = {k: v.to(local[k].dtype) for k, v in rows.items()}
    sources = plan.sources[rank].to(local[keys[0]].device)  # (R, 2)
    out = {k: local[k].new_empty((len(sources), *local[k].shape[1:])) for k in keys}
    for src, rows in received.items():
        at = (sources[:, 0] == src).nonzero().flatten()
        if not at.numel():
            continue
        index = sources[at, 1]
        if src != rank:  # position in the sorted distinct rows `src` sent
            index = torch.searchsorted(plan.sends(src, rank).to(index.device), index)
        for key in keys:
            out[key][at] = rows[key][index]
    return out


def mask_padding(batch: dict, padding: torch.Tensor) -> dict:
    """Make the `padding` rows `(B,)` fully masked, as `batch.pad_rows` makes its copies: no loss, no token count."""
    if not bool(padding.any()):
        return batch
    keep = ~padding.to(next(iter(batch.values())).device)
    for key in ("completion_mask", "tool_mask", "advantages"):
        if key in batch:
            batch[key] = batch[key] * keep.view(-1, *[1] * (batch[key].dim() - 1)).to(batch[key].dtype)
    for key in [k for k in batch if k.startswith("_")]:
        batch[key] = torch.where(keep.view(-1, *[1] * (batch[key].dim() - 1)), batch[key], -1)
    return batch


def _wire(tensor: torch.Tensor) -> torch.Tensor:
    # gloo sends no bool tensors
    return (tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor).contiguous()
