"""The C parts of otel-train: the hook's write into the shared-memory ring
(otel_train/recording/_ring.c) and a GPU job's boundary stamp (_stamp.c). Optional: where
they do not build, recording/ring.py's Python writer writes the same slots and
recording/stamps.py takes the same stamps. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "otel_train.recording._ring",
            ["otel_train/recording/_ring.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
            optional=True,
        ),
        Extension(
            "otel_train.recording._stamp",
            ["otel_train/recording/_stamp.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
            optional=True,
        ),
    ]
)
