"""Real training runs and a real --multirun into a real sqlite MLflow store."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from helpers.runs import compose_cfg, run_cli, slice_overrides
from helpers.store import logged_runs, new_store, run_info, sweep_parents
from mlflow.tracking import MlflowClient

from ablate import workers
from ablate.config import project_root
from ablate.data.files import sha256_of
from ablate.tasks.pos import UPOS, read_conllu
from ablate.tracking.params import selected
from ablate.tracking.provenance import cpu_model
from ablate.training.resources import usable_cpus


def runs_of(store: str, experiment: str = "ablate"):
    return MlflowClient(store), logged_runs(store, experiment)


def gold_words(slice_root, split: str) -> int:
    path = next((slice_root / "ud" / "UD_Naija-Slice").glob(f"*-ud-{split}.conllu"))
    return sum(len(s.words) for s in read_conllu(path))


@pytest.fixture(scope="module")
def single_run(slice_root, tmp_path_factory):
    """One real run: alternating freeze, 2 epochs, windows of 24 sub-words (splits sentences)."""
    tmp = tmp_path_factory.mktemp("single")
    store = new_store(tmp)
    proc = run_cli(
        *slice_overrides(slice_root, store, tmp), "freeze=alternating", "data.max_length=24"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = runs_of(store)
    assert len(runs) == 1
    return client, runs[0], proc


def test_run_is_finished_and_named_for_what_it_computes(single_run):
    _, run, proc = single_run
    assert run.info.status == "FINISHED"
    # the name, then the overrides that change what it computes (not where it goes)
    assert run.info.run_name == "UD_Naija-Slice-alt-tiny-s42 epochs=2 max_length=24"
    page = f"/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?workflowType="
    assert "browse it with: make ui, then http://127.0.0.1:5000" + page in proc.stderr + proc.stdout


def test_the_job_log_has_one_line_per_epoch_and_no_library_noise(single_run):
    _, _, proc = single_run
    log = proc.stdout + proc.stderr  # a job log: no terminal
    epochs = [line for line in log.splitlines() if "][ablate][INFO] - epoch " in line]
    assert len(epochs) == 2 and "epoch 2/2: dev accuracy " in epochs[1]
    assert "train loss " in epochs[1] and " s training" in epochs[1]
    for noise in ("LOAD REPORT", "dataset had no length", "Writing model shards", "{'loss'"):
        assert noise not in log, noise


def test_params_are_what_a_researcher_set_or_compares(single_run, slice_root, tmp_path):
    client, run, _ = single_run
    p = run.data.params
    assert (p["data.name"], p["freeze.name"], p["model.name"], p["seed"]) == (
        "UD_Naija-Slice",
        "alt",
        "tiny",
        "42",
    )
    assert p["trainer.lr"] == "5e-05" and p["trainer.epochs"] == "2" and p["freeze.every"] == "2"
    assert p["data.max_length"] == "24" and len(p) <= 40
    assert not {"data", "freeze", "model"} & set(p)  # no copies beside the config's own keys
    # where it went, other strategies' keys, switches at their default and the data's pins are
    # in config.yaml (and the datasets), not params
    assert not [k for k in p if k.startswith(("tracking.", "lr_study.", "data.splits."))]
    assert not {"data.root", "freeze.r", "freeze.decay", "trainer.fused_adamw"} & set(p)
    saved = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
    full = Path(saved).read_text()
    assert f"root: {slice_root}" in full and "fused_adamw: true" in full and "r: 8" in full


def test_a_switch_named_on_the_command_line_is_a_param_even_at_its_default():
    cfg = compose_cfg("freeze=lora", "trainer.fused_adamw=true", "trainer.length_grouping=off")
    p = selected(cfg, ("r", "alpha", "dropout", "target_modules"), ["trainer.fused_adamw"])
    assert p["trainer.fused_adamw"] is True and p["trainer.length_grouping"] == "off"
    assert p["freeze.r"] == 8 and "freeze.decay" not in p and "freeze.first" not in p


def test_dev_accuracy_per_epoch_and_final_metrics(single_run, slice_root):
    client, run, _ = single_run
    history = client.get_metric_history(run.info.run_id, "dev_accuracy")
    assert [m.step for m in history] == [1, 2]
    for key in ("train_loss", "epoch_time_s"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == [1, 2]
    m = run.data.metrics
    assert m["best_dev_accuracy"] == max(h.value for h in history)
    assert 0.0 <= m["test_accuracy"] <= 1.0
    assert m["trainable_params"] < m["total_params"]
    assert m["trainable_pct"] == pytest.approx(100 * m["trainable_params"] / m["total_params"])
    for key in ("train_runtime_s", "train_samples_per_s", "peak_rss_mb"):
        assert m[key] > 0
    # every gold word scored, although windows of 24 sub-words split many sentences
    assert m["dev_words"] == gold_words(slice_root, "dev")
    assert m["test_words"] == gold_words(slice_root, "test")


def test_datasets_a_few_tags_and_artifacts(single_run, slice_root, tmp_path):
    client, run, _ = single_run
    tags = run.data.tags
    folder = slice_root / "ud" / "UD_Naija-Slice"
    inputs = {
        d.tags[0].value: (d.dataset.name, d.dataset.digest, json.loads(d.dataset.source))
        for d in run.inputs.dataset_inputs
    }
    files = run_info(client.tracking_uri, run.info.run_id)["data"]["files"]
    for split in ("train", "dev", "test"):
        path = next(folder.glob(f"*-ud-{split}.conllu"))
        name, digest, source = inputs[split]  # mlflow.log_input, context = the split
        assert name == f"UD_Naija-Slice/{split}" and digest == sha256_of(path)[:32]
        assert str(path) in json.dumps(source)
        assert files[split] == {"path": str(path), "sha256": sha256_of(path)}
    # the run page's tags: the record's few, MLflow's own (mlflow.*) aside; a finished run has
    # no liveness bookkeeping (its process, its heartbeat)
    assert {k for k in tags if not k.startswith("mlflow.")} == {
        "git.commit", "git.dirty", "device", "cpu", "freeze.frozen_blocks", "ablate.identity",
        "ablate.checkpoint_dir", "ablate.option_keys", "ablate.peak_rss",
    }  # fmt: skip
    assert tags["ablate.peak_rss"] == "job"  # its peak_rss_mb is its own, not its process's
    environment = run_info(client.tracking_uri, run.info.run_id)["environment"]
    assert tags["cpu"] == environment["cpu"] == cpu_model()  # the machine its times are from
    assert not [k for k, v in run.data.metrics.items() if v == 0 and k.startswith("dev_")]
    assert "system/cpu_utilization_percentage" in run.data.metrics  # MLflow's system metrics
    assert len(tags["git.commit"]) == 40 or not (project_root() / ".git").exists()
    assert tags["freeze.frozen_blocks"] == "[0, 2, 4]"
    assert "hydra.sweep_dir" not in tags
    rid = run.info.run_id
    store_dir = Path(client.tracking_uri.removeprefix("sqlite:///")).parent
    assert run.info.artifact_uri.startswith((store_dir / "mlartifacts").as_uri())
    top = {a.path for a in client.list_artifacts(rid)}
    assert {"config.yaml", ".hydra", "reports"} <= top
    assert {a.path for a in client.list_artifacts(rid, ".hydra")} >= {
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
    }
    report = json.loads(
        Path(
            client.download_artifacts(rid, "reports/test_classification_report.json", str(tmp_path))
        ).read_text()
    )
    assert set(UPOS) <= set(report)
    assert report["accuracy"] == pytest.approx(run.data.metrics["test_accuracy"])
    text = Path(
        client.download_artifacts(rid, "reports/dev_classification_report.txt", str(tmp_path))
    ).read_text()
    assert "PROPN" in text and "precision" in text


def test_a_multirun_is_one_parent_run_whose_children_are_its_jobs(slice_root, tmp_path):
    store = new_store(tmp_path)
    proc = run_cli(
        "--multirun", *slice_overrides(slice_root, store, tmp_path), "freeze=none,all,first2,alt",
        "tracking.experiment=grid", "trainer.epochs=1",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    client, runs = runs_of(store, "grid")
    assert len(runs) == 4
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert {r.info.run_name for r in runs} == {
        f"UD_Naija-Slice-{f}-tiny-s42 epochs=1" for f in ("none", "all", "first2", "alt")
    }
    assert sorted(r.data.tags["hydra.job_num"] for r in runs) == ["0", "1", "2", "3"]
    assert {r.data.tags["hydra.sweep_dir"] for r in runs} == {str(tmp_path / "sweep")}
    assert sorted(p.name for p in (tmp_path / "sweep").iterdir() if p.is_dir()) == [
        "0",
        "1",
        "2",
        "3",
    ]
    assert not runs_of(store, "Default")[1]  # nothing strayed into the default experiment
    # ablate's launcher, by default: on a CPU one job at a time in the sweep, with every CPU
    assert "n_jobs=auto: no GPU visible: one job at a time" in proc.stdout + proc.stderr
    assert workers.preloaded(tmp_path / "sweep") == []  # no worker started
    last_log = next((tmp_path / "sweep" / "3").glob("*.log")).read_text()
    assert "epoch 1/1" in last_log and "Sweep FINISHED" not in last_log  # the sweep's own lines
    environments = [run_info(store, r.info.run_id)["environment"] for r in runs]
    assert {(e["torch_threads"], e["jobs_at_once"]) for e in environments} == {(usable_cpus(), 1)}
    trainable = {r.data.params["freeze.name"]: r.data.metrics["trainable_params"] for r in runs}
    assert trainable["all"] < trainable["alt"] < trainable["first2"] < trainable["none"]
    # the sweep: one parent run, FINISHED, holding the report over its four children
    (parent,) = sweep_parents(store, "grid")
    assert parent.info.status == "FINISHED" and parent.data.tags["ablate.jobs"] == "4 FINISHED"
    assert {r.data.tags["mlflow.parentRunId"] for r in runs} == {parent.info.run_id}
    # what varies first: the UI's run-name column shows a name's start
    assert parent.info.run_name.startswith("sweep freeze=none,all,first2,alt data=ud ")
    held = {a.path for a in client.list_artifacts(parent.info.run_id, "report")}
    assert {"report/summary.md", "report/summary.csv", "report/accuracy.png"} <= held
    summary = client.download_artifacts(parent.info.run_id, "report/summary.csv", str(tmp_path))
    assert sorted(pd.read_csv(summary).strategy) == ["all", "alt", "first2", "none"]
    # the console: the summary table and the command for the full report
    assert "Sweep FINISHED: 4 FINISHED." in proc.stdout
    assert "| none |" in proc.stdout and "| all |" in proc.stdout
    assert f'make report ARGS="--sweep {tmp_path / "sweep"}"' in proc.stdout
    # the sweep's run page: the params its jobs share, the seeds' mean per strategy, the summary
    assert parent.data.params["trainer.epochs"] == "1" and "freeze.name" not in parent.data.params
    by_strategy = {r.data.params["freeze.name"]: r.data.metrics["dev_accuracy"] for r in runs}
    assert {k: v for k, v in parent.data.metrics.items() if k.startswith("dev_accuracy/")} == {
        f"dev_accuracy/{f}": pytest.approx(v) for f, v in by_strategy.items()
    }
    assert "| none |" in parent.data.tags["mlflow.note.content"]
    assert not {"ablate.process", "ablate.heartbeat"} & set(parent.data.tags)
    # the experiment opens on its runs in MLflow's UI, not on the GenAI overview
    kind = client.get_experiment_by_name("grid").tags["mlflow.experimentKind"]
    assert kind == "custom_model_development"

    # started again as after a preemption: every job FINISHED earlier, so the sweep is FINISHED
    # at once, its report over those runs
    again = run_cli(
        "--multirun", *slice_overrides(slice_root, store, tmp_path / "again"),
        "freeze=none,all,first2,alt", "tracking.experiment=grid", "trainer.epochs=1",
        "skip_finished=true", "trainer.resume=true",
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Sweep FINISHED: 4 FINISHED earlier (reused)." in again.stdout
    assert len(runs_of(store, "grid")[1]) == 4  # no new training run
    second = next(p for p in sweep_parents(store, "grid") if p.info.run_id != parent.info.run_id)
    assert second.info.status == "FINISHED"
    assert second.data.metrics["dev_accuracy/alt"] == pytest.approx(by_strategy["alt"])
    # its MLflow page links each run it reused: they are not its children
    note = second.data.tags["mlflow.note.content"]
    for r in runs:
        link = f"[{r.info.run_name}](#/experiments/{r.info.experiment_id}/runs/{r.info.run_id})"
        assert link in note.split("Reused, FINISHED earlier (skip_finished), not children: ")[1]


def test_a_sweep_that_recorded_no_run_leaves_none(store, capsys):
    from ablate import sweep

    client = MlflowClient(store)
    exp = client.create_experiment("grid")
    parent = client.create_run(exp).info.run_id  # its jobs failed before opening a run
    assert sweep.end_sweep(parent, store, "grid", "sweep", completed=False) == "DELETED"
    assert client.get_run(parent).info.lifecycle_stage == "deleted"
    assert "no run recorded" in capsys.readouterr().out


def test_a_sweep_whose_report_fails_still_closes_its_run(store, monkeypatch, capsys):
    from ablate import report, sweep

    client = MlflowClient(store)
    exp = client.create_experiment("grid")
    parent = client.create_run(exp).info.run_id
    child = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
    client.set_terminated(child, "FINISHED")

    def broken(*args, **kwargs):  # a bug in the report, not a bad input
        raise RuntimeError("the report broke")

    monkeypatch.setattr(report, "load_runs", broken)
    assert sweep.end_sweep(parent, store, "grid", "sweep", completed=True) == "FINISHED"
    run = client.get_run(parent)
    assert run.info.status == "FINISHED" and run.data.tags["ablate.jobs"] == "1 FINISHED"
    assert "RuntimeError('the report broke')" in run.data.tags["ablate.report"]
    assert "the sweep's report failed" in capsys.readouterr().err


def test_a_job_with_a_bad_setting_leaves_no_run_and_the_sweep_goes_on(slice_root, tmp_path):
    store = new_store(tmp_path)
    proc = run_cli(
        "--multirun", *slice_overrides(slice_root, store, tmp_path), "freeze.layers=[99],[1]",
        "trainer.epochs=1",
    )  # fmt: skip
    assert proc.returncode != 0  # the sweep reports the failure at the end
    _, runs = runs_of(store)
    # checked before its run opens: the bad job left nothing in the store
    assert {r.data.params["freeze.layers"]: r.info.status for r in runs} == {"[1]": "FINISHED"}
    errors = [line for line in proc.stdout.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "block(s) [99] do not exist" in errors[0]


def test_a_jobs_peak_memory_starts_from_what_its_process_holds_then():
    from ablate.training.resources import peak_rss_mb, reset_peak_rss

    block = b"\x01" * (400 * 2**20)  # an earlier job's peak: 400 MiB written, then freed
    high = peak_rss_mb()
    del block
    assert reset_peak_rss() == "job"
    assert peak_rss_mb() < high - 300


def test_make_run_config_trains_the_packaged_minilm(tmp_path):
    """`make run`'s job (experiment=smoke): real MiniLM, real Naija, beats the majority tag."""
    store = new_store(tmp_path)
    proc = run_cli("experiment=smoke", f"tracking.uri={store}", f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = runs_of(store)[1]
    assert run.info.status == "FINISHED" and run.info.run_name == "naija-none-minilm-s42 smoke"
    assert run.data.metrics["train_sentences"] == 300
    dev = read_conllu(Path(run_info(store, run.info.run_id)["data"]["files"]["dev"]["path"]))
    tags = [t for s in dev for t in s.labels]
    majority = max(tags.count(t) for t in set(tags)) / len(tags)
    assert run.data.metrics["dev_words"] == len(tags)
    assert run.data.metrics["dev_accuracy"] > majority
