"""Speed: every feature that makes training or evaluation faster, each a plugin behind a switch.

An optional part of ablate, loaded as a built-in extension (``ablate.extensions``): importing the
package declares its switches (``switches``, pure data) and registers its plugins
(``plugins.BUILTIN``, imported when a run first asks). Without this folder and its keys in
``conf/``, training is the stock Hugging Face Trainer plus ``ablate.training``'s core behaviour.
"""

from ablate import plugins
from ablate.speed import switches  # noqa: F401  (declares the speed switches)

plugins.register("ablate.speed.plugins:BUILTIN")
