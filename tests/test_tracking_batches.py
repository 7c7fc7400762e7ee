"""A run's record reaches the store in few calls (a real sqlite store): its params, tags,
metrics and datasets gathered into batches record exactly what one call per record records;
a strategy's option keys are known without composing where its option sets only ``freeze.*``;
the sweep's composition of a job's config is the one the job runs with."""

from __future__ import annotations

import pickle

import cloudpickle
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient

from ablate import config, workers
from ablate.tracking import params
from ablate.tracking.journal import Journal, gathered


def record(journal: Journal, data: str) -> None:
    """What a run records first, with a key twice at one step and datasets in a row."""
    journal.params({"trainer.lr": 5e-5, "freeze.name": "none"})
    journal.tags({"ablate.identity": "abc", "ablate.heartbeat": "1"})
    for i, split in enumerate(("train", "dev", "test")):
        journal.dataset(f"naija/{split}", f"{data}/{split}.conllu", f"{i:032x}", split)
    journal.dataset("naija/train", f"{data}/train.conllu", f"{0:032x}", "train")  # again
    for epoch in (1, 2):
        journal.metrics({"train_loss": 1.0 / epoch, "dev_accuracy": 0.5 + epoch / 10}, epoch)
        journal.metrics({"train_loss": 0.9 / epoch}, epoch)  # a second point at that step
        journal.tags({"ablate.heartbeat": str(epoch + 1)})
    journal.metrics({"test_accuracy": 0.75}, None)


def stored(client: MlflowClient, run_id: str) -> dict:
    run = client.get_run(run_id)
    history = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        for key in run.data.metrics
    }
    datasets = sorted(
        (d.dataset.name, d.dataset.digest, d.tags[0].value) for d in run.inputs.dataset_inputs
    )
    return {"params": run.data.params, "tags": user_tags(run), "history": history, "in": datasets}


def user_tags(run) -> dict[str, str]:
    return {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}


def test_gathered_records_store_what_one_call_per_record_stores(store, tmp_path):
    client = MlflowClient(store)
    experiment = client.create_experiment("batches")
    runs = {}
    for gather in (False, True):
        run_id = client.create_run(experiment).info.run_id
        journal = Journal(tmp_path / f"journal-{gather}", store, run_id, gather=gather)
        record(journal, str(tmp_path))
        # gathered: nothing sent until a record of another kind, or a flush
        assert journal.pending == (13 if gather else 0)
        journal.text("done", "note.txt")
        assert journal.pending == 0
        runs[gather] = run_id
    one_by_one, batched = (stored(client, runs[g]) for g in (False, True))
    assert batched == one_by_one
    assert batched["history"]["train_loss"] == [(1, 0.9), (1, 1.0), (2, 0.45), (2, 0.5)]
    assert batched["tags"]["ablate.heartbeat"] == "3"
    assert len(batched["in"]) == 3


def test_a_batch_holds_no_key_twice_and_stays_within_mlflows_limits():
    def metrics(step, *keys):
        return {"op": "metrics", "metrics": dict.fromkeys(keys, 1.0), "step": step, "ts": 0}

    pending = [
        {"op": "params", "params": {"a": "1"}},
        metrics(1, "loss", "acc"),
        metrics(2, "loss"),  # another step: the same batch
        {"op": "tags", "tags": {"t": "1"}},
        metrics(2, "loss"),  # again at step 2: the next batch
        {"op": "text", "text": "x", "path": "x.txt"},
    ]
    assert gathered(pending) == 4
    assert gathered(pending[4:]) == 1 and gathered(pending[5:]) == 1
    many = [{"op": "tags", "tags": {f"k{i}": "v" for i in range(60)}}] * 2
    many[1] = {"op": "tags", "tags": {f"j{i}": "v" for i in range(60)}}
    assert gathered(many) == 1  # 120 tags: over MLflow's 100 per batch


def test_an_option_that_sets_only_freeze_keys_needs_no_composition():
    options = sorted(p.stem for p in (config.conf_dir() / "freeze").glob("*.yaml"))
    own = [
        o for o in options if params._own_package_only(config.conf_dir() / "freeze" / f"{o}.yaml")
    ]
    assert {"none", "all", "first2"} <= set(own) and "features" not in own and "lora" not in own
    for option in options:  # the short answer is the composed one
        composed = composed_option_keys(option)
        assert params.option_keys(option) == composed, option
        if option in own:
            assert composed == frozenset()
    assert {"model.head", "trainer.cache_frozen"} <= params.option_keys("features")


def composed_option_keys(option: str) -> frozenset[str]:
    from omegaconf import OmegaConf

    def flat(o):
        tree = OmegaConf.to_container(config.composed(f"freeze={o}"), resolve=False)
        tree.pop("freeze")
        return params.flatten(tree)

    mine, base = flat(option), flat("none")
    return frozenset(k for k in mine.keys() | base.keys() if mine.get(k) != base.get(k))


def test_the_launch_hands_each_job_the_config_the_sweeper_composed_to_check_it():
    from hydra import initialize_config_dir

    config.register()
    with initialize_config_dir(str(config.conf_dir()), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = config.compose("hydra/launcher=workers", hydra=True)
        kept = workers.Kept(loader)
        checked = kept.load_sweep_config(master, ["freeze=all", "seed=3"])
        assert kept.load_sweep_config(master, ["freeze=first2"]).freeze.name == "first2"
        assert kept.take(master.copy()) == {}  # another sweep's config: none of its jobs
        kept.load_sweep_config(master, ["freeze=all", "seed=3"])
        taken = kept.take(master)
        assert list(taken) == [("freeze=all", "seed=3")] and kept.take(master) == {}
        assert taken[("freeze=all", "seed=3")] == checked and checked.seed == 3
        # it travels to a worker with the launcher's context (cloudpickle, as the launch sends)
        assert pickle.loads(cloudpickle.dumps(kept)).get_search_path() is not None


def test_a_journal_line_cut_short_by_a_kill_is_dropped_and_the_journal_goes_on(store, tmp_path):
    client = MlflowClient(store)
    run_id = client.create_run(client.create_experiment("cut")).info.run_id
    journal = Journal(tmp_path / "journal", store, run_id, gather=True)
    journal.metrics({"dev_accuracy": 0.5}, 1)
    lines = tmp_path / "journal" / "journal.jsonl"
    with lines.open("a") as f:  # what a SIGKILL mid-write leaves: half a record, no newline
        f.write('{"op":"metrics","data":{"dev_acc')
    again = Journal(tmp_path / "journal", store, run_id, gather=True)  # the resumed job's
    assert again.pending == 1  # the whole record before it is kept, unsent
    again.metrics({"dev_accuracy": 0.75}, 2)
    again.flush()
    history = client.get_metric_history(run_id, "dev_accuracy")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.75)]
    assert all(line.endswith("}") for line in lines.read_text().splitlines())
