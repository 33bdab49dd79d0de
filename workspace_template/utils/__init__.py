"""Workspace utilities (protected, read-only): compile.sh / build.py build the kernels,
verification.py and profiling.py send the solution to the trusted GPU worker."""
