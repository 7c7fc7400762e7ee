"""Where the report is read besides its files: the notebook (run headless on the real tiny
grid), ``make notebook``, and the results page's blocks in the docs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pandas as pd
from helpers.data import ROOT
from helpers.grid import CHART_FILES, logged, mean

from ablate import report
from ablate.report.render import share


def test_notebook_runs_headless_on_the_same_module(report_grid, monkeypatch, tmp_path):
    from nbclient import NotebookClient

    path = ROOT / "notebooks" / "compare.ipynb"
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "commit it cleared"
    assert not any(re.search(r"\d\.\d", c.source) for c in code)  # no number typed in
    out = tmp_path / "nb-report"
    monkeypatch.setenv("ABLATE_REPORT_URI", report_grid.store)
    monkeypatch.setenv("ABLATE_REPORT_EXPERIMENT", "ablate")
    monkeypatch.setenv("ABLATE_REPORT_OUT", str(out))
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.executable)"))
    NotebookClient(
        nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(path.parent)}}
    ).execute()

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # the four charts, and the grid's POS panel's confusions
    assert sum("image/png" in o.get("data", {}) for o in outputs) == len(report.CHARTS) + 1
    assert all((out / name).stat().st_size > 0 for name in CHART_FILES)
    shown = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    for strategy, runs in logged(report_grid).items():
        dev = mean([100 * r.data.metrics["dev_accuracy"] for r in runs])
        assert f"| {strategy} | 5e-05 | {dev:.2f} ± " in shown
    assert "UD_Naija-Slice-first2-tiny-s1" in shown
    assert Path(outputs[-1].text.strip()) == Path(sys.executable)
    assert list(pd.read_csv(out / "summary.csv").strategy) == ["none", "all"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.csv", "summary.md", "runs.csv", "per_tag.csv", *CHART_FILES, "confusion.png"]
    )

    # Unset, the folder is one of its own, never `make report`'s reports/, and its text says so
    monkeypatch.delenv("ABLATE_REPORT_OUT")
    setup: dict = {}
    exec(code[0].source, setup)
    assert Path(setup["OUT"]) == report.default_out_dir() / "notebook"
    # its runs by default are `make report`'s: the latest sweep; the first cell says so
    assert (
        setup["SWEEP"] == "latest" and "as `make report` reports by default" in nb.cells[0].source
    )
    assert "`ABLATE_REPORT_OUT` (default: `reports/notebook/`)" in nb.cells[0].source


def test_make_notebook_allows_root_only_for_root():
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "notebook"], capture_output=True, text=True, check=True
    )
    (lab,) = [line for line in dry.stdout.splitlines() if "jupyter lab" in line]
    assert lab.split()[1:3] == ["lab", "notebooks/compare.ipynb"]
    assert ("--allow-root" in lab.split()) == (os.geteuid() == 0)


def test_the_results_pages_blocks_read_the_reports_files(report_cli):
    from ablate import docs
    from ablate.report.timing import SPREAD, savings_loaded, savings_spread

    summary = pd.read_csv(report_cli.out / "summary.csv").set_index("strategy")
    path = str(report_cli.out)
    table = docs.results.results_table(path, rerun=True).splitlines()
    (row,) = [line for line in table if line.startswith("| `all` |")]
    all_ = summary.loc["all"]
    assert f"| {all_.dev_mean_pct:.2f} ± {all_.dev_std_pct:.2f} |" in row
    first = str(all_.seeds).split(",")[0]  # its first seed, at its exact lr, without a study
    assert row.endswith(
        f"| 2 | `python -m ablate.train experiment=paper data=UD_Naija-Slice freeze=all "
        f"seed={first} trainer.lr={all_.lr} 'lr_study.freeze=[]' tracking.experiment=rerun` |"
    )
    findings = docs.results.results_findings(path)
    assert f"{summary.loc['none'].dev_mean_pct:.2f} ± " in findings
    # a saving timed beside other work (its own or the baseline's) says so, as the report marks it
    # and one whose seeds' times lie far apart calls itself uncertain
    loaded = savings_loaded(summary.reset_index()).set_axis(summary.index)["all"]
    spread = savings_spread(summary.reset_index()).set_axis(summary.index)["all"]
    uncertain = (
        f" (uncertain: the times behind it up to {spread:.1f}x apart)" if spread > SPREAD else ""
    )
    assert (
        f"- `all` trains {share(all_.param_savings_pct, 0)} % fewer parameters in "
        f"{share(abs(all_.time_savings_pct), 0)} % "
        f"{'less' if all_.time_savings_pct >= 0 else 'more'} training time"  # a loaded machine
        f"{', timed beside other work' if loaded else ''}{uncertain}, and scores "
        f"{all_.delta_dev_pt:+.2f} points of dev accuracy" in findings
    )
    commit = pd.read_csv(report_cli.out / "runs.csv").git_commit.iloc[0][:7]
    assert docs.results.results_provenance(path).startswith(
        "4 runs (all, none; seeds 1, 2), started "
    )
    assert f"from commit {commit};" in docs.results.results_provenance(path)
