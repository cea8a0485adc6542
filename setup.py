"""Packages and the CPU kernels for setuptools; the project's metadata is in pyproject.toml.

The C++ kernels (kernels/cpu: one library per instruction set, and the quantized products; the
list is kernels/cpu/build_sources.py, which the run-time loader reads too) are compiled here with
torch's BuildExtension into langrt_kernels/cpu/prebuilt/, with a manifest naming the torch they
were built for. That needs torch importable while building, which pip's build isolation hides:

    pip install torch            # the torch langrt will run with (the CPU wheel where there is no GPU)
    pip install --no-build-isolation .

Without torch (plain `pip install .`, or LANGRT_BUILD_CPU_KERNELS=0) the package installs without
them and they are built on first use, as in a source checkout (`pip install -e .`).
LANGRT_BUILD_CPU_ISAS=avx2 (a comma list of avx512, avx2, scalar) builds only those layer
libraries: a package for one machine, in a third of the time.
"""

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent
PACKAGES = find_packages(include=["langrt", "langrt.*", "langrt_frontend", "langrt_frontend.*"]) + [
    "langrt_kernels",
    "langrt_kernels.cpu",
]


def _build_sources():
    """kernels/cpu/build_sources.py, loaded by its path: the package is not importable yet."""
    spec = importlib.util.spec_from_file_location(
        "_langrt_build_sources", ROOT / "kernels" / "cpu" / "build_sources.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


def _kernel_build():
    """(ext_modules, cmdclass) that compile the CPU kernels, or ([], {}) where they cannot be."""
    if os.environ.get("LANGRT_BUILD_CPU_KERNELS", "1") == "0":
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print(
            "langrt: torch is not importable in this build (pip's build isolation hides an installed one), so the "
            "CPU kernels are not prebuilt: they build on first use. To ship them built: install torch, then "
            "`pip install --no-build-isolation .`",
            file=sys.stderr,
        )
        return [], {}
    sources = _build_sources()
    only = tuple(isa for isa in os.environ.get("LANGRT_BUILD_CPU_ISAS", "").split(",") if isa)
    libraries = sources.shipped_libraries(only=only)
    extensions = [
        CppExtension(f"langrt_kernels.cpu.prebuilt.{library.name}", [str(path.relative_to(ROOT)) for path in library.sources], extra_compile_args=list(library.cflags))
        for library in libraries
    ]  # fmt: skip

    class BuildKernels(BuildExtension):
        """torch's builder, then the manifest the run-time loader checks a library against."""

        def build_extension(self, extension):
            # Each library its own object folder: the ISA builds compile the same .cpp files with other flags.
            shared_temp = self.build_temp
            self.build_temp = os.path.join(shared_temp, extension.name.rsplit(".", 1)[-1])
            try:
                super().build_extension(extension)
            finally:
                self.build_temp = shared_temp

        def run(self):
            super().run()
            import torch

            paths = [Path(self.get_ext_fullpath(extension.name)) for extension in extensions]
            entries = [
                sources.manifest_entry(library, path.name, torch.__version__, str(torch.version.git_version))
                for library, path in zip(libraries, paths)
            ]
            sources.write_manifest(paths[0].parent, entries)

    return extensions, {"build_ext": BuildKernels}


ext_modules, cmdclass = _kernel_build()
setup(packages=PACKAGES, ext_modules=ext_modules, cmdclass=cmdclass)
