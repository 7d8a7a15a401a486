"""The C part of otel-train: the hook's write into the shared-memory ring
(otel_train/recording/_ring.c). Optional: where it does not build, recording/ring.py's
Python writer writes the same slots. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "otel_train.recording._ring",
            ["otel_train/recording/_ring.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror=implicit-function-declaration"],
            optional=True,
        )
    ]
)
