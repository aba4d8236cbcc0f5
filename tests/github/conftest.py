"""The client tests' fixtures (a scripted GitHub on 127.0.0.1, a manual clock, an
installation client), shared by every module here."""

from tests.github.test_github import clock, inst, make_app, session, stub

__all__ = ["clock", "inst", "make_app", "session", "stub"]
