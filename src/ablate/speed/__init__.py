"""Speed: every feature that makes training or evaluation faster, each a plugin behind a switch.

``registry`` declares the switches (pure data, imported by the config schema); ``plugins`` holds
the plugins in the order they apply; ``plugin`` the interface. With every switch off, training is
the stock Hugging Face Trainer plus ``ablate.training``'s core behaviour.
"""
