"""The README's and docs/'s computed blocks are current, and the README stays a README."""

from __future__ import annotations

import re

import pytest

from ablate import docs
from ablate.config import project_root
from ablate.report.render import millions, share


@pytest.mark.parametrize("name", docs.FILES)
def test_generated_blocks_are_current(name):
    text = (project_root() / name).read_text(encoding="utf-8")
    assert "<!--" in text and ":start -->" in text
    assert docs.render(text) == text, f"{name} is stale: run `python -m ablate.docs`"


def test_the_readme_shows_the_two_commands_and_the_strategies_and_stays_short():
    readme = project_root() / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert readme.stat().st_size <= 12 * 1024
    assert "make run" in text and "make test" in text
    table = text.split("<!-- freeze-table:start -->")[1].split("<!-- freeze-table:end -->")[0]
    assert "| `freeze=all` |" in table and "| `freeze=none` |" in table
    for link in re.findall(r"\]\((docs/[^)#]+)", text):  # every linked doc exists
        assert (project_root() / link).is_file(), link


def test_the_config_reference_lists_every_key_and_switch():
    from ablate import config, switches

    text = (project_root() / "docs" / "config.md").read_text(encoding="utf-8")
    for dotted, _ in config.schema_keys():
        assert f"| `{dotted}` |" in text, dotted
    speed = (project_root() / "docs" / "speed.md").read_text(encoding="utf-8")
    for switch in switches.SWITCHES:
        assert f"| `{switch.key}` |" in speed, switch.key


def test_every_makefile_target_is_documented():
    listed = docs.make_help()
    for target in ("help", "setup", "run", "test", "lint", "sweep", "ui", "clean"):
        assert f"`make {target}`" in listed


def test_a_block_names_the_study_it_reads():
    plain = "<!-- results-table:start -->\n<!-- results-table:end -->\n"
    name = f"results-table {docs.studies.RESULTS}"
    named = f"<!-- {name}:start -->\nstale\n<!-- {name}:end -->\n"
    assert docs.render(named).splitlines()[1:-1] == docs.render(plain).splitlines()[1:-1]
    missing = docs.render(
        "<!-- results-findings nowhere:start -->\n<!-- results-findings nowhere:end -->\n"
    )
    assert "`docs/results/nowhere/summary.csv` is missing" in missing


def test_savings_never_round_a_partial_saving_to_all_or_nothing():
    assert [share(x, 0) for x in (99.97, 0.3, 12.4, 100, 0, -3.2)] == [
        "99.97", "0.3", "12", "100", "0", "-3",
    ]  # fmt: skip
    assert [share(x) for x in (99.97, 99.9, 63.04)] == ["99.97", "99.9", "63.0"]
    assert millions(0.00654) == "0.00654" and millions(22.571) == "22.57"


def test_each_published_run_rerun_so_far_gives_its_published_scores():
    found = [p.name for p in (project_root() / "docs" / "results").iterdir()
             if docs.redo.redone(p.name)]  # fmt: skip
    assert "naija-fair" in found
    for study in found:
        rows = docs.redo.reruns(study)
        assert rows, study
        # the published recipe again: the same numbers; another lr (a redone study): the page
        # says so, each strategy once; a strategy the published study lacked: new
        same = [r for r in rows if r["lr"] == r["published_lr"]]
        assert [r for r in same if not r["same"]] == [], study
        assert all(r["trainable_params"] > 0 for r in rows), study  # its cost beside its score
        said = docs.results.results_source(study)
        for freeze in {r["freeze"] for r in rows} - {r["freeze"] for r in same}:
            mine = [r for r in rows if r["freeze"] == freeze]
            new = mine[0]["published_lr"] is None
            was = "new" if new else f"{mine[0]['published_lr']:.3g}"
            assert said.count(f"| `{freeze}` | {mine[0]['lr']:.3g} | {was} |") == 1, study
            if not new:  # by how much its dev accuracy changed, over the seeds both have
                change = sum(r["dev"] - r["published_dev"] for r in mine) / len(mine)
                row = next(x for x in said.splitlines() if x.startswith(f"| `{freeze}` |"))
                assert abs(float(row.split(" | ")[6]) - 100 * change) <= 0.005 + 1e-9, row
        # one lr per strategy: a strategy redone at a new lr counts only its latest runs
        for freeze in {r["freeze"] for r in rows}:
            assert len({r["lr"] for r in rows if r["freeze"] == freeze}) == 1, (study, freeze)
        # what remains: the redo's experiment's strategies the archive does not hold yet
        if study in docs.studies.EXPERIMENT:
            left = docs.studies.still_to_run(study, {r["freeze"] for r in rows})
            assert not {r["freeze"] for r in rows} & set(left) and "none" in left + [
                r["freeze"] for r in rows]  # fmt: skip
            assert (f"Still to run: {', '.join(f'`{s}`' for s in left)}." in said) == bool(left)


