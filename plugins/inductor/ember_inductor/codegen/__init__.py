"""Code generation: C++ kernels (cpp.py) and the Python wrapper that calls them (wrapper.py)."""
