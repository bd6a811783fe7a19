"""Lightning's StepscopeCallback serves what the plain-loop SDK serves for the same
workload: 2 DDP ranks (gloo) → callback → a real exporter → /metrics."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")

from tests.support.integration_runs import (
    assert_same_series,
    datagrams,
    exporter,
    received,
    run_ranks,
    served,
)


def test_lightning_ddp_serves_the_plain_loops_series(tmp_path: Path) -> None:
    exp, ingest, uuids = exporter(tmp_path)
    try:
        plain = run_ranks("plain-ddp", "plain", ingest, uuids, tmp_path)
        framework = run_ranks("lightning-ddp", "lightning", ingest, uuids, tmp_path)
        assert all(r["comm_watched"] for r in plain + framework)
        assert_same_series(served(exp, "plain"), served(exp, "lightning"))
    finally:
        assert exp.stop() == 0


def test_accumulated_micro_batches_make_one_step_and_the_users_profiler_still_profiles() -> None:
    import lightning.pytorch as pl
    import torch

    from stepscope.train.lightning import StepscopeCallback
    from tests.workers.integration_worker import BATCH, TOKENS, TinyLM, make_collate, samples

    class Module(pl.LightningModule):
        flops_per_batch = 1000.0

        def __init__(self) -> None:
            super().__init__()
            self.lm = TinyLM()

        def training_step(self, batch: dict[str, torch.Tensor], idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.lm(**batch)["loss"]
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    with datagrams() as (col, ingest):
        cb = StepscopeCallback("accum", ingest=ingest, warmup_steps=0)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1,
                             accumulate_grad_batches=2, profiler="simple", logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[cb])
        loader = torch.utils.data.DataLoader(samples(8 * BATCH, 0), batch_size=BATCH,
                                             collate_fn=make_collate(0.01))
        trainer.fit(Module(), loader)
        got = received(col, 4)
    assert cb.errors == 0
    assert [(d["step"], d["tokens"], d["flops"]) for d in got] == [
        (i, 2 * TOKENS, 2000.0) for i in range(4)]
    # each step's first fetch (10 ms) was timed through the user's profiler as data wait
    assert all(0.009 <= d["data"] <= d["dur"] for d in got[1:]), got
    assert all(d["precision"] == "fp32" for d in got)
    # the tap is gone and the user's profiler saw every fetch
    assert type(trainer.profiler).__name__ == "SimpleProfiler"
    fetches = [k for k in trainer.profiler.recorded_durations if "train_dataloader_next" in k]
    assert fetches and len(trainer.profiler.recorded_durations[fetches[0]]) >= 8


def test_a_failing_token_count_is_counted_and_lightning_trains_on() -> None:
    import lightning.pytorch as pl
    import torch

    from stepscope.train.lightning import StepscopeCallback
    from tests.workers.integration_worker import BATCH, TinyLM, make_collate, samples

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lm = TinyLM()

        def training_step(self, batch: dict[str, torch.Tensor], idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.lm(**batch)["loss"]
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def broken(batch: object) -> int:
        raise RuntimeError("a tokens_fn that breaks")

    with datagrams() as (col, ingest):
        cb = StepscopeCallback("broken", ingest=ingest, tokens_fn=broken)
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False,
                             enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False, callbacks=[cb])
        loader = torch.utils.data.DataLoader(samples(3 * BATCH, 0), batch_size=BATCH,
                                             collate_fn=make_collate(0.0))
        trainer.fit(Module(), loader)  # does not raise
        got = received(col, 3)
    assert trainer.global_step == 3
    assert cb.errors == 3  # one per batch, and each step still reported
    assert [(d["step"], d["tokens"]) for d in got] == [(0, 0), (1, 0), (2, 0)]


def test_checkpoint_saves_and_validation_are_named_spans(tmp_path: Path) -> None:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from stepscope.train.lightning import StepscopeCallback
    from tests.workers.integration_worker import BATCH, TinyLM, make_collate, samples

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lm = TinyLM()

        def training_step(self, batch: dict[str, torch.Tensor], idx: int) -> torch.Tensor:
            loss: torch.Tensor = self.lm(**batch)["loss"]
            return loss

        def validation_step(self, batch: dict[str, torch.Tensor], idx: int) -> None:
            self.lm(**batch)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    with datagrams() as (col, ingest):
        cb = StepscopeCallback("spans", ingest=ingest, warmup_steps=0)
        # the stepscope callback listed after ModelCheckpoint: Lightning runs checkpoint
        # callbacks last anyway, so the step is closed before the save
        trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=6, logger=False,
                             val_check_interval=3, num_sanity_val_steps=1,
                             enable_progress_bar=False, enable_model_summary=False,
                             callbacks=[saves, cb])  # fmt: skip
        train = torch.utils.data.DataLoader(samples(6 * BATCH, 0), batch_size=BATCH,
                                            collate_fn=make_collate(0.0))  # fmt: skip
        val = torch.utils.data.DataLoader(samples(2 * BATCH, 1), batch_size=BATCH,
                                          collate_fn=make_collate(0.0))  # fmt: skip
        trainer.fit(Module(), train, val)
        got = received(col, 6)
    assert cb.errors == 0
    spans = [d.get("spans", {}) for d in got]
    # after optimizer step N, in step N+1's datagram: saves after 2 and 4, validation
    # after 3 (the sanity check runs before the first step: in no step)
    assert [i for i, s in enumerate(spans) if "checkpoint" in s] == [2, 4], spans
    assert [i for i, s in enumerate(spans) if "evaluation" in s] == [3], spans
    assert all(set(s) <= {"checkpoint", "evaluation"} for s in spans)
    assert len(list(tmp_path.glob("*.ckpt"))) >= 2  # the saves happened, unchanged
    assert "save_checkpoint" not in vars(trainer)  # the trainer's own method again
