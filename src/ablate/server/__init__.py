"""The team server and the UI: ``python -m ablate.server start|stop|member|password`` runs
MLflow's server with authentication on PostgreSQL (``control``, ``postgres``, ``service_user``,
``files``), its members (``members``, ``credentials``) and its app (``app``, the ``ablate-auth``
entry point); ``python -m ablate.server.ui`` is ``make ui``. It may import ``ablate.tracking``
(how a run reaches a server), never the reverse. Importing the package loads nothing heavy."""
