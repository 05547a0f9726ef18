"""Test-only helpers shared by radix's test suites and benchmarks; never shipped.

Installed from ``testing/`` by nox, so that tests, benchmarks and the processes they spawn import
them by module name. Importing this package imports nothing else: the SGLang helpers must come
after ``sglang_cpu_shim.install()`` (the adapter's conftest does it first).
"""
