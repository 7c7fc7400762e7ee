"""The final model kept with its run (``trainer.keep_model``): the run's MLflow logged model
``model``, so ``runs:/<run id>/model`` names it, and ``load`` gives it back as a pipeline.

A Hugging Face task model is saved with MLflow's transformers flavour: plain
``mlflow.transformers.load_model`` loads it too. Two kinds that flavour cannot hold keep a layout
of their own (flavour ``ablate`` in the MLmodel file), which ``load`` reads:

- ``adapter``: a peft method (LoRA, DoRA, AdaLoRA, VeRA, ...) over a pretrained encoder keeps
  its adapter and trained head (peft's ``save_pretrained``) and the tokenizer; ``load`` reads the
  encoder from ``model.name_or_path`` again. The transformers flavour would save a PEFT model's
  encoder with the adapter's layers in it, whose query and value weights then load as random
  ones, or would refer to a hub encoder whose head lacks the run's labels.
- ``delta``: a model trained from pretrained weights keeps only what training changed: the
  tensors (or, of the word embeddings, the rows) that differ from the pretrained ones, the
  tokenizer, and the base: ``model.name_or_path`` and a sha256 of the pretrained weights it
  leaves in place, which ``load`` checks (``ablate.training.delta``). A frozen strategy then
  keeps megabytes instead of the whole encoder; a model whose changes are over ``DELTA_SHARE``
  of its bytes is kept whole, in the transformers flavour.
- ``weights``: the BiLSTM head (``model.head=bilstm``, no Hugging Face class) over a random
  encoder: its config, its weights (safetensors) and the tokenizer.

What is saved is the trained model as a new process builds it: the task model built again from
``model``'s config with the trained weights, so no module a speed plugin swapped in (fast dropout,
trained embedding rows) goes with it. A peft method over a random encoder
(``model.pretrained=false``) is merged into it and kept whole: that encoder cannot be had again.
"""

from __future__ import annotations

import copy
import logging
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import OmegaConf
from torch import nn
from transformers import PreTrainedModel

from ablate import tasks
from ablate.errors import AblateError
from ablate.models import anatomy
from ablate.models.build import build
from ablate.quiet import quieted
from ablate.tracking.recorder import Recorder
from ablate.training import delta

if TYPE_CHECKING:
    from ablate.config import ModelConfig

log = logging.getLogger(__name__)

NAME = "model"  # the logged model's name: runs:/<run id>/model
# Kept as a delta unless training changed nearly all of the model's bytes: then the whole model
# costs hardly more, in the flavour any MLflow client loads
DELTA_SHARE = 0.9
FLAVOUR = "ablate"
PIPELINES = {"token": "token-classification", "sequence": "text-classification"}


