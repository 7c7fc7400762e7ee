"""The final model kept with its run (``trainer.keep_model``): MLflow's logged model ``model`` of
the run, which loads as a pipeline that labels a new sentence and predicts what the run's final
evaluation did; and the test predictions beside dev's."""

from __future__ import annotations

import shutil
from pathlib import Path

import mlflow
import pytest
import torch
from helpers.models import predicted
from helpers.runs import compose_cfg, kept_minilm_run, train
from helpers.store import logged
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file, save_file

from ablate.errors import AblateError
from ablate.tasks.pos import UPOS
from ablate.training import keep

SENTENCE = "di man don go market"


def kept_models(store: str, run_id: str) -> list:
    client = MlflowClient(store)
    experiment = client.get_run(run_id).info.experiment_id
    return [m for m in client.search_logged_models([experiment]) if m.source_run_id == run_id]


def assert_tags(tagger) -> None:
    out = tagger(SENTENCE)
    assert [t["word"] for t in out] == SENTENCE.split()  # one sub-word each in MiniLM's vocab
    assert {t["entity"] for t in out} <= set(UPOS)


def test_a_run_keeps_its_final_model_which_loads_and_tags_a_sentence(
    slice_root, store, tmp_path, monkeypatch
):
    # early stopping restores the best epoch's weights: those are what is kept
    run_id, prepared = train(
        slice_root, store, tmp_path, "trainer.epochs=3", "trainer.early_stopping_patience=1"
    )
    (model,) = kept_models(store, run_id)
    assert model.name == "model" and str(model.status) == "READY"
    run = MlflowClient(store).get_run(run_id)
    assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]
    assert model.params["freeze.name"] == run.data.params["freeze.name"]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    tagger = mlflow.transformers.load_model(f"runs:/{run_id}/model")  # MLflow's own loader
    assert type(tagger.model).__name__ == "BertForTokenClassification"
    assert_tags(tagger)
    test = logged(store, run_id, tmp_path, "predictions/test.json")
    assert predicted(tagger.model, prepared, "test") == (test["gold"], test["pred"])
    assert len(test["gold"]) == run.data.metrics["test_words"]
    # the plain model: the trained embedding rows' own tensors (trainer.embedding_rows) stay out
    local = Path(mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model"))
    weights = load_file(str(local / "model" / "model.safetensors"))
    assert set(weights) == set(tagger.model.state_dict())


def test_keep_model_false_keeps_no_model_and_test_predictions_are_logged(
    slice_root, store, tmp_path
):
    run_id, _ = train(slice_root, store, tmp_path, "trainer.epochs=1", "trainer.keep_model=false")
    assert kept_models(store, run_id) == []
    dev = logged(store, run_id, tmp_path, "predictions/dev.json")
    test = logged(store, run_id, tmp_path, "predictions/test.json")
    metrics = MlflowClient(store).get_run(run_id).data.metrics
    assert len(dev["pred"]) == metrics["dev_words"] and len(test["pred"]) == metrics["test_words"]
    assert len(test["gold"]) == len(test["pred"])
    assert test["gold"] != dev["gold"]


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_a_lora_run_keeps_its_adapter_which_loads_over_the_encoder(
    slice_root, store, tmp_path, monkeypatch
):
    run_id, prepared = kept_minilm_run(
        slice_root, store, tmp_path, monkeypatch, "freeze=lora", "trainer.lr=2e-3"
    )
    local = Path(mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model"))
    files = {str(f.relative_to(local)) for f in local.rglob("*") if f.is_file()}
    assert "adapter/adapter_model.safetensors" in files
    assert not [f for f in files if f.endswith("model.safetensors") and "adapter" not in f]
    megabytes = sum(f.stat().st_size for f in local.rglob("*") if f.is_file()) / 2**20
    assert megabytes < 1.5  # the adapter, the head and the tokenizer (docs/operations.md)

    tagger = keep.load(f"runs:/{run_id}/model")
    assert type(tagger.model).__name__ == "PeftModelForTokenClassification"
    assert_tags(tagger)
    test = logged(store, run_id, tmp_path, "predictions/test.json")
    assert predicted(tagger.model, prepared, "test") == (test["gold"], test["pred"])


def test_a_bilstm_head_is_kept_in_its_own_layout_and_loads(
    slice_root, store, tmp_path, monkeypatch
):
    run_id, prepared = train(slice_root, store, tmp_path, "model.head=bilstm", "trainer.epochs=1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    tagger = keep.load(f"runs:/{run_id}/model")
    assert type(tagger.model).__name__ == "BiLSTMTokenClassifier"
    assert_tags(tagger)
    test = logged(store, run_id, tmp_path, "predictions/test.json")
    assert predicted(tagger.model, prepared, "test") == (test["gold"], test["pred"])


def test_a_partly_frozen_minilm_keeps_only_what_training_changed(
    slice_root, store, tmp_path, monkeypatch
):
    run_id, prepared = kept_minilm_run(slice_root, store, tmp_path, monkeypatch, "freeze=first4")
    local = Path(mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model"))
    files = {str(f.relative_to(local)) for f in local.rglob("*") if f.is_file()}
    assert not [f for f in files if f.endswith(".safetensors") and not f.startswith("delta/")]
    kept = load_file(str(local / "delta" / "model.safetensors"))
    # the two trained blocks and the head; the frozen blocks 0-3 stay out, and of the word
    # embeddings only the rows the 48 sentences use (the others: one decay factor)
    assert {n.split(".")[3] for n in kept if n.startswith("bert.encoder.layer.")} == {"4", "5"}
    assert "classifier.weight" in kept
    words = "bert.embeddings.word_embeddings.weight"
    assert words not in kept and 0 < len(kept[words + "@rows"]) < 1000
    assert kept[words + "@values"].shape == (len(kept[words + "@rows"]), 384)
    megabytes = sum(f.stat().st_size for f in local.rglob("*") if f.is_file()) / 2**20
    assert 13 < megabytes < 17  # docs/operations.md: 15.4 MiB for first4 on 200 sentences
    assert MlflowClient(store).get_run(run_id).data.metrics["kept_model_mib"] == round(megabytes, 2)

    tagger = keep.load(f"runs:/{run_id}/model")  # over the pretrained MiniLM, checked by sha256
    assert_tags(tagger)
    test = logged(store, run_id, tmp_path, "predictions/test.json")
    assert predicted(tagger.model, prepared, "test") == (test["gold"], test["pred"])

    # another MiniLM (one frozen weight differs): refused, not silently wrong
    other = tmp_path / "other-minilm"
    shutil.copytree(compose_cfg("model=minilm").model.name_or_path, other)
    weights = load_file(str(other / "model.safetensors"))
    name = next(n for n in weights if "layer.0." in n and n.endswith("bias"))
    weights[name] = weights[name] + 1
    save_file(weights, str(other / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AblateError, match="not the pretrained weights the run trained from"):
        keep.load(f"runs:/{run_id}/model", base=str(other))


def test_a_minilm_changed_throughout_is_kept_whole_in_80_to_95_mb(tmp_path):
    # every weight changed, every row differently: the whole model, in the flavour MLflow's own
    # loader reads, in the bound docs/operations.md quotes
    from ablate import tasks
    from ablate.models.build import build, load_tokenizer

    cfg = compose_cfg("model=minilm")
    task = tasks.get("pos")
    model = build(cfg.model, task.model_class, task.labels)
    torch.manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param), alpha=1e-3)
    keep.save(cfg.model, task, model, load_tokenizer(cfg.model), tmp_path / "model")
    assert "transformers" in mlflow.models.Model.load(str(tmp_path / "model")).flavors
    megabytes = sum(f.stat().st_size for f in (tmp_path / "model").rglob("*") if f.is_file())
    assert 80 < megabytes / 2**20 < 95


def test_a_model_kept_while_the_store_is_away_is_logged_once_it_answers(
    store, tmp_path, monkeypatch
):
    from ablate import tasks
    from ablate.models.build import build, load_tokenizer
    from ablate.tracking import journal

    cfg = compose_cfg("model=tiny")
    task = tasks.get("pos")
    model = build(cfg.model, task.model_class, task.labels)
    keep.save(cfg.model, task, model, load_tokenizer(cfg.model), tmp_path / "saved")
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("away")).info.run_id
    away = journal.Journal(tmp_path / "journal", "http://127.0.0.1:9", run_id)  # no server there
    away.model(str(tmp_path / "saved"), "model")
    assert away.pending == 1 and kept_models(store, run_id) == []

    back = journal.Journal.reopen(tmp_path / "journal", store)
    assert back.flush()
    # a send cut short and tried again takes up the model it created
    (sent,) = (back.folder / "files").iterdir()
    journal._log_model(client, run_id, sent, "model")
    (kept,) = kept_models(store, run_id)
    assert [o.model_id for o in client.get_run(run_id).outputs.model_outputs] == [kept.model_id]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    local = mlflow.artifacts.download_artifacts(f"runs:/{run_id}/model")
    assert mlflow.models.Model.load(local).model_id == kept.model_id
    tagger = mlflow.transformers.load_model(local)
    assert all(
        torch.equal(tensor, model.state_dict()[name])
        for name, tensor in tagger.model.state_dict().items()
    )
