"""experiment=fair: each strategy of lr_study.freeze trains at the lr its own study picked."""

from __future__ import annotations

import pytest
from helpers.runs import compose_cfg, run_cli, slice_overrides
from helpers.store import logged_runs
from mlflow import MlflowClient
from omegaconf import OmegaConf

from ablate import config, docs, report
from ablate.config import RECIPE_LR_TAG, TUNED_TAG
from ablate.lrstudy import EDGE_TAG, interior
from ablate.lrstudy import cli as study_cli
from ablate.tracking.params import OPTION_KEYS_TAG, option_keys


def test_a_report_reads_each_strategys_own_keys_as_its_runs_recorded_them():
    # recorded when the run ran (features: only its head, whatever conf/ says today)
    assert report.summary.own_keys("features", "model.head") == {"model.head"}
    assert report.summary.own_keys("none", "") == set()
    # lora recorded none, so today's conf/ says: its option file sets its own default lr
    assert report.summary.own_keys("lora", None) == {"trainer.lr"}
    assert report.summary.own_keys("features", None) == {"model.head", "trainer.cache_frozen"}


def test_the_fair_preset_composes_the_naija_grid_and_its_studies():
    cfg = compose_cfg("experiment=fair")
    assert cfg.data.name == "naija" and cfg.skip_finished and cfg.tracking.experiment == "fair"
    zoo = ["ia3", "dora", "loha", "lokr", "adalora", "vera", "ln_tuning"]
    every = ["none", "features", "head_only", "bitfit", "lora", *zoo]
    assert list(cfg.lr_study.freeze) == every  # full fine-tuning tuned alike
    sweep = config.compose("experiment=fair", hydra=True).hydra.sweeper.params
    assert sweep.freeze.split(",") == every and sweep.seed == "1,2,3,4,5"
    assert cfg.lr_study.experiment == "fair-lr"
    features = compose_cfg("experiment=fair", "freeze=features")
    assert features.model.head == "bilstm" and features.freeze.all and features.freeze.embeddings
    assert features.trainer.cache_frozen  # from head_only, the option features builds on
    # what an option changes beyond freeze.* is its own, not a setting that splits the comparison
    assert option_keys("features") == {"model.head", "trainer.cache_frozen"}
    assert option_keys("head_only") == {"trainer.cache_frozen"}
    assert option_keys("lora") == {"trainer.lr"}  # its method's default lr
    assert option_keys("gone") == set()

    options, overrides = study_cli.for_studies(["experiment=fair"])
    assert options == every
    assert overrides == ["experiment=fair", "lr_study.freeze=[]", "tracking.experiment=fair-lr"]
    trial = study_cli.compose_trial("lora", overrides)
    assert list(trial.lr_study.range) == [1e-5, 1e-2] and trial.lr_study.trials == 6
    assert list(study_cli.compose_trial("lora", []).lr_study.range) == [1e-5, 1e-3]  # the default
    assert trial.tracking.tags.study == "lr-naija-minilm-lora" and not trial.trainer.keep_model
    assert study_cli.for_studies(["freeze=bitfit"]) == (["bitfit"], ["lr_study.freeze=[]"])
    assert study_cli.for_studies(["experiment=fair", "lr_study.freeze=[lora]"])[0] == ["lora"]
    # on EWT: fair's protocol (range, lr studies' and runs' experiments), its own strategies
    ewt = compose_cfg("experiment=fair_ewt")
    assert ewt.data.name == "ewt" and ewt.tracking.experiment == "fair" and ewt.skip_finished
    ewt_every = ["none", "features", "bitfit", "lora", "loha", "dora"]
    assert list(ewt.lr_study.freeze) == ewt_every
    sweep = config.compose("experiment=fair_ewt", hydra=True).hydra.sweeper.params
    assert sweep.freeze.split(",") == ewt_every and sweep.seed == "1,2,3"
    assert (ewt.lr_study.experiment, list(ewt.lr_study.range)) == ("fair-lr", [1e-5, 1e-2])
    options, overrides = study_cli.for_studies(["experiment=fair_ewt"])
    assert options == list(ewt.lr_study.freeze)
    trial = study_cli.compose_trial("loha", overrides)
    assert trial.tracking.tags.study == "lr-ewt-minilm-loha" and trial.data.name == "ewt"


