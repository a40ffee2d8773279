"""The one part of the build that pyproject.toml cannot declare yet (setuptools calls its
``ext-modules`` table experimental): the local reaper's spawn into a cgroup.

Optional: where it cannot be built (no C compiler) the install goes on, and the reaper
forks from Python instead (see ``supervisor/backends/local/_cspawn.c``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "supervisor.backends.local._cspawn",
            sources=["supervisor/backends/local/_cspawn.c"],
            optional=True,
        )
    ]
)
