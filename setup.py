"""Build hook for the optional C extensions; everything else is in pyproject.toml.

``router.udp._splice`` splices established QUIC flows' datagrams in C (``recvmmsg``/``sendmmsg``,
and io_uring for a batch's sends to many pods where the kernel allows it; Linux only);
``router.tcp._relay`` pumps relayed TCP connections' bytes in C (epoll, splice, Linux only);
``quic._initial_protection`` derives a client Initial's keys and opens it over libcrypto
(OpenSSL 3 headers: ``libssl-dev``). All are optional: without a C compiler (or the headers, or
off Linux) the build goes on without them and the router uses its pure-Python paths, which
behave the same.
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


_WARNINGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]

setup(
    ext_modules=[
        Extension("router.udp._splice", ["router/udp/_splice.c"], depends=["router/udp/_send_ring.h"], optional=True,
                  extra_compile_args=_WARNINGS),
        Extension("router.tcp._relay", ["router/tcp/_relay.c"], optional=True, extra_compile_args=_WARNINGS),
        Extension("quic._initial_protection", ["quic/_initial_protection.c"], optional=True,
                  libraries=["crypto"], extra_compile_args=_WARNINGS),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
