"""Counterpart ACP agents written on other people's code, run as subprocesses by interop tests."""
