"""What the test modules share: data slices, runs, the MLflow store, models, sweeps, charts and
the speed plugins' Trainer. Importable as ``helpers`` (pyproject's pytest ``pythonpath``); no test
module imports another."""
