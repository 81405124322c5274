"""The one thing pyproject.toml cannot say: the optional compiled filter index.

``router/core/_filter_index.c`` is built when a C compiler and the Python headers are at
hand; without them the build goes on and the package runs on the pure-Python index
(``router.core.filter_index``), with the same answers, slower.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "router.core._filter_index",
            sources=["router/core/_filter_index.c"],
            extra_compile_args=["-std=c11", "-Wall", "-Wextra", "-Werror=implicit"],
            optional=True,
        )
    ]
)
