"""What the benches share: the composed config, data slices, and the plain recipe they compare
ablate against — the earlier study's stock HF Trainer, the tokenizer run for every job, random
batches padded per batch (``DataCollatorForTokenClassification``), the Trainer's default AdamW
and eval batches of 8, on the same data, model, frozen parameters, lr, batch size, weight decay
and epochs as ablate."""

from __future__ import annotations

import time
from pathlib import Path


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
    """The study's compute_metrics: argmax over the full logits the Trainer gathered."""
    import numpy as np

    from ablate.tasks.metrics import accuracy, scored

    logits = eval_pred.predictions
    logits = logits[0] if isinstance(logits, tuple) else logits
    gold, pred = scored(np.argmax(logits, axis=-1), np.asarray(eval_pred.label_ids))
    return {"accuracy": accuracy(gold, pred), "words": float(gold.size)}


def plain_fit(cfg, run, output_dir: str, bf16: bool = False, measure_flops: bool = True) -> None:
    """The plain recipe on ``cfg``'s data, model, freezing and optimisation settings, recorded
    through ``run`` (a ``Recorder``); ``bf16``: what a user adds for a GPU, ``bf16=True``."""
    import numpy as np
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
    from ablate.tasks.metrics import accuracy, scored
    from ablate.training.callbacks import EpochLogger
    from ablate.training.meter import CountingCollator, SpeedMeter
    from ablate.training.resources import peak_rss_mb, torch_threads

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
        bf16=bf16,
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    collator = CountingCollator(DataCollatorForTokenClassification(tokenizer))
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=features["train"],
        eval_dataset=features["dev"],
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=plain_accuracy,
        callbacks=[EpochLogger(run), SpeedMeter(run, collator, measure_flops=measure_flops)],
    )
    trainer.train()
    for split in ("dev", "test"):  # the same final predictions as ablate makes
        out = trainer.predict(features[split])
        logits = out.predictions[0] if isinstance(out.predictions, tuple) else out.predictions
        gold, pred = scored(np.argmax(logits, axis=-1), np.asarray(out.label_ids))
        if split == "test":
            run.metrics({"test_accuracy": accuracy(gold, pred)})
    run.metrics({"peak_rss_mb": peak_rss_mb()})
