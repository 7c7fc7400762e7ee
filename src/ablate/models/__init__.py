"""Models: where an encoder comes from (``source``), building it with its task head (``build``,
``heads``), and finding its parts in any architecture (``anatomy``)."""