@pytest.mark.heavy
def test_a_fair_sweep_names_every_strategy_without_a_study_before_any_job(
    slice_root, store, tmp_path, capsys
):
    overrides = [
        *slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1",
        "data.max_train_sentences=48",
    ]  # fmt: skip
    given = " ".join(o for o in overrides if not o.startswith("hydra."))  # Hydra's own aside

    def refused(*grid: str) -> str:
        proc = run_cli("--multirun", "experiment=fair", *grid, "seed=1,2", *overrides)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "Launching jobs" not in proc.stderr
        (line,) = proc.stderr.splitlines()  # one error, every job's
        assert not logged_runs(store, "fair", sweeps=True)  # nothing tracked, nothing trained
        assert not (tmp_path / "sweep" / "multirun.yaml").exists()  # no job folder either
        return line

    line = refused("freeze=features,ia3")
    assert line.startswith("ablate: error: freeze=features, ia3: these strategies train at ")
    assert line.endswith(
        f"Run the studies first, then this sweep again: python -m ablate.lrstudy "
        f"experiment=fair {given} freeze=features,ia3"
    )
    # with one study done, the sweep names only the strategy whose study is missing
    assert study_cli.main([*overrides, "experiment=fair", "freeze=features", "lr_study.trials=1",
                           "lr_study.widen=0"]) == 0  # fmt: skip
    capsys.readouterr()
    line = refused("freeze=features,bitfit")
    assert "error: freeze=bitfit: these strategies" in line
    assert line.endswith(f"python -m ablate.lrstudy experiment=fair {given} freeze=bitfit")


