"""Each process receives only the rows it trains, in the order a gather of every row would give it."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dapo_trl.trainer import batch as _batch
from dapo_trl.trainer.row_exchange import exchange_rows, mask_padding, plan_exchange


def gathered_reference(groups, train, num_rows, processes):
    """The earlier design: every row on every process, sorted by group, trained groups kept, padded, sliced."""
    owner = torch.cat([torch.full((len(g),), p) for p, g in enumerate(groups)])
    local = torch.cat([torch.arange(len(g)) for g in groups])
    group = torch.cat(groups)
    order = torch.argsort(group, stable=True)
    rows = [(int(owner[i]), int(local[i])) for i in order if int(group[i]) in train]
    filler = rows[0] if rows else ((int(owner[order[0]]), int(local[order[0]])) if len(order) else None)
    rows = [(r, False) for r in rows] + [(filler, True)] * (num_rows - len(rows))
    per = num_rows // processes
    return [rows[r * per : (r + 1) * per] for r in range(processes)]


@pytest.mark.parametrize("processes", [1, 2, 3, 4])
def test_the_plan_gives_each_process_the_rows_and_order_of_a_full_gather(processes):
    generator = torch.Generator().manual_seed(processes)
    for _ in range(50):
        num_groups = int(torch.randint(1, 7, (1,), generator=generator))
        groups = [
            torch.randint(0, num_groups, (int(torch.randint(0, 9, (1,), generator=generator)),), generator=generator)
            for _ in range(processes)
        ]
        train = sorted(torch.randperm(num_groups, generator=generator)[: num_groups // 2 + 1].tolist())
        trained_rows = sum(int(torch.isin(g, torch.tensor(train)).sum()) for g in groups)
        num_rows = ((trained_rows + processes - 1) // processes + 1) * processes
        plan = plan_exchange(groups, train, num_rows)
        expected = gathered_reference(groups, train, num_rows, processes)
        for r in range(processes):
            got = [(tuple(s), bool(p)) for s, p in zip(plan.sources[r].tolist(), plan.padding[r].tolist())]
            if plan.filler is None:
                assert all(p for _, p in got)
                continue
            assert got == expected[r]


def test_each_process_is_sent_only_rows_of_its_own_slice():
    groups = [torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 0, 1, 1, 2, 2])]  # 3 groups of 4 over 2 processes
    plan = plan_exchange(groups, [0, 2], 8)  # group 1 is carried: it moves nowhere
    for src in range(2):
        for dst in range(2):
            sent = plan.sends(src, dst)
            assert set(sent.tolist()) <= {i for p, i in plan.sources[dst].tolist() if p == src}
            assert not torch.isin(groups[src][sent], torch.tensor([1])).any()
    assert sum(len(s) for s in plan.sources) == 8


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        # process p holds rows whose ids encode (p, i); two processes hold 2 groups of 4 rows each plus a carried group
        groups = [torch.tensor([0, 1, 0, 1, 2, 2]), torch.tensor([1, 0, 1, 0, 2, 2])]
        ids = 100 * rank + torch.arange(6)
        local = {
            "completion_ids": ids.view(-1, 1).repeat(1, 3),
            "completion_mask": torch.ones(6, 3, dtype=torch.long),
            "advantages": torch.ones(6),
            "_group": groups[rank],
        }
        plan = plan_exchange(groups, [0, 1], 10)
        rows = mask_padding(exchange_rows(local, plan, rank=rank, processes=2), plan.padding[rank])
        torch.save({"rows": rows, "plan": plan.sources[rank]}, os.path.join(out, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def test_two_processes_receive_exactly_their_slice(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        saved = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        rows, sources = saved["rows"], saved["plan"]
        assert rows["completion_ids"].size(0) == 5  # its share of the 10-row batch, never the whole batch
        expected = (100 * sources[:, 0] + sources[:, 1]).tolist()
        assert rows["completion_ids"][:, 0].tolist() == expected
        real = rows["_group"] >= 0
        assert rows["completion_mask"][~real].sum() == 0 and rows["advantages"][~real].sum() == 0
        assert set(rows["_group"][real].tolist()) <= {0, 1}  # the carried group 2 stayed where it was
    assert _batch.widths({"completion_ids": rows["completion_ids"]}) == {"completion_ids": 3}


def test_the_last_rounds_rows_are_freed_before_the_batch_is_assembled(tmp_path):
    """Assembly copies the kept rows: the round they came from must not be alive beside the copies (memory peak)."""
    import gc
    import weakref

    from _tiny import tiny_trainer

    from dapo_trl import DAPOTrainer

    class Spy(DAPOTrainer):
        rounds: list = []
        alive_at_assembly: list = []

        def _generate_and_score_round(self, indices, rows):
            scored = super()._generate_and_score_round(indices, rows)
            self.rounds.append(weakref.ref(scored.local["completion_ids"]))
            return scored

        def _assemble_batch(self, step):
            gc.collect()
            self.alive_at_assembly.append(self.rounds[-1]() is not None)
            return super()._assemble_batch(step)

    tiny_trainer(tmp_path, cls=Spy, max_steps=2).train()
    assert Spy.alive_at_assembly == [False, False]
