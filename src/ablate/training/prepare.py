"""Everything a run needs, loaded and checked before its MLflow run opens: an error here (missing
data, a bad label, an offline hub id, a setting that cannot work on this machine) leaves no run
behind."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import OmegaConf
from transformers import set_seed

from ablate import plugins, strategies, switches, tasks
from ablate.data.dataset import Encoded, default_dir, encode_splits
from ablate.data.encode import count_scored
from ablate.data.files import SplitFiles, extra_test_paths, locate
from ablate.data.read import read_checked, read_splits
from ablate.data.sentences import Sentence
from ablate.errors import AblateError
from ablate.models.build import build, load_tokenizer
from ablate.models.source import check_source
from ablate.overrides import check_values
from ablate.strategies.base import Applied
from ablate.training.resources import reset_peak_rss, set_wait_policy, torch_threads

if TYPE_CHECKING:
    from ablate.config import DataConfig, DataCore, TrainCore

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """A run's inputs: its task, data (files, sentences, features), tokenizer and the model with
    its strategy applied, on ``device`` with ``threads`` CPU threads."""

    task: tasks.Task
    files: SplitFiles
    sentences: dict[str, list[Sentence]]
    held_out: str | None  # what the test set holds, when it is held out of train
    encoded: Encoded
    extra: dict[str, list[dict]]  # data.extra_test features, by treebank folder
    tokenizer: Any
    applied: Applied
    device: str
    threads: int
    wait_policy: str  # OMP_WAIT_POLICY as this process's OpenMP runs with it
    peak_rss: str  # whose peak memory peak_rss_mb measures: ``job`` or ``process``


def read_extra_tests(data: DataCore, task: tasks.Task) -> dict[str, list[Sentence]]:
    """The ``data.extra_test`` files, read and label-checked, by name: the file's folder (e.g.
    ``UD_English-EWT``). A path is absolute, or relative to the working directory or ``data.root``.
    """
    paths = list(data.extra_test or [])
    if paths and not task.extra_test:
        able = ", ".join(name for name, t in tasks.TASKS.items() if t.extra_test)
        raise AblateError(
            f"data.extra_test: task {task.name!r} cannot score extra test files (tasks that can: "
            f"{able})"
        )
    found: dict[str, list[Sentence]] = {}
    for path in extra_test_paths(data):
        name = path.resolve().parent.name
        if name in found:
            raise AblateError(
                f"data.extra_test: two files in folders named {name!r}; their metrics "
                f"(test_{task.primary_metric}/{name}) would clash"
            )
        found[name] = read_checked(path, task.read, task.labels, data.lowercase)
    return found


def check_scored(name: str, features: list, sentences: list, task: tasks.Task) -> None:
    """Refuse features that would score part of a split: every gold item exactly once."""
    scored, gold = count_scored(features), sum(len(s.words) for s in sentences)
    if scored != gold:
        raise AblateError(f"{name}: {scored} {task.item_name} encoded for scoring, gold has {gold}")


def check_switches(cfg: TrainCore) -> None:
    """Refuse a switch set to a value outside its choices (``ablate.switches``)."""
    for switch in switches.SWITCHES:
        value = OmegaConf.select(cfg, switch.key)
        if switch.choices and value not in switch.choices:
            raise AblateError(f"{switch.key}={value!r} is not one of {', '.join(switch.choices)}")


def cache_dir(data: DataConfig) -> Path | None:
    """The read and tokenised cache's folder (``data.tokenized_cache_dir``), created; None with
    the cache off. A folder that cannot be written is an error naming the key."""
    if not data.tokenized_cache:
        return None
    path = Path(data.tokenized_cache_dir or default_dir()).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        writable = os.access(path, os.W_OK | os.X_OK)
    except OSError as exc:
        writable, why = False, exc.strerror
    else:
        why = "not writable"
    if not writable:
        raise AblateError(
            f"data.tokenized_cache_dir={path}: cannot keep the cache there ({why}); choose a "
            f"writable folder, or data.tokenized_cache=false"
        )
    return path


def prepare(cfg: TrainCore) -> Prepared:
    """Load and check everything ``cfg`` needs, in this process; nothing is recorded."""
    peak_rss = reset_peak_rss()  # the job's memory from here: its data and model included
    threads = torch_threads(cfg.trainer)
    torch.set_num_threads(threads)
    wait_policy = set_wait_policy(
        cfg.trainer
    )  # as OpenMP read it (``ablate.train`` set it in time)
    set_seed(cfg.seed)  # the head's initialisation below draws from it
    task = tasks.get(cfg.data.task)
    check_source(cfg.model)  # a missing model fails in seconds, before the data
    check_values(cfg)  # its command line's are checked already; an option file's here
    check_switches(cfg)
    files = locate(cfg.data)
    d = cfg.data
    cache = cache_dir(d)
    sentences, held = read_splits(d, files, task.read, task.labels, cache)
    extra_sentences = read_extra_tests(d, task)

    tokenizer = load_tokenizer(cfg.model)
    label2id = {name: i for i, name in enumerate(task.labels)}
    encoded = encode_splits(
        sentences, task.encode, tokenizer, label2id, d.max_length, cache, files.sha256
    )
    for split, feats in encoded.features.items():
        check_scored(split, feats, sentences[split], task)
    extra = {
        name: task.encode(sents, tokenizer, label2id, d.max_length)
        for name, sents in extra_sentences.items()
    }
    for name, feats in extra.items():
        check_scored(f"data.extra_test {name}", feats, extra_sentences[name], task)

    applied = strategies.apply(build(cfg.model, task.model_class, task.labels), cfg.freeze)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ctx = plugins.Context(
        cfg, task, applied, applied.model, {}, tokenizer, None, device, task.collator
    )
    for each in plugins.active():
        each.check(ctx)
    return Prepared(
        task,
        files,
        sentences,
        held,
        encoded,
        extra,
        tokenizer,
        applied,
        device,
        threads,
        wait_policy,
        peak_rss,
    )