@pytest.mark.heavy
def test_tuned_strategies_train_at_their_studys_best_lr(slice_root, store, tmp_path, capsys):
    overrides = [
        *slice_overrides(slice_root, store, tmp_path), "trainer.epochs=1",
        "data.max_train_sentences=48",
    ]  # fmt: skip
    # No study yet: one error naming the command, and no run.
    proc = run_cli("experiment=fair", "freeze=features", "seed=1", *overrides)
    assert proc.returncode == 2, proc.stderr[-2000:]
    given = " ".join(o for o in overrides if not o.startswith("hydra."))  # Hydra's own aside
    said = proc.stdout + proc.stderr
    assert f"first: python -m ablate.lrstudy experiment=fair {given} freeze=features" in said
    assert not logged_runs(store, "fair")

    # The study: trials in fair-lr at the lrs the sampler proposes, within lr_study.range.
    search_args = [
        *overrides, "experiment=fair", "freeze=features", "lr_study.trials=1",
        "lr_study.range=[2e-3,1e-2]", "lr_study.widen=0",
    ]  # fmt: skip
    assert study_cli.main(search_args) == 0
    capsys.readouterr()
    trials = logged_runs(store, "fair-lr")
    assert len(trials) == 1 and {r.info.status for r in trials} == {"FINISHED"}
    best = max(trials, key=lambda r: r.data.metrics["best_dev_accuracy"])
    assert all(2e-3 <= float(r.data.params["trainer.lr"]) <= 1e-2 for r in trials)
    # a peft method, whose option sets its own default lr (the lr its study replaces)
    assert study_cli.main([*search_args, "freeze=ia3"]) == 0
    capsys.readouterr()

    # none untuned here (its study left out), to show a strategy at the recipe's lr beside them
    grid = [
        "--multirun", "experiment=fair", "freeze=none,features,ia3", "seed=1",
        "lr_study.freeze=[features,ia3]", *overrides,
    ]  # fmt: skip
    proc = run_cli(*grid)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = {r.data.params["freeze.name"]: r for r in logged_runs(store, "fair")}
    assert sorted(runs) == ["features", "ia3", "none"]
    features, none = runs["features"], runs["none"]
    assert features.data.params["trainer.lr"] == best.data.params["trainer.lr"]
    assert features.data.tags[TUNED_TAG] == best.info.run_id
    assert features.data.tags[RECIPE_LR_TAG] == "5e-05"
    assert none.data.params["trainer.lr"] == "5e-05" and TUNED_TAG not in none.data.tags
    assert features.data.tags[OPTION_KEYS_TAG] == "model.head,trainer.cache_frozen"
    assert none.data.tags[OPTION_KEYS_TAG] == ""
    # The job folder says what ran (the grid's jobs: sweep/<n>; the trials': sweep/features/<n>).
    saved = {
        (c := OmegaConf.load(p)).freeze.name: c
        for p in (tmp_path / "sweep").glob("*/.hydra/config.yaml")
    }
    assert saved["features"].trainer.lr == float(best.data.params["trainer.lr"])

    # A rerun finds both finished, the tuned one at its tuned lr.
    proc = run_cli(*grid)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0 and said.count("skip_finished: identical") == 3, said[-3000:]
    assert len(logged_runs(store, "fair")) == 3

    # One comparison: the head and the tuned lrs are the strategies' own, not other settings,
    # also where the lr a study replaced was a peft method's own default (ia3's 3e-3).
    assert runs["ia3"].data.tags[RECIPE_LR_TAG] == "0.003"
    rep = report.make_report("fair", store)
    assert rep.summary.panel.nunique() == 1
    assert not [n for n in rep.notes if "different settings" in n]
    rows = rep.summary.set_index("strategy")
    row = rows.loc["features"]
    assert row.lr == float(best.data.params["trainer.lr"]) and row.lr_from == "its lr study"
    assert rows.loc["none"].lr_from == "the recipe"
    # a pick in its searched range's outer tenths is tagged on the run and flagged in the report
    shown = report.table(rep).set_index("strategy").lr
    for option in ("features", "ia3"):
        run, lr = runs[option], float(runs[option].data.params["trainer.lr"])
        edge = not interior(lr, [2e-3, 1e-2])
        assert (EDGE_TAG in run.data.tags) == edge and rows.loc[option].lr_interior == (not edge)
        assert ("at its range's edge" in shown[option]) == edge
    assert rows.loc["ia3"].lr_from == "its lr study" and rows.loc["ia3"].delta_method != (
        "no baseline run"
    )
    # Its train time counts the frozen features' one-off computation.
    feat = rep.runs.set_index("freeze").loc["features"]
    epochs = MlflowClient(store).get_metric_history(feat.run_id, "epoch_time_s")
    assert feat.cache_frozen_time_s > 0
    assert feat.train_time_s == pytest.approx(
        sum(m.value for m in epochs) + feat.cache_frozen_time_s
    )

    # The published table's rerun command reruns a row's first seed at its lr, without its study,
    # into an experiment of its own: the same scores to the last digit.
    (pub := tmp_path / "naija-fair").mkdir()  # the study run as experiment=fair
    rep.summary.to_csv(pub / "summary.csv", index=False)
    table = docs.results.results_table(str(pub), rerun=True).splitlines()
    (features_row,) = [line for line in table if line.startswith("| `features` |")]
    lr = best.data.params["trainer.lr"]
    command = (
        "python -m ablate.train experiment=fair freeze=features seed=1 "
        f"trainer.lr={lr} 'lr_study.freeze=[]' tracking.experiment=rerun"
    )
    assert features_row.endswith(f"| `{command}` |") and "(tuned)" in features_row
    (none_row,) = [line for line in table if line.startswith("| `none` |")]
    assert "freeze=none seed=1 trainer.lr=5e-05 'lr_study.freeze=[]'" in none_row
    args = [a.strip("'") for a in command.split()[3:]]  # as the shell passes them
    proc = run_cli(*args, *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (again,) = logged_runs(store, "rerun")
    for metric in ("dev_accuracy", "test_accuracy"):
        assert again.data.metrics[metric] == features.data.metrics[metric]
    assert again.data.params["trainer.lr"] == lr
