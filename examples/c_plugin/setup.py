"""Builds the plugin library with the C compiler setuptools uses for extensions.

The library is an ordinary shared object exporting torch_fl_plugin_get_api;
it is built as an "extension" only because that is how setuptools compiles
and installs C code into a package (and tags the wheel for the platform).
Python never imports it.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "torchfl_minimal_c._plugin",
            sources=["csrc/minimal_c_plugin.c"],
            include_dirs=["include"],
            extra_compile_args=["-std=c99", "-O2"],
            libraries=["pthread"],
        )
    ]
)
