"""Packages for setuptools; the project's metadata is in pyproject.toml."""

from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["langrt", "langrt.*", "langrt_frontend", "langrt_frontend.*"])
    + ["langrt_kernels", "langrt_kernels.cpu"],
)
