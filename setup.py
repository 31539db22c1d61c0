"""Build hook for the optional C extension ``router.udp._splice``; everything else is in pyproject.toml.

The extension splices established QUIC flows' datagrams in C (``recvmmsg``/``sendmmsg``, Linux
only). It is optional: without a C compiler (or off Linux) the build goes on without it and the
router uses its pure-Python path, which behaves the same.
"""

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Build what can be built; a missing compiler or header costs only the fast path."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # no compiler at all: setuptools fails before building anything
            print(f"warning: the optional C extension was not built ({exc}); using the pure-Python path")

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(f"warning: {ext.name} was not built ({exc}); using the pure-Python path")


setup(
    ext_modules=[Extension("router.udp._splice", ["router/udp/_splice.c"], optional=True,
                           extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                               "-Wno-missing-field-initializers"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
