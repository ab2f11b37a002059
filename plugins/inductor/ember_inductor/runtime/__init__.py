"""Ember inductor's runtime: the content-addressed on-disk cache, kernel building and loading.

Imports only the standard library, torch and ember, so a generated wrapper (and a precompiled
artifact) can use it without the compiler stages.
"""

from __future__ import annotations

from .cache import (BASE_FLAGS, FORMAT_VERSION, CompileError, cache_dir, clear, compile_cpp,
                    compile_cpp_many, cpp_key, get_text, info, load_cpp, put_text)

__all__ = ["BASE_FLAGS", "FORMAT_VERSION", "CompileError", "cache_dir", "clear", "compile_cpp",
           "compile_cpp_many", "cpp_key", "get_text", "info", "load_cpp", "put_text"]
