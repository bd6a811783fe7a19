"""Hugging Face: the Trainer's ``StepscopeCallback`` and Accelerate's
``AcceleratorReporter`` serve what the plain-loop SDK serves for the same workload
(2 DDP ranks, gloo, a real exporter); FLOPs come from a transformers config when the
script gives none; gradient accumulation makes one step of several micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.support.integration_runs import (
    assert_same_series,
    datagrams,
    exporter,
    received,
    run_ranks,
    served,
)


def test_trainer_and_accelerate_serve_the_plain_loops_series(tmp_path: Path) -> None:
    exp, ingest, uuids = exporter(tmp_path)
    try:
        plain = run_ranks("plain-ddp", "plain", ingest, uuids, tmp_path)
        trainer = run_ranks("hf-trainer", "trainer", ingest, uuids, tmp_path)
        accel = run_ranks("accelerate", "accelerate", ingest, uuids, tmp_path)
        assert all(r["comm_watched"] for r in plain + trainer + accel)
        reference = served(exp, "plain")
        assert_same_series(reference, served(exp, "trainer"))
        assert_same_series(reference, served(exp, "accelerate"))
    finally:
        assert exp.stop() == 0


def test_a_trainer_with_gradient_accumulation_reports_optimizer_steps_with_config_flops(
        tmp_path: Path) -> None:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from stepscope.train import transformer_flops_per_token
    from stepscope.train.hf import StepscopeCallback, transformer_shape

    seq, batch, accum, steps = 16, 2, 2, 4
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=seq)
    model = GPT2LMHeadModel(config)
    n = model.num_parameters(exclude_embeddings=True)
    assert transformer_shape(model) == (n, 2, 2, 16)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 100, (batch * accum * steps, seq), generator=gen)
    data: list[dict[str, Any]] = [{"input_ids": r, "labels": r} for r in ids]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=batch,
                             gradient_accumulation_steps=accum, max_steps=steps, use_cpu=True,
                             report_to="none", logging_strategy="no", save_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    with datagrams() as (col, ingest):
        cb = StepscopeCallback.attach(trainer, "gpt2-tiny", ingest=ingest, warmup_steps=0)
        trainer.train()
        got = received(col, steps)
    assert cb.errors == 0 and cb.reporter is not None and cb.reporter.dropped == 0
    tokens = batch * accum * seq
    assert [d["step"] for d in got] == list(range(steps))
    assert all(d["tokens"] == tokens for d in got)
    expected = tokens * transformer_flops_per_token(n, 2, 2, 16, seq)
    assert all(d["flops"] == pytest.approx(expected) for d in got)
    assert all(d["precision"] == "fp32" and d["world_size"] == 1 for d in got)


def test_a_failing_token_count_is_counted_and_training_goes_on(tmp_path: Path) -> None:
    from transformers import Trainer, TrainingArguments

    from stepscope.train.hf import StepscopeCallback
    from tests.workers.integration_worker import TinyLM, make_collate, samples

    def broken(batch: Any) -> int:
        raise RuntimeError("a tokens_fn that breaks")

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                             max_steps=3, use_cpu=True, report_to="none",
                             logging_strategy="no", save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=TinyLM(), args=args, train_dataset=samples(24, 1),
                      data_collator=make_collate(0.0))
    with datagrams() as (col, ingest):
        cb = StepscopeCallback.attach(trainer, "broken", ingest=ingest, tokens_fn=broken)
        trainer.train()  # does not raise
        got = received(col, 3)
    assert trainer.state.global_step == 3
    assert cb.errors == 3  # one per fetch of an optimizer step's batches
    assert [(d["step"], d["tokens"]) for d in got] == [(0, 0), (1, 0), (2, 0)]


def test_accelerate_with_gradient_accumulation_reports_one_step_per_optimizer_step() -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from stepscope.train.accelerate import AcceleratorReporter
    from tests.workers.integration_worker import BATCH, TOKENS, TinyLM, make_collate, samples

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    try:
        model = TinyLM()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(samples(8 * BATCH, 0), batch_size=BATCH,
                                             collate_fn=make_collate(0.0))
        model, opt, loader = accelerator.prepare(model, opt, loader)
        with datagrams() as (col, ingest):
            steps = AcceleratorReporter(accelerator, "accum", model=model, ingest=ingest,
                                        flops_per_token=10.0, warmup_steps=0)
            for batch in steps.timed(loader):
                with accelerator.accumulate(model), steps.step(tokens=TOKENS):
                    accelerator.backward(model(**batch)["loss"])
                    opt.step()
                    opt.zero_grad()
            steps.close()
            got = received(col, 4)
    finally:
        AcceleratorState._reset_state(True)  # the next Trainer builds its own
    assert steps.errors == 0 and steps.reporter.steps == 4
    assert [(d["step"], d["tokens"], d["flops"]) for d in got] == [
        (i, 2 * TOKENS, 20.0 * TOKENS) for i in range(4)]
    assert all(d["precision"] == "fp32" and d["world_size"] == 1 for d in got)


def test_the_trainers_checkpoints_evaluation_and_logging_are_named_spans(
    tmp_path: Path,
) -> None:
    from transformers import Trainer, TrainingArguments

    from stepscope.train.hf import StepscopeCallback
    from tests.workers.integration_worker import TinyLM, make_collate, samples

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8,
                             max_steps=6, use_cpu=True, report_to="none",
                             logging_strategy="steps", logging_steps=1,
                             save_strategy="steps", save_steps=2,
                             eval_strategy="steps", eval_steps=3,
                             per_device_eval_batch_size=8, disable_tqdm=True)  # fmt: skip
    trainer = Trainer(model=TinyLM(), args=args, train_dataset=samples(48, 1),
                      eval_dataset=samples(16, 2), data_collator=make_collate(0.0))  # fmt: skip
    with datagrams() as (col, ingest):
        cb = StepscopeCallback.attach(trainer, "spans", ingest=ingest, warmup_steps=0)
        trainer.train()
        got = received(col, 6)
    assert cb.errors == 0
    spans = [d.get("spans", {}) for d in got]
    # what ran after optimizer step N (global_step N) lands in the datagram of step N+1:
    # saves after 2 and 4, evaluation after 3, logging after every step
    assert [i for i, s in enumerate(spans) if "checkpoint" in s] == [2, 4], spans
    assert [i for i, s in enumerate(spans) if "evaluation" in s] == [3], spans
    assert all("logging" in s for s in spans[1:]) and "logging" not in spans[0]
    assert all(sum(s.values()) <= d["dur"] for s, d in zip(spans, got, strict=True))
    assert list((tmp_path).glob("checkpoint-*"))  # the saves happened, unchanged
