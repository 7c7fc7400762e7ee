"""Keys a chosen option does not read (``ablate.pinned``), a data folder that is not there or a
treebank not named (``ablate.cli.check_composed``), and one naming of an override's value:
refused or settled before Hydra composes a job, through real Hydra composition and the real
CLI."""

from __future__ import annotations

import subprocess

import pytest
from helpers.data import DATA, write_treebank
from helpers.runs import compose_cfg, refused_before_loading, run_cli
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from ablate import overrides
from ablate.data.files import locate
from ablate.errors import AblateError


def refused(proc: subprocess.CompletedProcess) -> str:
    """The one error line of a command refused before Hydra (exit status 2, no traceback)."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    return line


def test_a_treebank_that_data_ewt_fixes_is_one_line_and_opens_nothing(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    line = refused(run_cli("data=ewt", "data.treebank=UD_English-GUM", f"tracking.uri={store}",
                           f"hydra.run.dir={tmp_path}/run"))  # fmt: skip
    assert line == (
        "ablate: error: data.treebank=UD_English-GUM: data.treebank is fixed by data=ewt "
        "(treebank: UD_English-EWT); to choose a treebank, use data=ud data.treebank=..."
    )
    assert list(tmp_path.iterdir()) == []  # no store, no job folder


@pytest.mark.parametrize(
    ("given", "found"),
    [
        (["data.treebank=UD_X"], "data.treebank is fixed by data=naija (treebank: UD_Naija-NSC)"),
        (["data=sst2", "data.treebank=UD_X"], "data.treebank is not read by data=sst2;"),
        (["data=ud,ewt", "data.treebank=UD_Naija-NSC"], "is fixed by data=ewt"),  # a sweep
        (["experiment=ner", "+data.treebank=UD_X"], "is not read by data=conll2003"),  # a preset
    ],
)
def test_a_key_the_chosen_option_does_not_read_names_the_option_that_does(given, found):
    with pytest.raises(AblateError) as err:
        overrides.check(given)
    assert found in str(err.value) and str(err.value).endswith("use data=ud data.treebank=...")


def test_which_options_read_a_key_is_read_from_their_files(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.yaml").write_text(
        "# Any treebank under <root>/mine/.\nname: mine-${.treebank}\ntask: pos\n"
        "dir: mine/${data.treebank}\n"
    )  # fmt: skip
    path = f"hydra.searchpath=[file://{tmp_path}]"
    overrides.check([path, "data=mine,ud", "data.treebank=UD_X", "data.max_train_sentences=3"])
    with pytest.raises(AblateError) as err:
        overrides.check([path, "data=ewt", "data.treebank=UD_X"])
    assert "use data=mine data.treebank=... or data=ud data.treebank=..." in str(err.value)


def test_a_missing_data_root_is_refused_before_hydra_and_heavy_imports(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    root = tmp_path / "nope"
    for given in (["--multirun", "data=ewt,naija"], ["data=ud", "data.treebank=UD_Naija-NSC"]):
        line = refused(
            run_cli(
                *given,
                f"data.root={root}",
                f"tracking.uri={store}",
                f"hydra.run.dir={tmp_path}/run",
                f"hydra.sweep.dir={tmp_path}/s",
            )
        )
        assert line.startswith(f"ablate: error: data.root={root} does not exist (data=")
    assert list(tmp_path.iterdir()) == []
    # an unpinned dataset's folder, too; answered before torch, mlflow or transformers load
    (tmp_path / "ud").mkdir()
    write_treebank(tmp_path / "ud" / "UD_Naija-Slice", "x", {"train": [], "dev": [], "test": []})
    proc = refused_before_loading(
        "data=ud", "data.treebank=UD_Naija-Slise", f"data.root={tmp_path}", f"tracking.uri={store}"
    )
    assert proc.stdout.splitlines() == ["2", "[]"], proc.stderr
    assert "did you mean data.treebank=UD_Naija-Slice?" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists()


def test_data_ud_without_a_treebank_names_the_key_an_example_and_where_they_are(tmp_path):
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    there = sorted(p.name for p in (DATA / "ud").iterdir() if p.is_dir())
    line = refused(run_cli("data=ud", f"tracking.uri={store}", f"hydra.run.dir={tmp_path}/run"))
    assert line == (
        "ablate: error: data.treebank is missing (this data option's folder is ud/${.treebank}): "
        f"name a folder of {DATA / 'ud'}, e.g. data.treebank=UD_Naija-NSC (there: "
        f"{', '.join(there)})"
    )
    assert list(tmp_path.iterdir()) == []  # no store, no job folder
    # a job's own check (a sweep over a data key leaves it to the job): a root without treebanks
    with pytest.raises(AblateError) as err:
        locate(compose_cfg("data=ud", f"data.root={tmp_path}").data)
    assert str(err.value) == (
        "data.treebank is missing (this data option's folder is ud/${.treebank}): name a folder "
        f"of {tmp_path / 'ud'}, e.g. data.treebank=UD_Naija-NSC (none there yet, or set data.root)"
    )


@pytest.mark.parametrize("given", ["trainer.lr=3e-3", "data.max_train_sentences=300", "seed=7"])
def test_a_run_names_a_value_as_a_multiruns_job_does(given):
    parsed = OverridesParser.create().parse_overrides([given])
    ((job,),) = BasicSweeper.split_arguments(parsed, None)[0]
    assert overrides.as_job_sees([given]) == [job]
    assert overrides.as_job_sees(["trainer.lr=3e-3"]) == ["trainer.lr=0.003"]
