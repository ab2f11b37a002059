"""Bytecode-level graph capture: a symbolic interpreter of CPython 3.11/3.12 bytecode."""
