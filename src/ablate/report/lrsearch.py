"""The learning-rate search's table: per study (one freeze option's Optuna trials, tagged
``study=<name>``), the best trial's lr and objective, read from the store."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ablate.report.load import MlflowClient, primary_metric
from ablate.report.summary import settings


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


def _runs(study: Study, filter_string: str):
    client = MlflowClient(tracking_uri=study.uri)
    exp = client.get_experiment_by_name(study.experiment)
    if exp is None:
        return []
    return client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=50000)


def _recipe(run) -> dict[str, str]:
    return {k: v for k, v in settings(run.data.params).items() if k != "trainer.lr"}


def best(study: Study) -> Best:
    """The finished trial of ``study`` with the highest objective, and how many finished.

    The study's name says only data, model and freeze option; trials run with other settings
    (an earlier search with other epochs, say) are left out, as the latest trial's settings
    decide, the way the report treats seeds.
    """
    name = study.name.replace("'", "\\'")
    runs = _runs(study, f"tags.study = '{name}' and attributes.status = 'FINISHED'")
    scored = sorted(
        (r for r in runs if study.metric in r.data.metrics), key=lambda r: r.info.start_time
    )
    if not scored:
        return Best(study, 0, None, None, None)
    latest = _recipe(scored[-1])
    same = [r for r in scored if _recipe(r) == latest]
    top = max(same, key=lambda r: r.data.metrics[study.metric])
    return Best(
        study,
        len(same),
        float(top.data.params["trainer.lr"]),
        top.data.metrics[study.metric],
        top.info.run_id,
        len(scored) - len(same),
    )


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
                freeze, name, template.uri, template.experiment,
                f"best_dev_{metric or 'accuracy'}",
            )  # fmt: skip
    return [found[n] for n in sorted(found)]


def table(rows: Sequence[Best]) -> str:
    """The best lr per option as a markdown table."""
    lines = [
        "| freeze | study | trials | best lr | objective | best value | run |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in rows:
        lr = f"{b.lr:.3g}" if b.lr is not None else "-"
        value = f"{b.value:.4f}" if b.value is not None else "-"
        run = b.run_id or "-"
        trials = f"{b.trials}" + (
            f" (+{b.other_settings} with other settings, not compared)" if b.other_settings else ""
        )
        lines.append(
            f"| {b.study.freeze} | {b.study.name} | {trials} | {lr} | {b.study.metric} | {value} "
            f"| {run} |"
        )
    return "\n".join(lines)
