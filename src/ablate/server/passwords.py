"""The team server's password rules (``password_problem``): wherever a password is set, by the
admin's commands or through MLflow's user routes (``ablate.server.app``)."""

from __future__ import annotations

import re

MIN_PASSWORD = 12

# The most used passwords' words (as in the public top lists), without the digits and signs
# people append: no offline breach list ships with the project's libraries, so this short list
# and the patterns in ``password_problem`` stand in for one.
_WORDS = """password passwort passw0rd p@ssword p@ssw0rd qwerty qwertz azerty qwertyuiop asdfgh
    asdfghjkl zxcvbnm letmein welcome admin administrator root iloveyou monkey dragon football
    baseball soccer hockey sunshine princess trustno1 abc abcd abcdef abcdefg master login
    superman batman starwars whatever shadow secret changeme default mlflow ablate test tester
    testing guest user hello freedom flower summer winter spring autumn computer internet
    michael jennifer jordan charlie thomas daniel access mustang killer pokemon"""
_COMMON_WORDS = frozenset(_WORDS.split())
_TRAILING = re.compile(r"[\d\W_]+$")
_LEADING = re.compile(r"^[\d\W_]+")


def password_problem(password: str, username: str = "") -> str | None:
    """Why ``password`` may not be set (None: it may): too short, a common word with digits or
    signs around it, few distinct characters, a run of keys or digits, or the user's name (of
    3 characters or more)."""
    if len(password) < MIN_PASSWORD:
        return f"a password needs at least {MIN_PASSWORD} characters"
    low = password.lower()
    core = _LEADING.sub("", _TRAILING.sub("", low))
    sequences = ("0123456789", "1234567890", "abcdefghijklmnopqrstuvwxyz", "qwertyuiopasdfghjkl")
    if (
        core in _COMMON_WORDS
        or not core
        or len(set(low)) < 5
        or any(low in s * 2 for s in sequences)
        or (len(username) >= 3 and username.lower() in low)
    ):
        return "this password is too common or too easy to guess: choose another"
    return None
