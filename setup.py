# A shim for tools that look for a setup.py; `pip install .` and `pip install -e .` work
# with it as without it. All of geon's packaging metadata (name, version source,
# dependencies, extras, entry points, package data) is in pyproject.toml, where
# setuptools reads it. Keep this file free of metadata: tests/test_packaging.py checks
# that setup() gets no arguments.
from setuptools import setup

setup()
