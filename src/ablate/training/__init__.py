"""Training: everything loaded and checked before a run opens (``prepare``), then one run's
training and evaluation with the Hugging Face Trainer (``fit``), the core Trainer's own behaviour
(``trainer``), its arguments (``arguments``), per-epoch records (``callbacks``), checkpoints and
resume (``checkpoints``) and CPU threads (``resources``). It records through a ``Recorder``
(``recorder``), which ``ablate.tracking`` implements for MLflow."""

# Tag of a run stopped because its training diverged: "epoch N" (``callbacks.StopDiverged``); here,
# where an lr study's process reads it without loading the training stack.
DIVERGED_TAG = "ablate.diverged"
