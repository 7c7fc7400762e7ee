"""Learning-rate studies on Optuna, driven by ablate: ``study`` runs one freeze option's study
(persistent, resumable, shared by several workers, pruned, widening its range); ``pruning`` is
the per-epoch hook a trial's training reports through. ``python -m ablate.lrstudy`` runs them;
``ablate.lrstudy.runs`` reads their trials back from MLflow."""

TRIAL_ENV = "ABLATE_LR_TRIAL"  # a trial's process: JSON of storage, study, trial_id, driver pid
TRIAL_TAG = "lr_trial"  # MLflow tag of a trial's run: "<optuna study>:<trial number>"
PRUNED_TAG = "ablate.pruned"  # "true" on a pruned trial's run (ended KILLED, not a candidate)
PRUNED_EPOCH_TAG = "ablate.pruned_epoch"  # the last epoch it trained
