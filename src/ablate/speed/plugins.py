"""The built-in speed plugins, in the order their hooks run (``ablate.plugins``): numerics first
(they decide TrainingArguments), then what wraps the model (the prefix cache before the
embedding rows it excludes), batching, evaluation, dropout (it needs the Trainer's device), and
the captured step last (its Trainer mixin innermost: the attention kernels' context around it).
Training's meter wraps the collator after them all, outermost."""

from __future__ import annotations

from ablate.speed.cache_frozen import CacheFrozen
from ablate.speed.dropout import Dropout
from ablate.speed.embedding_rows import EmbeddingRows
from ablate.speed.evaluation import SortedEval
from ablate.speed.graphs import CudaGraph
from ablate.speed.grouping import LengthGrouping
from ablate.speed.precision import Precision

BUILTIN = [Precision, CacheFrozen, EmbeddingRows, LengthGrouping, SortedEval, Dropout, CudaGraph]
