"""What the benches share: the composed config, data slices, and the plain recipe they compare
ablate against — the earlier study's stock HF Trainer, the tokenizer run for every job, random
batches padded per batch (``DataCollatorForTokenClassification``), the Trainer's default AdamW
and eval batches of 8, on the same data, model, frozen parameters, lr, batch size, weight decay
and epochs as ablate."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def compose(overrides: list[str]):
    """The composed ``train`` config with ``overrides``, as ``python -m ablate.train`` sees it."""
    from ablate import config

    return config.compose(*overrides)


def _blocks(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [b.strip("\n") + "\n" for b in text.split("\n\n") if b.strip()]


def write_slice(data: str, root: Path, sizes: dict[str, int], source: str | None = None) -> str:
    """The first ``sizes[split]`` sentences of dataset ``data`` (read under ``source``, else its
    configured ``data.root``) as a treebank under ``root/ud``; returns its folder name
    (``data=ud data.treebank=<name>``)."""
    from ablate.data.files import locate

    cfg = compose([f"data={data}", *([f"data.root={source}"] if source else [])])
    files = locate(cfg.data)
    name = f"UD_Bench-{cfg.data.name}"
    folder = root / "ud" / name
    folder.mkdir(parents=True, exist_ok=True)
    for split, path in files.paths.items():
        blocks = _blocks(path)[: sizes[split]]
        (folder / f"bench-ud-{split}.conllu").write_text("\n".join(blocks) + "\n", "utf-8")
    return name


def plain_accuracy(eval_pred) -> dict[str, float]:
    """The study's compute_metrics: accuracy over the scored positions, from the full logits the
    Trainer gathered, or from ids a recipe argmaxed on the device."""
    import numpy as np

    from ablate.tasks.metrics import accuracy, scored

    preds = eval_pred.predictions
    preds = np.asarray(preds[0] if isinstance(preds, tuple) else preds)
    labels = np.asarray(eval_pred.label_ids)
    ids = preds if preds.ndim == labels.ndim else np.argmax(preds, axis=-1)
    gold, pred = scored(ids, labels)
    return {"accuracy": accuracy(gold, pred), "words": float(gold.size)}


def _argmax(logits, labels):
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(dim=-1)


@contextlib.contextmanager
def _cudnn_sdp(enabled: bool):
    """cuDNN attention on or off for the job (a process-wide setting), restored after it."""
    import torch

    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def plain_fit(
    cfg, run, output_dir: str, knobs: dict | None = None, measure_flops: bool = True,
    callbacks: Callable[[Any], list] = lambda collator: [],
) -> None:  # fmt: skip
    """The plain recipe on ``cfg``'s data, model, freezing and optimisation settings, recorded
    through ``run`` (a ``Recorder``). ``knobs``: what a user changes in it (``gpu_plain.RECIPES``:
    bf16, tf32, optim, compile, eval_batch, argmax_on_device, nan_filter, cudnn_sdp);
    ``callbacks``: more Trainer callbacks, made from the counting collator."""
    import torch
    from transformers import (
        DataCollatorForTokenClassification,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    from ablate import strategies, tasks
    from ablate.data.files import locate
    from ablate.models.build import build, load_tokenizer
    from ablate.training.callbacks import EpochLogger
    from ablate.training.meter import CountingCollator, SpeedMeter
    from ablate.training.resources import peak_rss_mb, torch_threads

    knobs = knobs or {}
    torch.set_num_threads(torch_threads(cfg.trainer))
    set_seed(cfg.seed)
    task = tasks.get(cfg.data.task)
    files = locate(cfg.data)
    sentences = {s: task.read(p, lowercase=cfg.data.lowercase) for s, p in files.paths.items()}
    if cfg.data.max_train_sentences is not None:
        sentences["train"] = sentences["train"][: cfg.data.max_train_sentences]
    tokenizer = load_tokenizer(cfg.model)
    label2id = {name: i for i, name in enumerate(task.labels)}
    t0 = time.perf_counter()
    features = {
        s: task.encode(sents, tokenizer, label2id, cfg.data.max_length)
        for s, sents in sentences.items()
    }
    run.metrics({"tokenize_time_s": time.perf_counter() - t0})
    model = strategies.apply(build(cfg.model, task.model_class, task.labels), cfg.freeze).model
    t = cfg.trainer
    extra = {k: knobs[v] for k, v in (("optim", "optim"), ("torch_compile", "compile"),
             ("torch_compile_backend", "compile_backend"), ("tf32", "tf32"),
             ("per_device_eval_batch_size", "eval_batch")) if knobs.get(v)}  # fmt: skip
    args = TrainingArguments(
        output_dir=output_dir,
        num_train_epochs=t.epochs,
        learning_rate=t.lr,
        per_device_train_batch_size=t.batch_size,
        weight_decay=t.weight_decay,
        eval_strategy="epoch",
        logging_strategy="epoch",
        save_strategy="no",
        report_to="none",
        seed=cfg.seed,
        bf16=bool(knobs.get("bf16")),
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
        logging_nan_inf_filter=knobs.get("nan_filter", True),
        **extra,
    )
    collator = CountingCollator(DataCollatorForTokenClassification(tokenizer))
    with _cudnn_sdp(knobs.get("cudnn_sdp", True)):
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=features["train"],
            eval_dataset=features["dev"],
            data_collator=collator,
            processing_class=tokenizer,
            compute_metrics=plain_accuracy,
            preprocess_logits_for_metrics=_argmax if knobs.get("argmax_on_device") else None,
            callbacks=[
                EpochLogger(run),
                SpeedMeter(run, collator, measure_flops=measure_flops),
                *callbacks(collator),
            ],
        )
        trainer.train()
        for split in ("dev", "test"):  # the same final predictions as ablate makes
            out = trainer.predict(features[split])
            if split == "test":
                run.metrics({"test_accuracy": plain_accuracy(out)["accuracy"]})
    run.metrics({"peak_rss_mb": peak_rss_mb()})