def keep(model: ModelConfig, task: tasks.Task, net: nn.Module, tokenizer, record: Recorder) -> None:
    """Save the trained ``net`` (the strategy's, inside any speed plugin's wrapper), built from
    the ``model`` node, and log it as the run's logged model ``model``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / NAME
        save(model, task, net, tokenizer, path)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        record.model(str(path), NAME)
    record.metrics({"kept_model_mib": round(size, 2)})  # what the run costs on disk
    log.info("kept the final model (%.1f MiB): runs:/%s/%s", size, record.id, NAME)


def save(model: ModelConfig, task: tasks.Task, net: nn.Module, tokenizer, path: Path) -> None:
    """Write ``net`` (built from the ``model`` node) to the new folder ``path`` as an MLflow model
    that ``load`` reads."""
    fields: dict[str, Any] = OmegaConf.to_container(model, resolve=True)
    if _is_peft(net) and model.pretrained:
        net.save_pretrained(str(path / "adapter"))
        _own_layout(path, "adapter", task, fields, tokenizer)
        return
    plain = plain_copy(model, task, net)
    if model.pretrained and _save_delta(model, task, plain, path):
        _own_layout(path, "delta", task, fields, tokenizer)
        return
    if not isinstance(plain, PreTrainedModel):
        plain.config.save_pretrained(str(path / "model"))
        from safetensors.torch import save_file

        save_file(plain.state_dict(), str(path / "model" / "model.safetensors"))
        weights_cfg = {**fields, "name_or_path": "model", "pretrained": False}
        _own_layout(path, "weights", task, weights_cfg, tokenizer)
        return
    import mlflow.transformers

    # The flavour warns that it finds no model card or licence on the hub for a local model, and
    # notes each step; ``keep`` says what is kept in one line.
    with quieted({"mlflow.transformers": logging.ERROR}):
        mlflow.transformers.save_model(
            {"model": plain, "tokenizer": tokenizer},
            str(path),
            task=PIPELINES[task.head],
            pip_requirements=_requirements(),  # else MLflow loads the model again to infer them
        )


def _save_delta(model: ModelConfig, task: tasks.Task, plain: nn.Module, path: Path) -> bool:
    """Write what training changed in ``plain`` to ``path/delta`` unless it is most of it."""
    from safetensors.torch import save_file

    with torch.random.fork_rng(devices=[]), quieted({"ablate.models.build": logging.WARNING}):
        base = build(model, task.model_class, task.labels).state_dict()  # as load builds it
    trained = plain.state_dict()
    kept = delta.changes(base, trained)
    if delta.nbytes(kept) > DELTA_SHARE * delta.nbytes(trained):
        return False
    (path / "delta").mkdir(parents=True)
    save_file(
        kept,
        str(path / "delta" / "model.safetensors"),
        metadata={"base_sha256": delta.digest(base, kept)},
    )
    return True


def plain_copy(model: ModelConfig, task: tasks.Task, trained: nn.Module) -> nn.Module:
    """The task model built afresh from the ``model`` node (no weights read) holding ``trained``'s
    weights; a peft method merged into it."""
    if _is_peft(trained):
        from peft.utils import ModulesToSaveWrapper

        trained = copy.deepcopy(trained)
        # What trains whole (the head) leaves peft's wrappers as its trained copy before the
        # merge: peft 0.21 fails to unload a wrapped module without a weight of its own (BERT's
        # pooler, under LoHa, LoKr, VeRA and (IA)^3), and LN tuning leaves the wrappers in place
        for wrapper in [m for m in trained.modules() if isinstance(m, ModulesToSaveWrapper)]:
            parent, name = anatomy.owner(trained, wrapper)
            setattr(parent, name, wrapper.modules_to_save[wrapper.active_adapter])
        trained = trained.merge_and_unload()
    fresh = build(OmegaConf.merge(model, {"pretrained": False}), task.model_class, task.labels)
    # A speed plugin's module may hold more than its plain counterpart (the embedding rows it
    # trains); every weight of the plain model must come from the trained one.
    missing, _ = fresh.load_state_dict(trained.state_dict(), strict=False)
    if missing:
        raise AblateError(
            f"trainer.keep_model: the trained model lacks {len(missing)} weights of the plain "
            f"{type(fresh).__name__} ({', '.join(missing[:3])}); set trainer.keep_model=false"
        )
    return fresh.eval()


def load(model_uri: str, base: str | None = None, **pipeline_kwargs):
    """A kept model (``runs:/<run id>/model``, ``models:/<model id>`` or its local folder) as a
    transformers pipeline: ``load(uri)("A new sentence")`` labels its words (or the sentence).

    ``base``: where a peft adapter's encoder is now, if not at the run's ``model.name_or_path``;
    ``pipeline_kwargs`` go to ``transformers.pipeline`` (e.g. ``aggregation_strategy="first"``).
    """
    import mlflow
    from mlflow.models import Model
    from transformers import AutoTokenizer, pipeline

    path = Path(mlflow.artifacts.download_artifacts(model_uri))
    flavours = Model.load(str(path)).flavors
    if FLAVOUR not in flavours:
        import mlflow.transformers

        return mlflow.transformers.load_model(str(path), **pipeline_kwargs)
    conf = flavours[FLAVOUR]
    task = tasks.get(conf["task"])
    model_cfg = OmegaConf.create(conf["model"])
    if conf["kind"] == "delta":
        from safetensors import safe_open
        from safetensors.torch import load_file

        if base is not None:
            model_cfg.name_or_path = base
        model = build(model_cfg, task.model_class, task.labels)
        weights = str(path / "delta" / "model.safetensors")
        with safe_open(weights, "pt") as f:
            sha256 = f.metadata()["base_sha256"]
        delta.apply(model, load_file(weights), sha256, model_cfg.name_or_path)
    elif conf["kind"] == "adapter":
        from peft import PeftModel

        if base is not None:
            model_cfg.name_or_path = base
        encoder = build(model_cfg, task.model_class, task.labels)
        with warnings.catch_warnings():
            # peft checks AdaLoRA's rank pattern as if LoRA's (it is applied all the same) and
            # asks LN tuning's norms for a Linear's shape: neither is the user's to fix
            warnings.filterwarnings("ignore", "The following rank_pattern keys did not match")
            warnings.filterwarnings("ignore", "Unsupported layer type .*LayerNorm")
            model = PeftModel.from_pretrained(encoder, str(path / "adapter"))
    else:
        from safetensors.torch import load_file

        model_cfg.name_or_path = str(path / model_cfg.name_or_path)
        model = build(model_cfg, task.model_class, task.labels)
        model.load_state_dict(load_file(str(path / "model" / "model.safetensors")))
    tokenizer = AutoTokenizer.from_pretrained(str(path / "tokenizer"))
    # The pipeline logs an error for a model class it does not list (the BiLSTM head), which it
    # runs all the same
    with quieted({"transformers.pipelines.base": logging.CRITICAL}):
        return pipeline(
            PIPELINES[task.head], model=model.eval(), tokenizer=tokenizer, **pipeline_kwargs
        )


def _own_layout(path: Path, kind: str, task: tasks.Task, model: dict, tokenizer) -> None:
    from mlflow.models import Model

    tokenizer.save_pretrained(str(path / "tokenizer"))
    mlmodel = Model()
    mlmodel.add_flavor(
        FLAVOUR, kind=kind, task=task.name, model=model, loader="ablate.training.keep.load"
    )
    mlmodel.save(str(path / "MLmodel"))


def _is_peft(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _requirements() -> list[str]:
    from importlib.metadata import version

    from packaging.version import Version

    # public versions: a local label (torch's +cpu) is not on PyPI
    return [f"{p}=={Version(version(p)).public}" for p in ("torch", "transformers")]
