"""Learning-rate studies (``ablate.lrstudy``): one freeze option's Optuna trials, tagged
``study=<name>``, read from the store: a study's best trial (a pruned trial, KILLED and tagged
``ablate.pruned``, is none), the lr a run of that option trains at (``lr_study.freeze``), and the
command that runs the study. Used by ``ablate.train``, the study's command (``ablate.lrstudy.cli``)
and the report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from ablate import tasks
from ablate.errors import AblateError
from ablate.lrstudy import PRUNED_EPOCH_TAG, interior, pruned, searched, trained_out
from ablate.tracking.params import flatten, primary_metric, settings

if TYPE_CHECKING:
    from ablate.config import FreezeConfig, TrainCore


@dataclass(frozen=True)
class Study:
    """Where one option's study keeps its trials."""

    freeze: str
    name: str
    uri: str
    experiment: str
    metric: str  # the objective, as logged: best_dev_<primary metric>


@dataclass(frozen=True)
class Best:
    """The best trial of a study."""

    study: Study
    trials: int  # finished trials compared: those with the latest trial's settings
    lr: float | None
    value: float | None
    run_id: str | None
    other_settings: int = 0  # finished trials of the same name run with other settings
    pruned: int = 0  # trials with those settings that the study pruned (not candidates)
    epochs_saved: int = 0  # the epochs those would have trained on
    span: list[float] | None = None  # the range those trials searched (``searched``)

    @property
    def interior(self) -> bool | None:
        """Whether the best lr lies inside the searched range's outer tenths; None if unknown."""
        return interior(self.lr, self.span) if self.lr and self.span else None


def _runs(study: Study, filter_string: str):
    client = MlflowClient(tracking_uri=study.uri)
    exp = client.get_experiment_by_name(study.experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50000)


def _recipe(run) -> dict[str, str]:
    return lr_aside(run.data.params)


def lr_aside(params: dict[str, str]) -> dict[str, str]:
    """A trial's settings but its lr: trials of one study share them."""
    return {k: v for k, v in settings(params).items() if k != "trainer.lr"}


def best(study: Study) -> Best:
    """The finished trial of ``study`` with the highest objective, and how many finished.

    The study's name says only data, model and freeze option; trials run with other settings
    (an earlier search with other epochs, say) are left out, as the latest trial's settings
    decide, the way the report treats seeds.
    """
    name = study.name.replace("'", "\\'")
    runs = _runs(study, f"tags.study = '{name}' and attributes.status != 'RUNNING'")
    cut = [r for r in runs if pruned(r.data.tags)]
    scored = sorted(
        (
            r
            for r in runs
            if trained_out(r.info.status, r.data.tags) and study.metric in r.data.metrics
        ),
        key=lambda r: r.info.start_time,
    )
    if not scored:
        return Best(study, 0, None, None, None, pruned=len(cut))
    latest = _recipe(scored[-1])
    same = [r for r in scored if _recipe(r) == latest]
    cut = [r for r in cut if _recipe(r) == latest]
    saved = sum(
        int(r.data.params.get("trainer.epochs", 0)) - int(r.data.tags[PRUNED_EPOCH_TAG])
        for r in cut
    )
    span = searched(r.data.tags for r in [*same, *cut])
    return _top(study, same, len(scored) - len(same), len(cut), saved, span)


def _top(
    study: Study,
    same: list,
    other_settings: int = 0,
    pruned: int = 0,
    saved: int = 0,
    span: list[float] | None = None,
) -> Best:
    """The best of ``study``'s finished trials ``same`` (those run with equal settings); of
    trials that tie, the earliest, as Optuna's ``best_trial`` (which decides the widening) picks,
    whatever order ``same`` comes in."""
    top = max(same, key=lambda r: (r.data.metrics[study.metric], -r.info.start_time))
    lr, value = float(top.data.params["trainer.lr"]), top.data.metrics[study.metric]
    return Best(study, len(same), lr, value, top.info.run_id, other_settings, pruned, saved, span)


def all_studies(template: Study) -> list[Study]:
    """Every study with trials in ``template``'s experiment, by name, each with the objective its
    trials logged (``best_dev_<their task's primary metric>``)."""
    found: dict[str, Study] = {}
    for r in _runs(template, "tags.study != ''"):
        name = r.data.tags.get("study")
        metric = primary_metric(r.data.metrics, default="")
        if r.data.tags.get("ablate.role") == "sweep":  # the study's parent run: no trial
            continue
        if name and (name not in found or metric):
            freeze = r.data.params.get("freeze.name", r.data.params.get("freeze", "?"))
            found[name] = Study(
                freeze,
                name,
                template.uri,
                template.experiment,
                f"best_dev_{metric or 'accuracy'}",
            )
    return [found[n] for n in sorted(found)]


def tuned_lr(cfg: TrainCore, command: str) -> Best:
    """The best finished trial of the lr study of ``cfg``'s strategy (``lr_study.experiment``):
    the trial with the highest ``best_dev_<primary metric>`` among those run with ``cfg``'s
    settings, lr and seed aside. When there is none, an ``AblateError`` that names ``command``
    (the study to run first)."""
    experiment = cfg.lr_study.experiment or cfg.tracking.experiment
    metric = f"best_dev_{tasks.get(cfg.data.task).primary_metric}"
    study = Study(cfg.freeze.name, "", cfg.tracking.uri, experiment, metric)
    name = cfg.freeze.name.replace("'", "\\'")
    try:
        found = _runs(study, f"tags.study != '' and params.`freeze.name` = '{name}'")
    except MlflowException as exc:
        raise AblateError(
            f"{cfg.tracking.uri}: the lr study's store is not readable: {exc}"
        ) from exc
    trials = [
        r for r in found if trained_out(r.info.status, r.data.tags) and metric in r.data.metrics
    ]
    wanted = lr_aside(
        {k: str(v) for k, v in flatten(OmegaConf.to_container(cfg, resolve=True)).items()}
    )
    same = [r for r in trials if _recipe(r) == wanted]
    if not same:
        near = ""
        if trials:
            other = _recipe(max(trials, key=lambda r: r.info.start_time))
            keys = sorted(k for k in wanted.keys() | other.keys() if wanted.get(k) != other.get(k))
            near = f" ({len(trials)} finished trials have other settings: {', '.join(keys[:5])})"
        raise AblateError(
            f"freeze={cfg.freeze.name} trains at the lr its own study picks (lr_study.freeze), "
            f"but experiment {experiment!r} in {cfg.tracking.uri} holds no finished trial of it "
            f"with these settings{near}; run the study first: {command}"
        )
    name = same[0].data.tags["study"]  # equal settings: one study's trials
    span = searched(r.data.tags for r in same)
    return _top(Study(cfg.freeze.name, name, cfg.tracking.uri, experiment, metric), same, span=span)


def study_command(freeze: FreezeConfig) -> str:
    """The ``python -m ablate.lrstudy`` command that runs the study of this job's strategy
    (``freeze``): its overrides, the seed aside (the study's trials run at the default seed)."""
    given = list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
    keep = [o for o in given if not o.startswith(("seed=", "freeze="))]
    return " ".join(["python -m ablate.lrstudy", *keep, f"freeze={freeze.name}"])
