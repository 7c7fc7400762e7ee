"""``make contention`` (benchmarks/contention.py): a tiny run alone and beside a busy neighbour,
its table and its times, and what ``trainer.omp_wait_policy=auto`` saw beside the neighbour."""

from __future__ import annotations

import json
import tempfile

import contention
import psutil
import pytest
from mlflow.tracking import MlflowClient


def test_contention_times_each_variant_alone_and_beside_a_busy_job(
    tmp_path, store, monkeypatch, capsys
):
    temp = tmp_path / "tmp"  # its data slice and its jobs' files
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    out = tmp_path / "contention.json"
    argv = ["--model", "tiny", "--train-sentences", "16", "--variants", "auto,plain"]
    rc = contention.main([*argv, "--uri", store, "--out", str(out)])
    assert rc == 0
    assert [p.name for p in temp.iterdir() if not p.name.startswith("torchinductor")] == []
    neighbours = [p for p in psutil.Process().children(recursive=True)
                  if "torch.tanh(a @ a)" in " ".join(p.cmdline())]  # fmt: skip
    assert neighbours == []  # killed once its half ended
    saved = json.loads(out.read_text())
    times = saved["times"]
    assert list(times) == ["plain", "auto"]  # in the table's order, not the command line's
    assert all(len(t["alone"]) == len(t["beside"]) == 1 and min(t["alone"]) > 0
               for t in times.values())  # fmt: skip
    text = capsys.readouterr().out
    above, table = text.split("\n\n")[-2:]
    caption = above.splitlines()[-1]  # after a line per job
    assert caption.startswith("tiny, freeze=none, on naija (16 train sentences), 1 epoch(s)")
    assert caption.endswith(f"Command: `python benchmarks/contention.py {' '.join(argv)} "
                            f"--uri {store} --out {out}`")  # fmt: skip
    header, _, plain, auto = table.strip().splitlines()
    assert header == (
        "| recipe | alone, s/epoch | beside a busy job, s/epoch "
        "| slowdown beside it (2x = its share) | alone vs plain alone |"
    )
    for row, name in ((plain, "plain"), (auto, "auto")):
        alone, beside = times[name]["alone"][0], times[name]["beside"][0]
        ratio = times[name]["alone"][0] / times["plain"]["alone"][0]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells == [contention.VARIANTS[name][0], f"{alone:.2f}", f"{beside:.2f}",
                         f"{beside / alone:.2f}x", f"{ratio:.2f}x"]  # fmt: skip
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("ablate-contention")
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"])
    assert [r.data.tags["bench.recipe"] for r in runs] == ["plain", "ablate"] * 2
    assert runs[1].data.params["trainer.omp_wait_policy"] == "auto"
    # beside the neighbour, auto found the job's CPUs busy: its OpenMP threads then sleep
    assert runs[3].data.metrics["busy_cpus_at_start"] >= 0.5


def test_contention_refuses_the_plain_recipe_on_another_strategy(capsys):
    with pytest.raises(SystemExit):
        contention.main(["--freeze", "lora", "--variants", "plain,auto"])
    assert "the plain recipe trains freeze=none, not lora" in capsys.readouterr().err
