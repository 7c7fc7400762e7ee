"""Each peft option's own default lr (its file names the source), the command line's lr over it,
and the line a run of a peft method at an lr no study chose says: real Hydra composition."""

from __future__ import annotations

import re

import pytest
from omegaconf import open_dict

from ablate import config
from ablate.overrides import Repository
from ablate.strategies import peft_methods

OPTIONS = Repository.for_command_line([]).options("freeze")
RECIPE_LR = config.TrainerCore().lr  # full fine-tuning's


def strategy(option: str) -> str:
    return config.composed(f"freeze={option}").freeze.strategy


@pytest.mark.parametrize("option", OPTIONS)
def test_a_peft_option_trains_at_its_own_lr_and_names_where_it_comes_from(option):
    lr = config.composed(f"freeze={option}").trainer.lr
    text = Repository.for_command_line([]).text("freeze", option)
    if strategy(option) not in peft_methods.METHODS:
        assert lr == RECIPE_LR  # a run of every other option keeps its identity
        return
    found = peft_methods.LR_SOURCE.search(text)
    assert found and re.search(r"et al\. 20\d\d", found[1]), f"{option}: no source for its lr"
    assert 1e-4 <= lr <= 1e-2 and lr != RECIPE_LR


def test_the_command_line_and_a_preset_keep_their_lr():
    assert config.compose("freeze=lora", "trainer.lr=1e-4").trainer.lr == 1e-4
    assert config.compose("freeze=lora", "experiment=fair").trainer.lr == 5e-4


def test_a_peft_run_at_an_lr_no_study_chose_says_so_in_one_line():
    ia3 = peft_methods.untuned_lr(config.compose("freeze=ia3"), "ia3")
    assert ia3 == (
        "lr 0.003 is freeze=ia3's default (Liu et al. 2022 ((IA)^3, T-Few): 3e-3 for every "
        "task), not tuned: python -m ablate.lrstudy freeze=ia3 picks one"
    )
    given = peft_methods.untuned_lr(config.compose("freeze=lora", "trainer.lr=1e-4"), "lora")
    assert given == (
        "lr 0.0001 is this run's (freeze=lora's default: 0.0005), not tuned: "
        "python -m ablate.lrstudy freeze=lora picks one"
    )
    assert peft_methods.untuned_lr(config.compose("freeze=none"), "none") is None
    for tag in (config.TUNED_TAG, config.STUDY_TAG):  # its study's best, or a study's trial
        cfg = config.compose("freeze=lora")
        with open_dict(cfg):
            cfg.tracking.tags[tag] = "x"
        assert peft_methods.untuned_lr(cfg, "lora") is None
