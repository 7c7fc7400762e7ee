"""``python -m ablate.server start|stop|member|password``: see ``ablate.server.control``."""

from ablate.server.control import main

main()