def test_a_rerun_that_differs_from_its_published_row_is_named(tmp_path):
    import shutil

    study = tmp_path / "naija"
    source = project_root() / "docs" / "results" / "naija"
    # the Naija grid's archive, as if only part of it had been rerun yet
    shutil.copytree(source / docs.studies.ARCHIVE, study / docs.studies.PARTIAL)
    lines = (source / "runs.csv").read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    col, fz, sd = header.index("dev"), header.index("freeze"), header.index("seed")
    for i, line in enumerate(lines[1:], 1):
        cells = line.split(",")
        if (cells[fz], cells[sd]) == ("none", "1"):
            cells[col] = "0.5"
            lines[i] = ",".join(cells)
    (study / "runs.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    said = docs.results.results_source(str(study))
    assert "these differ from their published scores: none s1: dev 0.979" in said
    assert "(published 0.5)" in said and "first2 s1" not in said.split("differ")[1]


def test_a_redo_is_reported_against_its_published_report_so_far_and_once_complete(tmp_path):
    import shutil

    source = project_root() / "docs" / "results" / "naija-fair"
    archive, published = docs.redo.redone("naija-fair")
    assert (archive, published) == (source / docs.studies.ARCHIVE, source / docs.studies.PUBLISHED)
    said = docs.results.results_source("naija-fair")  # complete: its archive, its published/
    assert said.startswith("Generated from the archive beside this page")
    assert "kept in [naija-fair/published/](naija-fair/published/)" in said
    assert "So far" not in said and "From today's code, each strategy" in said
    assert "Still to run" not in said  # every strategy its experiment's sweep lists
    # the same runs as a partial archive beside the published report: so far, what remains
    study = tmp_path / "naija-fair"
    assert docs.redo.redone(str(study)) is None  # nothing there: not redone
    shutil.copytree(archive, study / docs.studies.ARCHIVE)
    assert docs.redo.redone(str(study)) is None  # an archive alone: a study, not a redo
    shutil.move(study / docs.studies.ARCHIVE, study / docs.studies.PARTIAL)
    for name in ("summary.csv", "runs.csv"):
        shutil.copy(published / name, study / name)
    assert docs.redo.redone(str(study)) == (study / docs.studies.PARTIAL, study)
    assert docs.redo.reruns(str(study)) == docs.redo.reruns("naija-fair")
    so_far = docs.results.results_source(str(study))
    assert so_far.startswith("**From runs no longer held.**")
    assert "Rerun from today's code so far: 3 of its 15 published runs (none s1" in so_far
    assert said.split("did not have):")[1].strip() == so_far.split("did not have):")[1].strip()


def test_a_new_study_says_what_it_still_lacks_until_its_archive_holds_every_strategy(tmp_path):
    import shutil

    from omegaconf import OmegaConf

    # the EWT fair study: its experiment's sweep, read from its config
    conf = OmegaConf.load(project_root() / "conf" / "experiment" / "fair_ewt.yaml")
    wanted = str(conf.hydra.sweeper.params.freeze).split(",")
    assert wanted[0] == "none" and "features" in wanted
    study = tmp_path / "ewt-fair"
    said = docs.results.results_source(str(study))
    assert said == f"**Not run yet.** Still to run: {', '.join(f'`{s}`' for s in wanted)}."
    # an archive of some of them beside the page (no published report: a study, not a redo)
    source = project_root() / "docs" / "results" / "naija"
    shutil.copytree(source / docs.studies.ARCHIVE, study / docs.studies.ARCHIVE)
    held = docs.studies.held_strategies(study)
    assert held == {"none", "first2", "first4", "alt", "all"}
    said = docs.results.results_source(str(study))
    assert said.startswith("Generated from the archive beside this page")
    left = ", ".join(f"`{s}`" for s in wanted if s not in held)
    assert said.endswith(f"Still to run: {left}.") and "`none`" not in said.split("Still")[1]
    # a study of the paper grid lists nothing to run: its experiment's sweep is not its own
    assert docs.studies.still_to_run(str(tmp_path / "naija"), set()) == []


def test_the_lr_studies_table_counts_each_archived_studys_trials_and_its_best():
    from ablate.archive import read

    for study in ("naija-fair",):
        archive, _ = docs.redo.redone(study)
        held = read(archive)
        trials = {e["run_id"] for e in held.index["runs"] if e["role"] == "trial"}
        runs = [r for r in held.runs if r.run_id in trials]
        table = docs.lrstudies.lr_studies(study)
        if archive.name == docs.studies.ARCHIVE:  # complete: every tuned lr inside its range
            assert "**no**" not in table and "not yet" not in table, table
        for option in {r.params["freeze.name"] for r in runs}:
            mine = [r for r in runs if r.params["freeze.name"] == option]
            cut = sum(r.tags.get("ablate.pruned") == "true" for r in mine)
            # the trials that ended (a try a kill cut short, KILLED and not pruned, ran again)
            ended = cut + sum(r.info["status"] == "FINISHED" for r in mine)
            row = next(line for line in table.splitlines() if line.startswith(f"| `{option}` |"))
            assert row.startswith(f"| `{option}` | {ended} | {cut} | "), row
            finished = sorted(  # of equal scores, the earliest trial's
                (r for r in mine if r.info["status"] == "FINISHED"),
                key=lambda r: r.info["start_time"],
            )
            top = max(
                finished,
                key=lambda r: max(v for k, *_, v in r.metrics if k.startswith("best_dev_")),
            )
            assert f"| {float(top.params['trainer.lr']):.3g} |" in row, row


def _added(archive, like: str, run_id: str, role: str = "run", **changed) -> None:
    """A run added to ``archive`` as an export writes it: a copy of the run named ``like``
    (its role's first), started after every other, with ``changed`` info, params, tags and
    last metric values, and the manifest written again."""
    import json
    import shutil

    from ablate.archive import INDEX, METRICS, dumps, stored_name
    from ablate.archive.export import write_manifest
    from ablate.fileio import read_gzip, write_gzip

    index = json.loads((archive / INDEX).read_text(encoding="utf-8"))
    entry = next(e for e in index["runs"] if e["role"] == role and like in e["run_name"])
    shutil.copytree(archive / "runs" / entry["run_id"], folder := archive / "runs" / run_id)
    starts = [
        json.loads((p / "info.json").read_text())["start_time"] for p in folder.parent.iterdir()
    ]
    edits = {"info.json": {"run_id": run_id, "start_time": max(starts) + 1000}}
    edits["info.json"].update(changed.pop("info", {}))
    edits["params.json"], edits["tags.json"] = changed.pop("params", {}), changed.pop("tags", {})
    for name, update in edits.items():
        held = json.loads((folder / name).read_text(encoding="utf-8"))
        (folder / name).write_text(dumps({**held, **update}), encoding="utf-8")
    metrics = folder / stored_name(METRICS, index["version"])  # gzip-compressed from version 2
    lines = read_gzip(metrics).decode() if metrics.suffix == ".gz" else metrics.read_text("utf-8")
    lines = ["\t".join([*(cells := line.split("\t"))[:3], str(changed.get(cells[0], cells[3]))])
             for line in lines.splitlines()]  # fmt: skip
    text = "\n".join(lines) + "\n"
    if metrics.suffix == ".gz":
        write_gzip(metrics, text.encode())
    else:
        metrics.write_text(text, encoding="utf-8")
    index["runs"].append({**entry, "run_id": run_id})
    (archive / INDEX).write_text(dumps(index), encoding="utf-8")
    (archive / "SHA256SUMS").unlink()
    write_manifest(archive)


def test_the_redone_table_takes_a_seeds_latest_finished_run_and_a_studys_latest_trials(tmp_path):
    import shutil

    study = tmp_path / "naija-fair"
    source = project_root() / "docs" / "results" / "naija-fair"
    shutil.copytree(source / docs.studies.ARCHIVE, archive := study / docs.studies.PARTIAL)
    shutil.copy(source / docs.studies.PUBLISHED / "runs.csv", study / "runs.csv")
    before = {r["run"]: r for r in docs.redo.reruns(str(study))}
    # head_only seed 1 again (skip_finished=false: the same settings), then a FAILED run at
    # another lr; a features study before this one, with other settings, its one trial the best
    _added(archive, "head_only-minilm-s1", "f" * 32, test_accuracy=0.5, dev_accuracy=0.5)
    _added(archive, "head_only-minilm-s2", "a" * 32, info={"status": "FAILED"},
           params={"trainer.lr": "0.05"})  # fmt: skip
    _added(archive, "features", "e" * 32, role="trial", best_dev_accuracy=0.999, info={
           "start_time": 1}, params={"trainer.epochs": "3", "trainer.lr": "0.0099"})  # fmt: skip
    rows = [r for r in docs.redo.reruns(str(study)) if r["freeze"] == "head_only"]
    assert sorted(r["seed"] for r in rows) == ["1", "2", "3"]  # the rerun supersedes seed 1
    assert {r["seed"]: r["dev"] for r in rows}["1"] == 0.5
    assert len(rows) == len([r for r in before.values() if r["freeze"] == "head_only"])
    table = docs.lrstudies.lr_studies(str(study))
    (features,) = [line for line in table.splitlines() if line.startswith("| `features` |")]
    assert "0.0099" not in features  # not this study's trial: other settings
    (head_only,) = [line for line in table.splitlines() if line.startswith("| `head_only` |")]
    assert head_only.endswith("| 0.00813 |")  # the FAILED run's lr is not what its runs trained at


def _each_strategys(findings: list[str]) -> list[str]:
    """The findings' line of each strategy against the baseline (the baseline's own first)."""
    lines = [f for f in findings[1:] if f.startswith("- `")]
    assert lines
    return lines


def test_the_best_finding_names_the_cheapest_strategy_within_half_a_point(tmp_path):
    import pandas as pd

    from ablate.report.timing import LOADED

    source = project_root() / "docs" / "results" / "naija-fair" / "summary.csv"
    table = pd.read_csv(source)
    close = table[(table.delta_dev_pt > -0.5) & table.time_savings_pct.notna()]
    best = close.loc[close.time_savings_pct.idxmax()]
    said = docs.results.results_best(str(source.parent))
    assert said.startswith(f"Within half a point of full fine-tuning, `{best.strategy}`")
    assert f"({best.time_savings_pct:.0f} %)" in said and "beside other work" not in said
    # an interval that reaches past half a point is said; one within it is not
    reaches = f"(its 95 % interval, {best.delta_ci_low_pt:+.2f} to {best.delta_ci_high_pt:+.2f}"
    assert (reaches in said) == (best.delta_ci_low_pt <= -0.5)
    inside = close[close.delta_ci_low_pt > -0.5]
    if reaches in said and len(inside):  # and the cheapest whose whole interval lies within
        surest = inside.loc[inside.time_savings_pct.idxmax()]
        assert f"lies within half a point, `{surest.strategy}`" in said
    study = tmp_path / "study"
    study.mkdir()
    table.loc[table.delta_method == "baseline", "load_per_cpu"] = 2 * LOADED + 1
    table.to_csv(study / "summary.csv", index=False)
    assert f"({best.time_savings_pct:.0f} %, timed beside other work)" in docs.results.results_best(
        str(study)
    )
    # each strategy's finding says so too, its saving resting on the loaded baseline's time
    findings = docs.results.results_findings(str(study)).splitlines()
    assert "beside other work" not in findings[0]  # the baseline's own sentence: no saving
    assert all(
        "training time, timed beside other work, and scores" in f for f in _each_strategys(findings)
    )
    assert "beside other work" not in docs.results.results_findings(str(source.parent))
    # a baseline whose seeds' times lay far apart makes every saving uncertain
    table["load_per_cpu"] = 0.0
    table["train_time_spread"] = 1.0
    table.loc[table.delta_method == "baseline", "train_time_spread"] = 1.8
    table.to_csv(study / "summary.csv", index=False)
    findings = docs.results.results_findings(str(study)).splitlines()
    assert all(
        "(uncertain: the times behind it up to 1.8x apart)" in f for f in _each_strategys(findings)
    )
    assert "uncertain" not in findings[0]
    assert "uncertain" not in docs.results.results_findings(str(source.parent))
    table["speed_spread"] = float("inf")  # timed on CPUs of recorded and unrecorded speed
    table.to_csv(study / "summary.csv", index=False)
    findings = docs.results.results_findings(str(study)).splitlines()
    assert all(
        "(uncertain: it or the baseline timed on a CPU of unrecorded" in f
        for f in _each_strategys(findings)
    )
    table.loc[table.delta_method != "baseline", "delta_ci_low_pt"] = -0.4
    table.to_csv(study / "summary.csv", index=False)
    assert "interval" not in docs.results.results_best(str(study))
    table.loc[table.delta_method != "baseline", "delta_dev_pt"] = -0.6  # none within half a point
    table.to_csv(study / "summary.csv", index=False)
    assert docs.results.results_best(str(study)) == ""


# What a hostile run or archive holds as a strategy's name or its report command: each closes a
# naive `...` span (the second inside it) and injects a link and an image after it
EVIL = "`](http://evil)<img src=x onerror=alert(1)>`"
EVIL_INSIDE = "x` [click](http://evil) <img src=x onerror=alert(1)>"


def _markup(markdown: str) -> str:
    """What markdown reads as markup in ``markdown``: the text outside its code spans
    (CommonMark's: a run of backticks up to the next run of the same length, else the run is
    text), less the characters a backslash escapes."""
    out, i = [], 0
    while i < len(markdown):
        if markdown[i] == "\\":
            i += 2
        elif markdown[i] == "`":
            n = len(markdown[i:]) - len(markdown[i:].lstrip("`"))
            close = re.compile(rf"(?<!`)`{{{n}}}(?!`)").search(markdown, i + n)
            out.append("" if close else "`" * n)
            i = close.end() if close else i + n
        else:
            out.append(markdown[i])
            i += 1
    return "".join(out)


def _rendered(markdown: str) -> str | None:
    """``markdown`` as a CommonMark renderer (with tables) writes it in HTML, where one is
    installed (markdown-it-py, which rich brings)."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return None
    return MarkdownIt("commonmark").enable("table").render(markdown)


@pytest.mark.parametrize("value", [EVIL, EVIL_INSIDE, "none", "a``b", "`", " x ", "a|b\nc"])
def test_a_code_span_shows_its_value_as_written_and_nothing_else(value):
    from ablate.tables import code

    span = code(value)
    assert _markup(span) == ""  # all of it one code span: no markup outside
    assert code("lora_r8") == "`lora_r8`"  # a plain value: as the docs always wrote it
    if (html := _rendered(span)) is not None:
        shown = " ".join(value.splitlines())
        for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;")):
            shown = shown.replace(char, entity)
        assert html == f"<p><code>{shown}</code></p>\n"


def test_an_archives_values_are_never_live_markdown_in_the_generated_blocks(tmp_path):
    """A study whose archive names EVIL as its report command, and whose runs' ``freeze.name``
    (the report's strategy) and commit hold EVIL and EVIL_INSIDE: every block the docs generate
    from it shows them, and none of them is a link, an image or HTML."""
    import csv
    import json
    import shutil

    from ablate.archive import INDEX, MANIFEST, dumps
    from ablate.archive.export import write_manifest

    source = project_root() / "docs" / "results" / "naija"
    study = tmp_path / "naija"
    held = study / docs.studies.ARCHIVE  # a redo, complete: its archive, its published report
    shutil.copytree(source / docs.studies.ARCHIVE, held)
    hostile = {"none": EVIL}  # the baseline EVIL, every other strategy EVIL_INSIDE and its name
    index = json.loads((held / INDEX).read_text(encoding="utf-8"))
    index["report"].append(EVIL)
    (held / INDEX).write_text(dumps(index), encoding="utf-8")
    for params in held.glob("runs/*/params.json"):
        values = json.loads(params.read_text(encoding="utf-8"))
        if "freeze.name" in values:
            name = values["freeze.name"]
            values["freeze.name"] = hostile.get(name, f"{EVIL_INSIDE} {name}")
            params.write_text(dumps(values), encoding="utf-8")
    (held / MANIFEST).unlink()
    write_manifest(held)
    for name, column in (("summary.csv", "strategy"), ("runs.csv", "freeze")):
        with (source / name).open(encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
        for row in rows:
            row[column] = hostile.get(row[column], f"{EVIL_INSIDE} {row[column]}")
            if "git_commit" in row:
                row["git_commit"] = EVIL
        for folder in (study, study / docs.studies.PUBLISHED):
            folder.mkdir(exist_ok=True)
            with (folder / name).open("w", encoding="utf-8", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    blocks = {
        "source": docs.results.results_source(str(study)),
        "findings": docs.results.results_findings(str(study)),
        "best": docs.results.results_best(str(study)),
        "provenance": docs.results.results_provenance(str(study)),
        "table": docs.results.results_table(str(study), rerun=True),
    }
    for name, text in blocks.items():
        assert "evil" in text, name  # the hostile values are there, shown
        markup = _markup(text)
        assert "<" not in markup, (name, text)  # no HTML, no autolink
        assert not re.search(r"\]\s*\(\s*http", markup), (name, text)  # no link
        if (html := _rendered(text)) is not None:
            assert "<img" not in html and 'href="http://evil' not in html, (name, html)
    assert "Rerun from today's code: 15 of its 15 published runs" in blocks["source"]


def test_a_fair_page_lists_each_rerun_that_changed_its_scores():
    """The audit's two: Naija fair `features` seed 1 moved one test token, `loha` seed 1 moved on
    dev and test; every EWT fair rerun gave the same scores."""
    from ablate.docs import redo

    rows = [r for r in redo.rerun_changes("naija-fair").splitlines() if r.startswith("| `")]
    assert [r.split(" | ")[:2] for r in rows] == [["| `features`", "1"], ["| `loha`", "1"]]
    assert "| 97.7901 | 97.2195 |" in rows[1] and "| 97.7627 | 97.1638 |" in rows[1]
    assert rows[0].count("| 97.3784 |") == 2  # dev the same, test not
    assert "CPU not recorded" in rows[1] and "Intel(R) Xeon(R) Processor" in rows[1]
    assert redo.rerun_changes("ewt-fair").startswith("Every run")
