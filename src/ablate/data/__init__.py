"""Data: locating and fetching the split files (``files``), reading them into ``Sentence`` items
(``sentences``, ``read``; the formats' readers live with their tasks), and turning sentences into
model inputs (``encode``, ``dataset``)."""
