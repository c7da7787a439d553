"""Builds the plugin library with the compiler setuptools uses for C extensions.

The library is an ordinary shared object exporting torch_fl_plugin_get_api;
it is built as an "extension" only because that is how setuptools compiles
and installs C code into a package. Python never imports it.

A vendor keeps a copy of torch_fl/plugin.h (and of the optional
torch_fl/plugin_helpers.h the example uses) in their own tree: a stable C ABI
header, like dlpack.h; `torchfl-abi header --include-dir include` writes
both. This example uses the repository's.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "torchfl_example_minimal._plugin",
            sources=["../c_plugin/minimal_plugin.c"],
            include_dirs=["../../crates/torchfl-ffi/include"],
            extra_compile_args=["-std=c99", "-O2"],
            libraries=["pthread"],
        )
    ]
)
